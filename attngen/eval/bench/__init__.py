"""`attngen bench`: time generated kernels beside torch SDPA's backends, on the same inputs.

Method: CUDA events around every call, a warm-up first, the median of many calls; inputs rotate
over enough buffer sets that a call never finds its q, k, v in L2; a long GPU sleep is queued
before the timed calls so the host enqueues them all while the GPU waits, and launch overhead on
the host never shows as GPU time. Beside it, the eager time: the same calls back to back as a user
makes them (each allocating its output), host included, wall clock from the first call to the end
of the last, over the number of calls: what an eager model feels when the host is the bottleneck.
A kernel is timed on a shape only after its output on that shape's inputs passed the verifier's
error rule.

A room per call convention, each with its cases, check and timed call (forward.py with varlen.py,
decode.py, backward.py, forward_fp8.py), on what they share: timing.py (the method above),
shared.py (inputs, SDPA's callables, a Timing filled), report.py (cases, timings, the report and
its table), chart.py (--plot). eval.conventions gathers the rooms from core.calls.CALLS.
"""
from __future__ import annotations

# Re-exported: tests and the measurement scripts under docs/ import the shared pieces from
# attngen.eval.bench, as they did before bench became a package.
from .report import BenchReport, BenchRun, Case, CaseResult, Timing, format_bench, parse_shape
from .shared import (CAUSAL_CHOICES, CHECK_HEADS, DEFAULT_SHAPES, DTYPES, SDPA_BACKENDS, environment, input_sets,
                     sdpa_callable, time_timing)
from .timing import time_back_to_back, time_calls, time_eager

__all__ = ["BenchReport", "BenchRun", "CAUSAL_CHOICES", "CHECK_HEADS", "Case", "CaseResult", "DEFAULT_SHAPES",
           "DTYPES", "SDPA_BACKENDS", "Timing", "environment", "format_bench", "input_sets", "parse_shape",
           "sdpa_callable", "time_back_to_back", "time_calls", "time_eager", "time_timing"]
