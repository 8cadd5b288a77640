"""The search space of a sweep: the kind's own axes around a base spec (`default_space`), the
points (`Choice`) and the cases measured (`parse_cases`). Spaces and axes are defined in
attngen/core/search_space.py; each kind declares its axes (`Kind.space`)."""
from __future__ import annotations

from ...core.forward_space import (DEFAULT_BLOCK_M, DEFAULT_BLOCK_N, DEFAULT_COMPUTE_WARPS, DEFAULT_ROLE_PAIRS,
                                   DEFAULT_STAGES, WarpChoice, forward_space, swizzle_token, swizzle_value)
from ...core.search_space import Axis, Choice, SearchSpace
from ...errors import SpecError
from ...kinds import kind_of
from ...spec import Spec
from ..bench.report import Case, parse_shape
from ..bench.shared import CAUSAL_CHOICES
from ..conventions import EVALS

Shape = tuple[int, ...]                    # batch, heads, seqlen, head_dim (and V's head dim where it differs)

__all__ = ["Axis", "Choice", "DEFAULT_BLOCK_M", "DEFAULT_BLOCK_N", "DEFAULT_COMPUTE_WARPS", "DEFAULT_ROLE_PAIRS",
           "DEFAULT_STAGES", "SearchSpace", "Shape", "WarpChoice", "choice_of", "default_space", "forward_space",
           "parse_cases", "shape_of", "swizzle_token", "swizzle_value"]


def default_space(base: Spec) -> SearchSpace:
    """The space the base spec's kind sweeps around it (its own values always included)."""
    kind = kind_of(base)
    if kind.space is None:
        raise SpecError(f"kind {kind.name} declares no sweep space", key=kind.select_key)
    return kind.space(base)


def choice_of(spec: Spec, space: SearchSpace | None = None) -> Choice:
    """The point a spec sits at, in `space` (default: its kind's space around it)."""
    return (space or default_space(spec)).choice_of(spec)


def shape_of(case: Case) -> Shape:
    """(B, H, S, D), and V's head dim after them where it differs."""
    return (case.batch, case.heads, case.seqlen, case.head_dim) + ((case.head_dim_v,) if case.head_dim_v else ())


def parse_cases(shapes: str, base: Spec, causal: str) -> list[Case]:
    """--shapes and --causal as cases in the base's dtype; a shape must have the base's head_dim and
    the base must emit the mask variants asked for. The case class is the base's convention's (a
    backward spec's: BackwardCase, whose FLOPs are 2.5x the forward's)."""
    causals = CAUSAL_CHOICES[causal]
    for c in causals:
        mask = "causal" if c else "none"
        if mask not in base.masks:
            raise ValueError(f"the base spec {base.name} has no {mask!r} variant (masks {list(base.masks)}); "
                             f"choose --causal {'no' if c else 'yes'}")
    cases = []
    for text in shapes.split(","):
        shape = parse_shape(text.strip())
        if shape[3] != base.head_dim:
            raise ValueError(f"shape {text.strip()} has head_dim {shape[3]}, the base spec {base.name} "
                             f"{base.head_dim}")
        v_dim = shape[4] if len(shape) == 5 else base.v_dim     # a 4-number shape takes the base's V
        if v_dim != base.v_dim:
            raise ValueError(f"shape {text.strip()} has V head dim {v_dim}, the base spec {base.name} {base.v_dim}")
        v = (v_dim,) if v_dim != base.head_dim else ()
        make = EVALS[kind_of(base).calls].sweep.case
        cases += [make(*shape[:4], base.dtype, c, *v) for c in causals]
    return cases
