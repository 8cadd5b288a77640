"""PyCUDA launches every verified kernel a second time, as a launcher independent of the runtime.

The runtime (attngen.runtime) loads cubins as context-independent libraries through its own ctypes
binding of the CUDA driver and launches with a kernelParams array on torch's current stream.
`attngen verify` runs each case through it, then launches the same call again through PyCUDA: the
same cubin loaded by PyCUDA as a module on the device's primary context (the one torch uses), its
functions looked up by PyCUDA, dynamic shared memory opted in by PyCUDA, and the Params bytes
passed as PyCUDA's argument buffer. The two launches write fresh poisoned outputs from the same
inputs; a deterministic kernel's must agree bit for bit (an atomics-based output, the backward's dq,
under the error rule). A disagreement is a failed case: a launch path that sets up a kernel wrongly
(its shared memory, its grid, its block) or a cubin that differs between them cannot pass.

PyCUDA is imported only here, when verify runs: the library calls never need it.
"""
from __future__ import annotations

import contextlib

from ...errors import ToolError
from ...cubin import param_layout
from .cases import read_back

NOT_INSTALLED = ("PyCUDA is not installed: `attngen verify` launches every case through PyCUDA as well; install "
                 "the gpu extra (attngen doctor prints the command)")


class PycudaUnavailable(ToolError):
    """PyCUDA cannot be imported or cannot reach the GPU; the message says why."""


def pycuda_driver():
    """pycuda.driver, initialised; PycudaUnavailable with the reason when it cannot be."""
    try:
        import pycuda.driver as drv
    except ImportError as exc:
        raise PycudaUnavailable(f"{NOT_INSTALLED} ({exc})") from None
    try:
        drv.init()
    except Exception as exc:   # pycuda.driver.Error and friends: no driver, no device
        raise PycudaUnavailable(f"PyCUDA cannot initialise the CUDA driver: {exc}") from None
    return drv


class PycudaLauncher:
    """Launches a Kernel's prepared calls through PyCUDA: one PyCUDA module per cubin of the
    kernel's bundle, loaded on first use in the primary context of the kernel's GPU."""

    def __init__(self):
        self.drv = pycuda_driver()
        self._contexts: dict[int, object] = {}      # device index -> retained primary context
        self._functions: dict[tuple, object] = {}   # (id of the kernel, device, function name) -> pycuda Function
        self._modules: list = []                    # kept alive as long as their functions
        self.launches = 0

    @contextlib.contextmanager
    def _primary(self, index: int):
        """The device's primary context current on this thread for the block (torch's own context)."""
        ctx = self._contexts.get(index)
        if ctx is None:
            ctx = self._contexts[index] = self.drv.Device(index).retain_primary_context()
        ctx.push()
        try:
            yield
        finally:
            self.drv.Context.pop()

    def _function(self, kernel, index: int, fn):
        key = (id(kernel), index, fn.name)
        f = self._functions.get(key)
        if f is None:
            for compiled in kernel.compiled:
                if any(f.name == fn.name for f in compiled.functions):
                    module = self.drv.module_from_buffer(compiled.cubin)
                    self._modules.append(module)
                    break
            else:
                raise RuntimeError(f"{kernel.label}: no cubin of the bundle defines {fn.name}")
            f = module.get_function(fn.name)
            if fn.smem_dynamic:
                f.set_attribute(self.drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, fn.smem_dynamic)
            gap, size = param_layout(compiled.cubin)[fn.name]
            self._functions[key] = f, gap, size
        return self._functions[key]

    def launch(self, kernel, prepared, params: bytes) -> None:
        """Every launch of a prepared call, in order, with the Params bytes as the argument buffer,
        on the legacy default stream. That is torch's default stream too, so the launches follow the
        device's work so far and torch's next work follows them without a wait here; on any other
        current stream, the device is synchronized before and after."""
        torch = kernel._torch
        index = prepared.info.index
        own_stream = torch.cuda.current_stream(index).cuda_stream != 0
        if own_stream:
            torch.cuda.synchronize(index)
        # A short forward call's awaiting twin is launched here as the usual function it twins: PyCUDA
        # launches no programmatic dependent, and so every such case checks the two bit for bit. Every
        # function is launched as the kernel loaded it: a programmatic launch's lone-block shared memory
        # (launch_rules.launches_alone) has no use in a launch that waits for the kernel ahead to end.
        usual = {twin: kernel.entry[key] for key, twin in kernel.awaiting_entry.items()}
        with self._primary(index):
            for fn, _handle, grid in prepared.launches:
                fn = kernel.functions[usual.get(fn.name, fn.name)]
                f, gap, size = self._function(kernel, index, fn)
                f(argument_buffer(bytes(params), gap, size), block=(fn.threads, 1, 1),
                  grid=tuple(int(g) for g in grid), shared=fn.smem_dynamic)
                self.launches += 1
            if own_stream:
                self.drv.Context.synchronize()


def argument_buffer(params: bytes, gap: int, size: int):
    """The kernel's whole parameter buffer as PyCUDA passes it (CU_LAUNCH_PARAM_BUFFER_POINTER): the
    caller lays it out, so a Params the compiler placed past a gap (a 64-byte aligned one, holding
    TMA tensor maps) goes at that offset, as the cubin records; a kernelParams launch (the runtime's)
    leaves that to the driver."""
    import numpy as np
    if gap < 0 or size >= 0 and gap + len(params) != size:
        raise RuntimeError(f"the cubin's parameter buffer (Params at +{gap}, {size} B) does not hold "
                           f"{len(params)} B of Params")
    buffer = bytes(gap) + params
    return np.frombuffer(buffer, dtype=np.dtype((np.void, len(buffer))))[0]


_LAUNCHER: list = []


def launcher() -> PycudaLauncher:
    """The process's PyCUDA launcher (made on first use)."""
    if not _LAUNCHER:
        _LAUNCHER.append(PycudaLauncher())
    return _LAUNCHER[0]


def bits_differ(torch, a, b):
    """Whether two tensors of one dtype and shape differ in any bit (NaN payloads included): True, or
    a 0-d bool tensor not yet read (read_back reads it with the case's other values)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return True
    if not a.numel():
        return False
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return (a.contiguous().view(as_int) != b.contiguous().view(as_int)).any()


def pycuda_agreement(result, kernel, launch, names, first, *, atomic=(), tolerance: float | dict | None = None) -> None:
    """Run `launch(*fresh)` through PyCUDA, where `fresh` are NaN-poisoned tensors shaped like
    `first` (launch may ignore them and return its own outputs), and compare with `first`, the
    outputs of the same call through the runtime: bit for bit, or for the outputs named in `atomic`
    (accumulated with atomics, in an order the hardware picks) within `tolerance` of max abs
    difference (a number or 0-d tensor, or one per name). Appends a problem per disagreement and sets
    result.pycuda. Reads the device once."""
    torch = kernel._torch
    fresh = tuple(torch.full_like(t, float("nan")) for t in first)
    with kernel.launching_through(launcher()):
        returned = launch(*fresh)
    second = tuple(returned) if returned is not None else fresh
    pending = {}
    for name, a, b in zip(names, first, second):
        bound = tolerance.get(name) if isinstance(tolerance, dict) else tolerance
        pending[name] = bits_differ(torch, a, b)
        if name in atomic and bound is not None and pending[name] is not True:
            pending[name + " diff"] = (a.float() - b.float()).abs().nan_to_num(float("inf")).max() if a.numel() else 0.0
            pending[name + " bound"] = bound
    values = read_back(torch, pending)
    how = "bitwise"
    for name in names:
        if not values[name]:
            continue
        if name + " diff" in values:
            diff, bound = values[name + " diff"], values[name + " bound"]
            if diff <= bound:
                how = "bitwise but atomics" if how == "bitwise" else how
                continue
            result.problems.append(f"{name} through PyCUDA differs from the runtime's by {diff:.3g} "
                                   f"(more than {bound:.3g})")
        else:
            result.problems.append(f"{name} through PyCUDA differs from the runtime's launch in some bits")
        how = "differs"
    result.pycuda = how


__all__ = ["PycudaLauncher", "PycudaUnavailable", "bits_differ", "launcher", "pycuda_agreement", "pycuda_driver"]
