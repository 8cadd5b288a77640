"""The planner: every number a kernel needs, derived from a spec by its kind.

Templates read only a Plan. If a template would need arithmetic on spec fields, the result belongs
in the kind's plan (or the shared layer it builds on), under a name `attngen explain` prints.
"""
from __future__ import annotations

from .core.forward_plan import ForwardPlan
from .kinds import kind_of

# A plan of any kind; forward kinds share ForwardPlan.
Plan = ForwardPlan


def make_plan(spec, file: str | None = None) -> Plan:
    return kind_of(spec).plan(spec, file)
