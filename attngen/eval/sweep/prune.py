"""Static pruning: which points of a space become candidates before anything is compiled, and the
seeded sample `--budget` keeps."""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterable

from ...errors import BudgetError, SpecError
from ...spec import Spec
from .build import Candidate, check_candidate, render_candidate
from .space import Choice, SearchSpace

# Reasons a candidate leaves the sweep before compiling (besides "spec rule: <key>" for each rule).
BUDGET = "smem budget"
DUPLICATE = "duplicate"
NOT_SAMPLED = "over --budget"      # grid: valid points left out of the seeded sample


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


def prune(base: Spec, space: SearchSpace, choices: Iterable[Choice] | None = None, *,
          budget: int | None = None, seed: int = 0) -> tuple[list[Candidate], list[Pruned]]:
    """Check every choice (default: every point of the space) against the spec rules and the budget;
    render the valid ones and keep those whose code no earlier candidate already has, in space order.

    With a `budget` below the number of valid points, only a seeded sample is rendered (rendering is
    most of a candidate's cost: a wgmma space of thousands of points took minutes): the valid points
    in a seeded order until `budget` have code of their own; the rest are pruned as NOT_SAMPLED."""
    checked, pruned = [], []
    for choice in space.choices() if choices is None else choices:
        try:
            checked.append(check_candidate(base, space, choice))
        except SpecError as exc:
            pruned.append(Pruned(choice, prune_reason(exc), exc.message))
    order = list(range(len(checked)))
    if budget is not None and len(checked) > budget:
        random.Random(seed).shuffle(order)
    kept, first = {}, {}   # index -> candidate; code hash -> the lowest index rendered with that code
    duplicates = []
    for n, i in enumerate(order):
        if budget is not None and len(kept) >= budget:
            pruned += [Pruned(checked[j].choice, NOT_SAMPLED, f"left out of the seeded sample of {budget}")
                       for j in order[n:]]
            break
        cand = render_candidate(checked[i])
        j = first.get(cand.code_hash)
        if j is not None and j < i:      # the point earlier in space order keeps the code, as without a budget
            duplicates.append(cand)
            continue
        if j is not None:
            duplicates.append(kept.pop(j))
        first[cand.code_hash] = i
        kept[i] = cand
    by_code = {c.code_hash: c.name for c in kept.values()}
    pruned += [Pruned(d.choice, DUPLICATE, f"same code as {by_code[d.code_hash]}") for d in duplicates]
    return [kept[i] for i in sorted(kept)], pruned


def sample(candidates: list[Candidate], budget: int | None, seed: int) -> list[Candidate]:
    """At most `budget` candidates: all when they fit, else a seeded sample kept in space order."""
    if budget is None or len(candidates) <= budget:
        return list(candidates)
    keep = sorted(random.Random(seed).sample(range(len(candidates)), budget))
    return [candidates[i] for i in keep]
