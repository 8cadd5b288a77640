"""Static pruning: which points of a space become candidates before anything is compiled, and the
seeded sample `--budget` keeps."""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterable

from ...errors import BudgetError, SpecError
from ...spec import Spec
from .build import Candidate, build_candidate
from .space import Choice, SearchSpace

# Reasons a candidate leaves the sweep before compiling (besides "spec rule: <key>" for each rule).
BUDGET = "smem budget"
DUPLICATE = "duplicate"


@dataclass(frozen=True)
class Pruned:
    choice: Choice
    reason: str
    message: str


def prune_reason(exc: SpecError) -> str:
    """The count a refused candidate goes to: the budget, or the spec rule by its key."""
    if isinstance(exc, BudgetError):
        return BUDGET
    return f"spec rule: {exc.key or 'other'}"


def prune(base: Spec, space: SearchSpace,
          choices: Iterable[Choice] | None = None) -> tuple[list[Candidate], list[Pruned]]:
    """Build every choice (default: every point of the space); keep the valid ones whose code no
    earlier candidate already has."""
    survivors, pruned, seen = [], [], {}
    for choice in space.choices() if choices is None else choices:
        try:
            cand = build_candidate(base, space, choice)
        except SpecError as exc:
            pruned.append(Pruned(choice, prune_reason(exc), exc.message))
            continue
        if cand.code_hash in seen:
            pruned.append(Pruned(choice, DUPLICATE, f"same code as {seen[cand.code_hash]}"))
            continue
        seen[cand.code_hash] = cand.name
        survivors.append(cand)
    return survivors, pruned


def sample(candidates: list[Candidate], budget: int | None, seed: int) -> list[Candidate]:
    """At most `budget` candidates: all when they fit, else a seeded sample kept in space order."""
    if budget is None or len(candidates) <= budget:
        return list(candidates)
    keep = sorted(random.Random(seed).sample(range(len(candidates)), budget))
    return [candidates[i] for i in keep]
