"""The GPUs of this process: torch, the CUDA driver, and what the runtime reads once per device
(its primary context, SM count, arch and shared-memory limit).

Nothing here imports torch at module import time: the CPU-only install has none.
"""
from __future__ import annotations

import threading

from ..core.frozen import Frozen
from ..errors import NoGpuError
from . import driver


def gpu_modules():
    """(torch, attngen.runtime.driver) once torch sees a CUDA GPU and the driver loads.

    Raises NoGpuError when torch, a CUDA GPU or the CUDA driver is missing.
    """
    try:
        import torch
    except ImportError as exc:
        raise NoGpuError(f"torch is not installed: pip install -e '.[gpu]' ({exc})") from exc
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise NoGpuError(f"no CUDA GPU: torch {torch.__version__} ({build}) sees none")
    torch.cuda.init()
    driver.lib()
    return torch, driver


def device_arch(torch, index: int | None = None) -> str:
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm_{major}{minor}"


class DeviceInfo(Frozen):
    """One GPU as a launch needs it, read once."""

    # Frozen, not a frozen dataclass: a first call defines this class (core.frozen says why); not a
    # NamedTuple, whose `index` would be tuple.index.
    __slots__ = ("index", "handle", "context", "arch", "sm_count", "smem_optin", "smem_per_sm", "smem_reserved")

    def __init__(self, index: int,     # torch's ordinal (cuda:N)
                 handle: int,          # CUdevice
                 context: int,         # its primary context (torch's)
                 arch: str,            # e.g. sm_90
                 sm_count: int,
                 smem_optin: int,      # bytes of shared memory a block may opt into
                 smem_per_sm: int = 0,     # bytes of shared memory of one SM (0: not known)
                 smem_reserved: int = 0):  # bytes the system keeps of it per resident block
        super().__init__(index, handle, context, arch, sm_count, smem_optin, smem_per_sm, smem_reserved)


_devices: dict[int, DeviceInfo] = {}
_devices_lock = threading.Lock()


def device_info(index: int) -> DeviceInfo:
    """The DeviceInfo of cuda:`index` (read on first use, from any thread)."""
    info = _devices.get(index)
    if info is None:
        with _devices_lock:
            info = _devices.get(index)
            if info is None:
                dev = driver.device(index)
                major = driver.device_attribute(dev, driver.DEV_COMPUTE_CAPABILITY_MAJOR)
                minor = driver.device_attribute(dev, driver.DEV_COMPUTE_CAPABILITY_MINOR)
                info = DeviceInfo(index, dev, driver.primary_context(dev), f"sm_{major}{minor}",
                                  driver.device_attribute(dev, driver.DEV_MULTIPROCESSOR_COUNT),
                                  driver.device_attribute(dev, driver.DEV_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
                                  driver.device_attribute(dev, driver.DEV_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR),
                                  driver.device_attribute(dev, driver.DEV_RESERVED_SHARED_MEMORY_PER_BLOCK))
                _devices[index] = info
    return info


# -- buffers kept between calls -----------------------------------------------------------------

_maker = None                   # the thread that makes them (a one-worker executor), made on first use
_maker_lock = threading.Lock()
_side_streams: dict = {}        # device index -> the stream they are made on


def persistent(make, index: int):
    """A tensor attngen keeps between calls (the input-error word, split workspaces and counters, the
    sinks' zero row, scale values), made by make() on cuda:`index` outside any memory pool the calling
    thread allocates to, and ready on every stream when handed back.

    torch.compile's CUDA graphs (mode="reduce-overhead") run a function's warm-up with every allocation
    of the calling thread routed to the graph's pool, and refuse a tensor of that pool that outlives the
    function without being one of its outputs; a buffer first made during such a warm-up would be one.
    So make() runs on a thread of its own, on a side stream of the device, synchronized before the
    tensor is returned (made and zeroed before any stream reads it; a caller that frees it on another
    stream first records that stream, Tensor.record_stream). While the caller's stream is being captured
    make() runs on the calling thread, as any allocation there (nothing may synchronize then)."""
    import torch
    if torch._C._cuda_isCurrentStreamCapturing():
        return make()
    global _maker
    if _maker is None:
        with _maker_lock:
            if _maker is None:
                from concurrent.futures import ThreadPoolExecutor
                _maker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="attngen-buffers")

    def run():
        stream = _side_streams.get(index)
        if stream is None:
            stream = _side_streams[index] = torch.cuda.Stream(device=index)
        with torch.cuda.stream(stream):
            made = make()
        # The side stream is non-blocking (torch's streams are), so this waits for make()'s own work
        # alone, never for the caller's queue: through the driver, not torch, whose sync debug mode
        # (which guards the caller's queue) would report it as a host-device synchronization.
        driver.stream_synchronize(stream.cuda_stream)
        return made
    return _maker.submit(run).result()


# -- input errors the kernels recorded -----------------------------------------------------------

class InputError(ValueError):
    """A call's lengths, page ids or offsets were bad; the kernel clamped around them (see
    attngen.check_errors)."""


_flags: dict = {}               # device index -> int32 tensor (1,): the flag word kernels atomicOr into
_flags_lock = threading.Lock()


def error_word(index: int) -> int:
    """Address of cuda:`index`'s input-error flag word (zeroed on first use)."""
    word = _flags.get(index)
    if word is None:
        with _flags_lock:
            word = _flags.get(index)
            if word is None:
                import torch
                word = _flags[index] = persistent(lambda: torch.zeros(1, dtype=torch.int32, device=f"cuda:{index}"),
                                                  index)
    return word.data_ptr()


def check_errors(device=None) -> None:
    """Raise InputError if a kernel on `device` (default: every GPU attngen ran on) clamped a bad
    input since the last check, naming what it was; the flags are cleared. It reads one word per
    GPU back, so it waits for the work queued before it: call it where the program synchronizes
    anyway (after a step, at a checkpoint), or in tests."""
    from ..core.input_errors import messages
    if device is None:
        indices = sorted(_flags)
    else:
        import torch
        indices = [torch.device(device).index if not isinstance(device, int) else device]
    found = []
    for index in indices:
        word = _flags.get(index)
        if word is None:
            continue
        flags = int(word.item())
        if flags:
            word.zero_()
            found += [f"cuda:{index}: {m}" for m in messages(flags)]
    if found:
        raise InputError("attngen kernels met bad inputs since the last check: " + "; ".join(found)
                         + " (pass validate=True to a call to have it refused with the value)")


__all__ = ["DeviceInfo", "InputError", "NoGpuError", "check_errors", "device_arch", "device_info", "error_word",
           "gpu_modules"]
