"""The search: compile and measure candidates through the record cache (`Sweep`), the grid and
evolve strategies, the progress counts and `run_sweep`, which runs a whole sweep."""
from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from ...errors import ToolError
from ...kinds import kind_of
from ...spec import Spec
from ..bench.report import Case
from .build import Candidate, CompileOutcome, compile_all
from .cache import RecordCache, make_record
from .measure import ERROR, FAILED_VERIFY, Measurer
from .prune import NOT_SAMPLED, Pruned, prune, sample
from .space import Choice, SearchSpace, shape_of

# Survivors the search never evaluated, and outcomes of those it compiled and measured.
NOT_REACHED = "not reached"        # evolve: survivors the evolution never got to
COMPILED = "compiled"             # compiled, not measured (--compile-only)
TIMED = "timed"                   # verified and timed on every case


@dataclass
class Progress:
    """Counts shown while a sweep runs; `on_change(progress, steps_done)` after every step."""

    pruned: int = 0
    compiled: int = 0
    failed: int = 0
    timed: int = 0
    cached: int = 0
    best: dict = field(default_factory=dict)      # case label -> (us, name)
    on_change: Callable[["Progress", int], None] | None = None

    def step(self, n: int = 1) -> None:
        if self.on_change:
            self.on_change(self, n)

    def best_text(self) -> str:
        if not self.best:
            return "-"
        label, (us, name) = next(iter(self.best.items()))
        return f"{name} {us:.1f} us ({label})"


@dataclass
class CandidateResult:
    candidate: Candidate
    compile: CompileOutcome | None = None        # None: every case came from the record cache
    records: dict[Case, dict] = field(default_factory=dict)

    @property
    def outcome(self) -> str:
        """compile failed | spills | compiled (not measured) | timed | failed-verify | error."""
        if self.compile is not None and self.compile.status != "ok":
            return self.compile.status
        if not self.records:
            return COMPILED
        statuses = {r["status"] for r in self.records.values()}
        return next((s for s in (ERROR, FAILED_VERIFY) if s in statuses), TIMED)

    def time(self, case: Case) -> float | None:
        r = self.records.get(case)
        return r["median_us"] if r and r["status"] == "ok" else None

    def fitness(self, cases: list[Case]) -> float:
        """Geometric mean of the times over every case; infinite unless every case passed."""
        times = [self.time(c) for c in cases]
        if not times or any(t is None for t in times):
            return math.inf
        return math.exp(sum(map(math.log, times)) / len(times))


@dataclass
class SweepOptions:
    cases: list[Case]
    search: str = "grid"             # grid | evolve
    budget: int | None = None        # at most this many candidates compiled
    seed: int = 0
    generations: int = 4
    top_k: int = 4
    jobs: int = 1


@dataclass
class SweepReport:
    base: Spec
    space: SearchSpace
    options: SweepOptions
    arch: str
    pruned: list[Pruned]
    results: list[CandidateResult]
    gpu: str | None = None
    torch_version: str | None = None
    flash: dict[Case, float | None] = field(default_factory=dict)
    unvisited: tuple[str, int] = (NOT_SAMPLED, 0)    # survivors left out, and why

    def counts(self) -> dict[str, int]:
        """Candidates per outcome: each prune reason, then compile and measurement outcomes."""
        c = Counter(p.reason for p in self.pruned)
        if self.unvisited[1]:
            c[self.unvisited[0]] = self.unvisited[1]
        c.update(r.outcome for r in self.results)
        return {"enumerated": self.space.size, **dict(sorted(c.items()))}

    def ranking(self, case: Case) -> list[CandidateResult]:
        """Candidates timed on `case`, fastest first (ties by name); failures are never ranked."""
        timed = [r for r in self.results if r.outcome == TIMED and r.time(case) is not None]
        return sorted(timed, key=lambda r: (r.time(case), r.candidate.name))


class Sweep:
    """Runs one sweep: compile and measure batches of candidates, through the record cache."""

    def __init__(self, report: SweepReport, measurer: Measurer | None, cache: RecordCache | None,
                 progress: Progress):
        self.report = report
        self.measurer = measurer
        self.cache = cache
        self.progress = progress
        self.done: dict[Choice, CandidateResult] = {}

    @property
    def cases(self) -> list[Case]:
        return self.report.options.cases

    def evaluate(self, batch: list[Candidate]) -> None:
        """Compile and measure `batch`; a candidate with every case in the record cache skips both."""
        results = [CandidateResult(c) for c in batch]
        to_compile = []
        for r in results:
            self.done[r.candidate.choice] = r
            self.report.results.append(r)
            if self.measurer is not None:
                for case in self.cases:
                    rec = self.cache.get(r.candidate, self.measurer.gpu, case) if self.cache else None
                    if rec is not None:
                        r.records[case] = rec
            unfinished = len(r.records) < len(self.cases) and r.outcome in (COMPILED, TIMED)
            if self.measurer is None or unfinished:
                to_compile.append(r)
            else:
                self._count_cached(r)
        by_name = {r.candidate.name: r for r in to_compile}

        def compiled(cand, outcome):
            by_name[cand.name].compile = outcome
            if outcome.status == "ok":
                self.progress.compiled += 1
            else:
                self.progress.failed += 1
            self.progress.step()

        if to_compile:
            compile_all([r.candidate for r in to_compile], self.report.arch, self.report.options.jobs, compiled)
        if self.measurer is None:
            return
        for r in to_compile:
            if r.compile.status == "ok":
                self._measure(r)
            else:
                self.progress.step(len(self.cases))

    def _count_cached(self, r: CandidateResult) -> None:
        self.progress.cached += len(r.records)
        for case, rec in r.records.items():
            self._note_time(r, case, rec)
        self._count_failed(r)
        self.progress.step(1 + len(self.cases))

    def _measure(self, r: CandidateResult) -> None:
        """Measure the cases not in the cache; after a failure the rest are skipped (never ranked)."""
        for case in self.cases:
            if case in r.records:
                self.progress.cached += 1
                self._note_time(r, case, r.records[case])
            elif r.outcome in (COMPILED, TIMED):
                self._measure_case(r, case)
            self.progress.step()
        self._count_failed(r)

    def _measure_case(self, r: CandidateResult, case: Case) -> None:
        cand = r.candidate
        m = self.measurer.measure(cand.plan, cand.sources, shape_of(case), case.causal)
        rec = make_record(cand, self.measurer, case, m)
        r.records[case] = rec
        if m.status != ERROR or m.fatal:
            self.cache.put(rec)                  # other errors may be passing: the next run retries them
        if m.fatal:
            raise ToolError(f"the CUDA context was lost while measuring {cand.name} ({m.note}); its result is "
                            "cached: run the same command again to resume")
        self._note_time(r, case, rec)

    def _note_time(self, r: CandidateResult, case: Case, rec: dict) -> None:
        if rec["status"] != "ok":
            return
        self.progress.timed += 1
        best = self.progress.best.get(case.label)
        if best is None or rec["median_us"] < best[0]:
            self.progress.best[case.label] = (rec["median_us"], r.candidate.name)

    def _count_failed(self, r: CandidateResult) -> None:
        if r.outcome in (FAILED_VERIFY, ERROR):
            self.progress.failed += 1

    # -- searches ------------------------------------------------------------------------------
    def grid(self, candidates: list[Candidate]) -> None:
        self.evaluate(candidates)

    def evolve(self, candidates: list[Candidate]) -> None:
        """Seeded random population of 2 x top-k; then per generation keep the top-k by time and
        give each one child that differs in one field by one step. A candidate is never
        evaluated twice; the budget caps how many are evaluated in all."""
        opts = self.report.options
        rng = random.Random(opts.seed)
        valid = {c.choice: c for c in candidates}
        limit = len(candidates) if opts.budget is None else min(opts.budget, len(candidates))
        self.evaluate(rng.sample(candidates, min(2 * opts.top_k, limit)))
        for _ in range(opts.generations):
            ranked = sorted((r for r in self.done.values() if r.fitness(self.cases) < math.inf),
                            key=lambda r: (r.fitness(self.cases), r.candidate.name))
            children: dict[Choice, Candidate] = {}
            for parent in ranked[:opts.top_k]:
                options = self.report.space.neighbours(parent.candidate.choice)
                rng.shuffle(options)
                child = next((c for c in options if c in valid and c not in self.done and c not in children), None)
                if child is not None:
                    children[child] = valid[child]
            batch = list(children.values())[:limit - len(self.done)]
            if not batch:
                break
            self.evaluate(batch)


def planned_steps(n_candidates: int, options: SweepOptions, measuring: bool) -> int:
    """Progress steps: one per compile and one per measured case of each candidate."""
    if options.search == "evolve":
        n = 2 * options.top_k + options.generations * options.top_k
        n = min(n, n_candidates if options.budget is None else min(options.budget, n_candidates))
    else:
        n = n_candidates if options.budget is None else min(options.budget, n_candidates)
    return n * (1 + (len(options.cases) if measuring else 0))


def prune_options(options: SweepOptions) -> dict:
    """prune's budget and seed for a sweep: a grid sweep renders only its sample; an evolving one
    needs every valid point (its children are any point's neighbours)."""
    return {"budget": None if options.search == "evolve" else options.budget, "seed": options.seed}


def run_sweep(base: Spec, space: SearchSpace, options: SweepOptions, *, arch: str,
              measurer: Measurer | None = None, cache: RecordCache | None = None,
              progress: Progress | None = None, survivors: tuple[list[Candidate], list[Pruned]] | None = None
              ) -> SweepReport:
    """The whole sweep. Without a measurer only compiles (what a grid sweep would measure).

    `survivors`: the result of prune(base, space, **prune_options(options)) when the caller has it.
    """
    progress = progress or Progress()
    candidates, pruned = survivors or prune(base, space, **prune_options(options))
    progress.pruned = len(pruned)
    report = SweepReport(base, space, options, arch, pruned, [],
                         gpu=getattr(measurer, "gpu", None), torch_version=getattr(measurer, "torch_version", None))
    if measurer is not None and cache is None:
        cache = RecordCache()
    sweep = Sweep(report, measurer, cache, progress)
    if measurer is not None:
        call = kind_of(base).calls
        for case in options.cases:
            report.flash[case] = measurer.flash_time(shape_of(case), case.dtype, case.causal, call)
    if options.search == "evolve" and measurer is not None:
        sweep.evolve(candidates)
        report.unvisited = (NOT_REACHED, len(candidates) - len(report.results))
    else:
        chosen = sample(candidates, options.budget, options.seed)
        progress.pruned += len(candidates) - len(chosen)
        sweep.grid(chosen)
        report.unvisited = (NOT_SAMPLED, len(candidates) - len(chosen))
    return report
