"""The planner: every number a kernel needs, derived from a spec by its kind.

Templates read only a Plan. If a template would need arithmetic on spec fields, the result belongs
in the kind's plan (or the shared layer it builds on), under a name `attngen explain` prints.
"""
from __future__ import annotations

from .core.abi import PARAMS_MAX
from .core.expression_variant import PARAM_PREFIX
from .core.forward_plan import ForwardPlan
from .errors import SpecError
from .kinds import kind_of

# A plan of any kind; forward kinds share ForwardPlan.
Plan = ForwardPlan


def make_plan(spec, file: str | None = None) -> Plan:
    plan = kind_of(spec).plan(spec, file)
    check_params_size(plan, file)
    return plan


def check_params_size(plan, file: str | None) -> None:
    """A kernel's parameters are at most PARAMS_MAX bytes; a larger Params renders and compiles but
    can never launch, so it is refused with the spec rather than at the first call. Only a variant's
    params grow it."""
    size = plan.abi.size
    if size <= PARAMS_MAX:
        return
    variant = getattr(plan.spec, "variant", None)
    params = variant.params if variant is not None else {}
    fields = {f.name for f in plan.abi.fields}
    base = plan.abi.without(tuple(PARAM_PREFIX + n for n in params if PARAM_PREFIX + n in fields)).size
    raise SpecError(f"the kernel's Params take {size} B, over CUDA's {PARAMS_MAX} B of kernel parameters, so it could "
                    f"never launch; {len(params)} params take {size - base} B of them",
                    file=file, key="variant.params" if params else None,
                    hint=f"pass fewer params (at most {PARAMS_MAX - base} B of them), or a tensor (float[heads]) "
                         f"in place of many scalars")
