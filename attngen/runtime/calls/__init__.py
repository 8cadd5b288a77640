"""The call conventions: how a kernel of each kind is called on torch tensors. Each convention is
a Kernel subclass in the module core.calls.CALLS names for it (its input checks, its Params packing,
its launches), registered here under that convention's name, the one a kind declares (Kind.calls);
nothing else in the runtime names one.

- forward: ``kernel(q, k, v, causal=...)``, and ``kernel.varlen(...)`` for varlen sequences
  when the spec sets `varlen: true` (forward.py, varlen.py);
- decode: ``kernel(q, k_cache, v_cache, cache_seqlens=..., block_table=...)`` (decode.py);
- backward: ``kernel(q, k, v, out, lse, dout, causal=...)`` -> (dq, dk, dv) (backward.py);
- forward_fp8: ``kernel(q8, k8, v_t8, q_descale=..., k_descale=..., v_descale=..., causal=...)`` on
  e4m3 tensors with V transposed (forward_fp8.py, which also has quantize_fp8).
"""
from __future__ import annotations

from ...core.calls import CALLS
from ..kernel import Kernel, bundle_of
from .backward import BackwardKernel
from .decode import DecodeKernel
from .forward import ForwardKernel
from .forward_fp8 import Fp8ForwardKernel

KERNELS = {cls.__module__: cls for cls in (ForwardKernel, DecodeKernel, BackwardKernel, Fp8ForwardKernel)}
CONVENTIONS = {call.name: KERNELS[call.kernel] for call in CALLS}     # in the list's order

for _name, _cls in CONVENTIONS.items():
    _cls.convention = _name


def kernel_class(plan) -> type[Kernel]:
    """The Kernel class of the plan's call convention (its kind's)."""
    return CONVENTIONS[plan.kind.calls]


def load(spec_or_path, *, on_compile=None, synchronize: bool | None = None) -> Kernel:
    """Render, compile (cached) and load a spec for the current GPU; returns a callable Kernel of
    the spec's call convention.

    `spec_or_path`: a spec file path, a Spec or a Plan. Every part of its bundle is compiled and
    loaded. `on_compile(arch)` is called on a cubin cache miss (default: a line on stderr).
    `synchronize`: wait for every launch and turn asynchronous CUDA faults into LaunchError
    (default: env ATTNGEN_SYNC=1).
    """
    plan, sources, label = bundle_of(spec_or_path)
    return kernel_class(plan).from_sources(plan, sources, label=label, on_compile=on_compile, synchronize=synchronize)


__all__ = ["CONVENTIONS", "KERNELS", "BackwardKernel", "DecodeKernel", "ForwardKernel", "Fp8ForwardKernel", "kernel_class", "load"]
