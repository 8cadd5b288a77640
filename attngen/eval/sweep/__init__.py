"""`attngen sweep`: search the neighbourhood of a base spec for the fastest correct kernel per shape.

Which tiles, warps, stages, swizzle, register split or schedule win depends on head dim, sequence
length, causality and the GPU, so the sweep measures instead of guessing. One module per step:

1. space      `default_space(base)`: the axes the base's kind sweeps and their values (a
              `SearchSpace`, attngen/core/search_space.py; each kind declares its own), and the cases
              measured (`parse_cases`);
2. prune      `prune(base, space)`: check every candidate spec through the YAML loader's own
              validation, drop those that break a spec rule or exceed the shared-memory budget,
              render the rest (with a --budget, only a seeded sample of them) and drop those with
              the same code as an earlier one, counting each reason;
3. build      `build_candidate` (one candidate) and `compile_all(...)`: nvcc, many at once;
              spills and compile errors are dropped;
4. measure    a `Measurer` (`GpuMeasurer` on a GPU, a stub in tests): verify, then time beside
              torch's flash backend, as `attngen bench` does;
5. cache      `RecordCache`: one JSON record per (spec hash, GPU, shape, dtype, causal), so an
              interrupted sweep resumes without measuring anything twice;
6. search     `grid` measures every survivor (up to the budget); `evolve` keeps the top-k and
              mutates one axis at a time, reproducibly for a seed; `run_sweep` runs it all;
7. report     `format_report`, `report_dict` (JSON) and `write_best` (winning specs as YAML).

This package re-exports the public names of those modules.
"""
from .build import (COMPILE_FAILED, NAME_MAX, SPILLS, Candidate, CompileOutcome, build_candidate, candidate_name,
                    code_hash, compile_all, compile_candidate, spec_hash)
from .cache import RecordCache, make_record
from .measure import DEFAULT_REPS, ERROR, FAILED_VERIFY, GpuMeasurer, Measurement, Measurer
from .prune import BUDGET, DUPLICATE, Pruned, prune, prune_reason, sample
from .report import best_spec_text, format_report, report_dict, winners, write_best
from .search import (COMPILED, NOT_REACHED, NOT_SAMPLED, TIMED, CandidateResult, Progress, Sweep, SweepOptions,
                     SweepReport, planned_steps, prune_options, run_sweep)
from .space import (DEFAULT_BLOCK_M, DEFAULT_BLOCK_N, DEFAULT_COMPUTE_WARPS, DEFAULT_ROLE_PAIRS, DEFAULT_STAGES,
                    Axis, Choice, SearchSpace, Shape, WarpChoice, choice_of, default_space, forward_space, parse_cases,
                    shape_of, swizzle_token, swizzle_value)

__all__ = [
    # space
    "DEFAULT_BLOCK_M", "DEFAULT_BLOCK_N", "DEFAULT_COMPUTE_WARPS", "DEFAULT_ROLE_PAIRS", "DEFAULT_STAGES",
    "Axis", "Choice", "SearchSpace", "Shape", "WarpChoice", "choice_of", "default_space", "forward_space",
    "parse_cases", "shape_of", "swizzle_token", "swizzle_value",
    # prune
    "BUDGET", "DUPLICATE", "Pruned", "prune", "prune_reason", "sample",
    # build
    "COMPILE_FAILED", "NAME_MAX", "SPILLS", "Candidate", "CompileOutcome", "build_candidate", "candidate_name",
    "code_hash", "compile_all", "compile_candidate", "spec_hash",
    # measure
    "DEFAULT_REPS", "ERROR", "FAILED_VERIFY", "GpuMeasurer", "Measurement", "Measurer",
    # cache
    "RecordCache", "make_record",
    # search
    "COMPILED", "NOT_REACHED", "NOT_SAMPLED", "TIMED", "CandidateResult", "Progress", "Sweep", "SweepOptions",
    "SweepReport", "planned_steps", "prune_options", "run_sweep",
    # report
    "best_spec_text", "format_report", "report_dict", "winners", "write_best",
]
