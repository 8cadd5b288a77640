"""Measuring candidates on a GPU: the `Measurer` protocol the search talks to (a stub in tests) and
`GpuMeasurer`, which verifies a candidate before timing it beside torch's flash backend. What a
candidate's call convention measures (its inputs, check, timed call and flash's) comes from the
registry (eval/conventions.py SweepEval): the forward call, or a backward spec's backward call
beside flash's backward."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ...plan import Plan
from ..bench.timing import time_calls
from ..conventions import EVALS
from ..verify import context_usable, suite, verify_kernel
from .space import Shape

DEFAULT_REPS = 30

# Measurement outcomes that keep a candidate out of the ranking.
FAILED_VERIFY = "failed-verify"
ERROR = "error"


@dataclass(frozen=True)
class Measurement:
    status: str                      # ok | failed-verify | error
    median_us: float | None = None
    note: str = ""
    fatal: bool = False              # the CUDA context is unusable: nothing more can run in this process


class Measurer(Protocol):
    """Runs candidates on one GPU. `measure` verifies before timing; a candidate that fails is
    reported as failed-verify and never timed."""

    gpu: str                         # device name, part of every cache key
    arch: str                        # what candidates are compiled for
    torch_version: str

    def measure(self, plan: Plan, sources: tuple[str, ...], shape: Shape, causal: bool) -> Measurement: ...

    def flash_time(self, shape: Shape, dtype: str, causal: bool, call: str) -> float | None: ...


class GpuMeasurer:
    """The real Measurer: attngen's runtime, verifier and bench timing on the current GPU.

    Per candidate: the verifier's quick suite on every mask variant (once), then the bench's
    output check on the sweep shape's inputs (a backward spec: its gradients'), then the median of
    `reps` timed calls. Inputs are made once per shape and dtype (and call) and shared by every
    candidate and by torch's flash backend.
    """

    def __init__(self, *, reps: int = DEFAULT_REPS, seed: int = 0):
        from ...runtime import device_arch, gpu_modules
        torch = gpu_modules()[0]
        self.torch = torch
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.gpu = torch.cuda.get_device_name(self.device)
        self.arch = device_arch(torch)
        self.torch_version = torch.__version__
        self.reps = reps
        self.seed = seed
        self._inputs: dict[tuple, list] = {}
        self._verified: dict[tuple[str, ...], tuple[bool, str]] = {}
        self._kernel = (None, None)              # (sources, Kernel): the candidate being measured

    def _sets(self, shape: Shape, dtype: str, call: str, causal: bool):
        """The input sets of a case of convention `call` (its SweepEval's), made once per shape and
        dtype (and mask, where the inputs depend on it)."""
        sweep = EVALS[call].sweep
        key = (shape, dtype, call, causal if sweep.causal_inputs else None)
        if key not in self._inputs:
            gen = self.torch.Generator(device=self.device)
            gen.manual_seed(self.seed)
            case = sweep.case(*shape[:4], dtype, causal, *shape[4:])
            self._inputs[key] = sweep.inputs(self.torch, case, self.device, gen)
        return self._inputs[key]

    def _load(self, plan: Plan, sources: tuple[str, ...]):
        from ...runtime import kernel_class
        if self._kernel[0] != sources:
            self._kernel = (None, None)
            kernel = kernel_class(plan).from_sources(plan, sources, label=plan.spec.name, on_compile=lambda arch: None)
            self._kernel = (sources, kernel)
        return self._kernel[1]

    def _verify(self, kernel) -> tuple[bool, str]:
        """The quick verification suite on every mask variant, once per candidate's sources."""
        if kernel.sources not in self._verified:
            kernel.synchronize = True            # a fault is reported with the case that caused it
            try:
                results = verify_kernel(kernel, suite(quick=True), seed=self.seed, spec_label=kernel.name)
            finally:
                kernel.synchronize = False
            bad = [r for r in results if not r.passed]
            note = f"{bad[0].variant} {bad[0].shape.label}: {'; '.join(bad[0].problems)}" if bad else ""
            self._verified[kernel.sources] = (not bad, note)
        return self._verified[kernel.sources]

    def _usable(self) -> bool:
        return context_usable(self.device)

    def measure(self, plan: Plan, sources: tuple[str, ...], shape: Shape, causal: bool) -> Measurement:
        try:
            kernel = self._load(plan, sources)
            sweep = EVALS[plan.kind.calls].sweep
            ok, note = self._verify(kernel)
            if ok:
                sets = self._sets(shape, plan.spec.dtype, plan.kind.calls, causal)
                ok, note = sweep.check(self.torch, kernel, *sets[0], causal)
            if not ok:
                return Measurement(FAILED_VERIFY, note=note, fatal=not self._usable())
            med, spread = time_calls(self.torch, sweep.call(self.torch, kernel, sets, causal), sets, reps=self.reps)
            return Measurement("ok", med, f"spread {spread:.1f}%")
        except (TypeError, ValueError):
            raise                                # the sweep called the kernel wrongly: a bug, not a result
        except Exception as exc:
            first = str(exc).splitlines()[0][:200] if str(exc) else ""
            return Measurement(ERROR, note=f"{type(exc).__name__}: {first}", fatal=not self._usable())

    def flash_time(self, shape: Shape, dtype: str, causal: bool, call: str) -> float | None:
        """torch's flash backend on the same inputs, as convention `call` times it (the forward, or
        the backward: autograd of its output, the forward's graph kept)."""
        try:
            fn, sets = EVALS[call].sweep.flash(self.torch, self._sets(shape, dtype, call, causal), causal)
            fn(*sets[0])
            self.torch.cuda.synchronize()
        except (RuntimeError, LookupError):
            return None                          # flash does not run this case on this GPU
        return time_calls(self.torch, fn, sets, reps=self.reps)[0]
