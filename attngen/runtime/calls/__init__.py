"""The call conventions: how a kernel of each kind is called on torch tensors. Each convention is
a Kernel subclass in the module core.calls.CALLS names for it (its input checks, its Params packing,
its launches), registered here under that convention's name, the one a kind declares (Kind.calls);
nothing else in the runtime names one.

- forward: ``kernel(q, k, v, causal=...)``, and ``kernel.varlen(...)`` for varlen sequences
  when the spec sets `varlen: true` (forward.py, varlen.py);
- decode: ``kernel(q, k_cache, v_cache, cache_seqlens=..., block_table=...)`` (decode.py);
- backward: ``kernel(q, k, v, out, lse, dout, causal=...)`` -> (dq, dk, dv) (backward.py);
- forward_fp8: ``kernel(q8, k8, v_t8, q_descale=..., k_descale=..., v_descale=..., causal=...)`` on
  e4m3 tensors with V transposed (forward_fp8.py, which also has quantize_fp8);
- merge: ``kernel(outs, lses, layout=..., out_dtype=...)`` -> (out, lse): partial results merged by
  their LSE (merge.py).
"""
from __future__ import annotations

import importlib

from ...core.calls import CALLS, call_named
from ..kernel import Kernel, bundle_of, launch_bundle

_LOADED: dict[str, type[Kernel]] = {}    # convention name -> its Kernel class, imported on first use


def convention_class(name: str) -> type[Kernel]:
    """The Kernel class of convention `name`: the one Kernel subclass its module (core.calls) defines,
    imported on first use, so a process loads the conventions it calls and no other."""
    cls = _LOADED.get(name)
    if cls is None:
        module = importlib.import_module(call_named(name).kernel)
        found = [v for v in vars(module).values()
                 if isinstance(v, type) and issubclass(v, Kernel) and v.__module__ == module.__name__]
        if len(found) != 1:
            raise TypeError(f"{module.__name__} must define one Kernel class (defines {len(found)})")
        cls = found[0]
        cls.convention = name
        _LOADED[name] = cls
    return cls


def conventions() -> dict[str, type[Kernel]]:
    """Every convention's Kernel class, in the list's order (imports them all)."""
    return {call.name: convention_class(call.name) for call in CALLS}


def kernel_class(plan) -> type[Kernel]:
    """The Kernel class of the plan's call convention (its kind's)."""
    return convention_class(plan.kind.calls)


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


def load_served(spec_path, *, on_compile=None, synchronize: bool | None = None) -> Kernel:
    """load() for the dispatcher: a served spec's kernel from its launch record when it is current
    (attngen.runtime.kernel.launch_bundle), so the first call parses no spec and builds no plan.
    The kernel's plan is then a LaunchPlan, which holds what calls read and nothing else; load()
    gives the full plan that verify, bench and explain read."""
    plan, sources, label = launch_bundle(spec_path)
    return kernel_class(plan).from_sources(plan, sources, label=label, on_compile=on_compile, synchronize=synchronize)


__all__ = ["convention_class", "conventions", "kernel_class", "load", "load_served"]
