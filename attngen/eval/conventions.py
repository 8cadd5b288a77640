"""What eval does for each call convention of core.calls.CALLS, from its rooms (the modules the list
names): the verify cases its kernels bring (eval/verify/<call>.py), the bench `attngen bench` runs on
its specs (eval/bench/<call>.py), and what `attngen sweep` measures of it. The CLI and the sweep
look a convention up here by the name its kind declares (plan.kind.calls) and name none."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from ..core.calls import BACKWARD, CALLS, FORWARD, FORWARD_FP8

from . import verify
from .bench import backward as backward_bench, decode as decode_bench, forward as forward_bench
from .bench import forward_fp8 as forward_fp8_bench, merge as merge_bench


@dataclass(frozen=True)
class BenchOptions:
    """Every option of `attngen bench`; each convention's bench reads the ones it knows."""

    shapes: tuple = ()
    dtypes: tuple = ("fp16", "bf16")
    causals: tuple = (False, True)
    backends: tuple = ()
    reps: int = 30
    cells: tuple | None = None          # decode cells
    paged: bool = False                 # decode through a page table
    varlen: bool = False                # forward specs: the varlen call instead of padded shapes
    lengths: tuple | None = None        # --varlen batch
    heads: tuple = (16, 16)             # --varlen heads
    plot_file: str | None = None        # forward, backward: TFLOP/s chart


@dataclass(frozen=True)
class SweepEval:
    """What `attngen sweep` measures of a convention's specs, beside torch's flash backend on the
    same inputs: the cases it builds from --shapes, a case's input sets, the check of a candidate on
    them, its timed call, and flash's."""

    case: type                          # Case, or a subclass that counts the call's FLOPs
    inputs: Callable                    # (torch, case, device, generator) -> input sets; LookupError when none can be made
    check: Callable                     # (torch, kernel, *inputs[0], causal) -> (ok, note)
    call: Callable                      # (torch, kernel, sets, causal) -> fn(*set) to time
    flash: Callable                     # (torch, sets, causal) -> (fn, the sets it takes)
    causal_inputs: bool = False         # a case's inputs depend on its mask (so are made per mask)


@dataclass(frozen=True)
class ConventionEval:
    what: str                           # its specs, for messages ("decode specs (decode: split_kv)")
    bench: Callable                     # (paths, plans, BenchOptions, progress, on_compile) -> BenchRun | None
    check: Callable                     # (paths, plans, BenchOptions) -> problems with the options, before any GPU work
    cases: Callable                     # (kernel, shapes, masks) -> its verify cases
    options: tuple[str, ...] = ()       # the BenchOptions only this convention's bench reads
    sweep: Optional[SweepEval] = None   # what `attngen sweep` measures; None: its specs are not swept


def _flash_forward(torch, sets, causal):
    return forward_bench.sdpa_callable(torch, "flash", causal), sets


def _flash_backward(torch, sets, causal):
    return (lambda *g: backward_bench.sdpa_backward(torch, *g)), backward_bench.sdpa_sets(torch, "flash", sets, causal)


def _gradient_inputs(torch, case, device, generator):
    sets, problem = backward_bench.gradient_inputs(torch, case, device, generator)
    if problem:
        raise LookupError(problem)
    return sets


# What `attngen sweep` measures, per convention that has it (the others' specs are not swept).
SWEEPS = {FORWARD.name: SweepEval(forward_bench.Case, forward_bench.input_sets, forward_bench.check_output,
                                    forward_bench.kernel_call, _flash_forward),
          BACKWARD.name: SweepEval(backward_bench.BackwardCase, _gradient_inputs, backward_bench.check_gradients,
                                   backward_bench.backward_call, _flash_backward, causal_inputs=True),
          FORWARD_FP8.name: SweepEval(forward_fp8_bench.Fp8Case, forward_fp8_bench.sweep_inputs,
                                      forward_fp8_bench.sweep_check, forward_fp8_bench.sweep_call,
                                      forward_fp8_bench.sweep_flash)}
# The bench rooms core.calls.CALLS names, by module name.
BENCHES = {m.__name__: m for m in (forward_bench, decode_bench, backward_bench, forward_fp8_bench, merge_bench)}


def convention_eval(call) -> ConventionEval:
    """What eval does for one convention of core.calls.CALLS, from the rooms it names."""
    runner = BENCHES[call.bench]
    return ConventionEval(call.what, runner.bench_specs, runner.check_options, verify.CASES[call.name],
                          call.bench_options, SWEEPS.get(call.name))


EVALS = {call.name: convention_eval(call) for call in CALLS}


def option_problems(groups: dict, opts: BenchOptions, given: set) -> list[str]:
    """What is wrong with the `given` options (BenchOptions field names the user set) for these
    groups of specs ({convention: (paths, plans)}): an option no given spec takes, then each
    convention's own checks. Needs no GPU."""
    problems = []
    for name in sorted(given):
        owners = [c for c, e in EVALS.items() if name in e.options]
        if owners and not any(c in groups for c in owners):
            problems.append(f"--{name.replace('_file', '').replace('_', '-')} applies to "
                            f"{' and '.join(EVALS[c].what for c in owners)}; none of the given specs is one")
    for convention, (paths, plans) in groups.items():
        problems += EVALS[convention].check(paths, plans, opts)
    return problems


def convention_of(plan) -> str:
    return plan.kind.calls


def by_convention(paths, plans) -> dict[str, tuple[list, list]]:
    """{convention: (paths, plans)} in registry order, conventions without specs left out."""
    groups = {name: ([], []) for name in EVALS}
    for path, plan in zip(paths, plans):
        group = groups[convention_of(plan)]
        group[0].append(path)
        group[1].append(plan)
    return {name: group for name, group in groups.items() if group[0]}


__all__ = ["BenchOptions", "ConventionEval", "EVALS", "SweepEval", "by_convention", "convention_of",
           "option_problems"]
