"""The CUDA driver calls the runtime makes, through ctypes on libcuda (no compiled extension).

Why not PyCUDA for loading and launching: PyCUDA launches only on its own stream objects (it
cannot take torch's current stream as a raw handle), exposes no function handle, and binds its
modules to a context that is current on the loading thread only. A call must run on whatever
stream torch has current (a user's stream, a CUDA graph being captured), from any thread, on any
GPU of the process. So:

- cubins are loaded as context-independent libraries (cuLibraryLoadData, CUDA >= 12.0); a
  library's kernel (CUkernel) launches in whichever context is current and is loaded into each
  device's primary context on first use there;
- the launch is cuLaunchKernel on torch's raw current stream, with the Params struct passed as
  the single by-value parameter;
- the context a launch needs is the device's primary context, the one torch uses. A thread that
  has none current (a worker, an autograd engine thread) gets it made current at the call.

Every function returns or raises; a CUresult other than success becomes DriverError with the
driver's own name and text of the error.
"""
from __future__ import annotations

import contextlib
import ctypes
import threading

from ..errors import NoGpuError

SUCCESS = 0
OUT_OF_MEMORY = 2                  # CUDA_ERROR_OUT_OF_MEMORY
# CUfunction_attribute
ATTR_MAX_THREADS_PER_BLOCK = 0
ATTR_NUM_REGS = 4
ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
# CUdevice_attribute
DEV_MULTIPROCESSOR_COUNT = 16
DEV_COMPUTE_CAPABILITY_MAJOR = 75
DEV_COMPUTE_CAPABILITY_MINOR = 76
DEV_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97
DEV_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR = 81
DEV_RESERVED_SHARED_MEMORY_PER_BLOCK = 111

_c = ctypes
_vp = ctypes.c_void_p
_u = ctypes.c_uint


class DriverError(RuntimeError):
    """A CUDA driver call failed; `code` is its CUresult."""

    def __init__(self, call: str, code: int, name: str, text: str):
        super().__init__(f"{call} failed: {name}: {text}")
        self.call, self.code, self.name, self.text = call, code, name, text

    def __reduce__(self):
        # rebuilt from its four arguments, so that it crosses a process boundary (verify's workers) as itself
        return type(self), (self.call, self.code, self.name, self.text)


_lib = None
_lib_lock = threading.Lock()

# name -> (restype, argtypes). Launch-path calls are bound once to module globals below.
_SIGNATURES = {
    "cuInit": (_c.c_int, [_u]),
    "cuGetErrorName": (_c.c_int, [_c.c_int, _c.POINTER(_c.c_char_p)]),
    "cuGetErrorString": (_c.c_int, [_c.c_int, _c.POINTER(_c.c_char_p)]),
    "cuDeviceGet": (_c.c_int, [_c.POINTER(_c.c_int), _c.c_int]),
    "cuDeviceGetAttribute": (_c.c_int, [_c.POINTER(_c.c_int), _c.c_int, _c.c_int]),
    "cuDevicePrimaryCtxRetain": (_c.c_int, [_c.POINTER(_vp), _c.c_int]),
    "cuCtxGetCurrent": (_c.c_int, [_c.POINTER(_vp)]),
    "cuCtxSetCurrent": (_c.c_int, [_vp]),
    "cuLibraryLoadData": (_c.c_int, [_c.POINTER(_vp), _c.c_char_p, _vp, _vp, _u, _vp, _vp, _u]),
    "cuLibraryGetKernel": (_c.c_int, [_c.POINTER(_vp), _vp, _c.c_char_p]),
    "cuKernelSetAttribute": (_c.c_int, [_c.c_int, _c.c_int, _vp, _c.c_int]),
    "cuKernelGetAttribute": (_c.c_int, [_c.POINTER(_c.c_int), _c.c_int, _vp, _c.c_int]),
    "cuKernelGetFunction": (_c.c_int, [_c.POINTER(_vp), _vp]),
    "cuLaunchKernel": (_c.c_int, [_vp, _u, _u, _u, _u, _u, _u, _u, _vp, _vp, _vp]),
    "cuLaunchKernelEx": (_c.c_int, [_vp, _vp, _vp, _vp]),
    "cuStreamSynchronize": (_c.c_int, [_vp]),
}


def lib():
    """libcuda with every signature the runtime uses bound; NoGpuError when there is no driver."""
    global _lib
    if _lib is None:
        with _lib_lock:
            if _lib is None:
                try:
                    cuda = ctypes.CDLL("libcuda.so.1")
                except OSError as exc:
                    raise NoGpuError(f"no CUDA driver: cannot load libcuda.so.1 ({exc})") from exc
                for name, (restype, argtypes) in _SIGNATURES.items():
                    try:
                        fn = getattr(cuda, name)
                    except AttributeError as exc:
                        raise NoGpuError(f"the CUDA driver has no {name} (attngen needs a CUDA 12 or newer "
                                         f"driver)") from exc
                    fn.restype, fn.argtypes = restype, argtypes
                check("cuInit", cuda.cuInit(0))
                _lib = cuda
    return _lib


_raw = None


def raw_calls():
    """(cuLaunchKernel, cuCtxGetCurrent) bound without argtypes, for the launch path: ctypes then
    converts no argument (1.1 -> 0.4 us per launch measured on a CPU machine with a no-op of the
    same signature), so the caller passes pointers and handles as c_void_p objects, and plain
    Python ints only where C takes a 32-bit int (grid, block, shared memory bytes)."""
    global _raw
    if _raw is None:
        lib()
        cuda = ctypes.CDLL("libcuda.so.1")    # a second handle: its functions keep no argtypes
        launch, probe = cuda.cuLaunchKernel, cuda.cuCtxGetCurrent
        launch.restype = probe.restype = ctypes.c_int
        _raw = (launch, probe)
    return _raw


def error_text(code: int) -> tuple[str, str]:
    name, text = ctypes.c_char_p(), ctypes.c_char_p()
    cuda = _lib
    if cuda is None or cuda.cuGetErrorName(code, ctypes.byref(name)) or cuda.cuGetErrorString(code, ctypes.byref(text)):
        return f"CUresult {code}", "unknown error"
    return name.value.decode(), text.value.decode()


def check(call: str, code: int) -> None:
    if code != SUCCESS:
        raise DriverError(call, code, *error_text(code))


# -- devices and contexts --------------------------------------------------------------------------

def device(ordinal: int) -> int:
    dev = ctypes.c_int()
    check("cuDeviceGet", lib().cuDeviceGet(ctypes.byref(dev), ordinal))
    return dev.value


def device_attribute(dev: int, attribute: int) -> int:
    value = ctypes.c_int()
    check("cuDeviceGetAttribute", lib().cuDeviceGetAttribute(ctypes.byref(value), attribute, dev))
    return value.value


def primary_context(dev: int) -> int:
    """The device's primary context (retained, never released: it lives as long as the process,
    as torch's own reference to it does)."""
    ctx = ctypes.c_void_p()
    check("cuDevicePrimaryCtxRetain", lib().cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
    return ctx.value


def current_context() -> int | None:
    """The context current on this thread (None: none)."""
    state = thread_state()
    check("cuCtxGetCurrent", lib().cuCtxGetCurrent(state.ctx_ref))
    return state.ctx.value


def set_current_context(ctx: int | None) -> None:
    check("cuCtxSetCurrent", lib().cuCtxSetCurrent(ctx))


@contextlib.contextmanager
def context_current(ctx: int):
    """`ctx` current on this thread for the block; the thread's own context (or none) given back after."""
    had = current_context()
    set_current_context(ctx)
    try:
        yield
    finally:
        set_current_context(had)


# -- libraries and kernels ------------------------------------------------------------------------

def load_library(cubin: bytes) -> int:
    """A context-independent library of the cubin's kernels (kept for the life of the process)."""
    handle = ctypes.c_void_p()
    check("cuLibraryLoadData", lib().cuLibraryLoadData(ctypes.byref(handle), cubin, None, None, 0, None, None, 0))
    return handle.value


def library_kernel(library: int, name: str) -> int:
    handle = ctypes.c_void_p()
    check(f"cuLibraryGetKernel({name})", lib().cuLibraryGetKernel(ctypes.byref(handle), library, name.encode()))
    return handle.value


def kernel_function(kernel: int) -> int:
    """The CUfunction of a library kernel in the current context (loads it there if needed)."""
    handle = ctypes.c_void_p()
    check("cuKernelGetFunction", lib().cuKernelGetFunction(ctypes.byref(handle), kernel))
    return handle.value


def kernel_attribute(kernel: int, attribute: int, dev: int) -> int:
    value = ctypes.c_int()
    check("cuKernelGetAttribute", lib().cuKernelGetAttribute(ctypes.byref(value), attribute, kernel, dev))
    return value.value


def set_kernel_attribute(kernel: int, attribute: int, value: int, dev: int) -> None:
    check("cuKernelSetAttribute", lib().cuKernelSetAttribute(attribute, value, kernel, dev))


# -- the launch -------------------------------------------------------------------------------------

PARAMS_MAX = 4096          # bytes: CUDA's limit for a kernel's parameters
LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6   # CUlaunchAttributeID


class LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute: the attribute's id, padded to 8 bytes, then its value (a 64-byte union whose
    first member here is an int: programmaticStreamSerializationAllowed)."""
    _fields_ = [("id", _c.c_int), ("pad", _c.c_char * 4), ("value", _c.c_int), ("rest", _c.c_char * 60)]


class LaunchConfig(ctypes.Structure):
    """CUlaunchConfig: grid, block, dynamic shared memory, stream and the launch's attributes."""
    _fields_ = [("grid_x", _u), ("grid_y", _u), ("grid_z", _u), ("block_x", _u), ("block_y", _u), ("block_z", _u),
                ("smem", _u), ("stream", _vp), ("attrs", _c.POINTER(LaunchAttribute)), ("num_attrs", _u)]


def stream_synchronize(stream: int) -> None:
    """Wait on the host for the work queued on `stream` (a CUstream handle) so far."""
    check("cuStreamSynchronize", lib().cuStreamSynchronize(stream))


def programmatic_launches(arch: str) -> bool:
    """Whether a GPU of `arch` (e.g. sm_90) takes programmatic dependent launches (compute capability 9.0
    and later): a kernel launched so may start before the kernel ahead of it on the stream ends, and
    waits for it with griddepcontrol.wait, which hides its launch behind the other's last blocks."""
    digits = arch.removeprefix("sm_").rstrip("af")
    return digits.isdigit() and int(digits) >= 90


class ThreadState:
    """What a launch needs per thread, made once per thread: a Params buffer (64-byte aligned, for
    Params holding TMA tensor maps) with the one-entry kernelParams array that points at it, and
    the out parameter of the current-context probe. Concurrent calls never share the bytes being
    packed; the driver copies the parameters during cuLaunchKernel, so the buffer is free again
    when the call returns."""

    __slots__ = ("raw", "offset", "address", "params", "ctx", "ctx_ref", "config", "config_ref", "launch_ex")

    def __init__(self):
        self.raw = ctypes.create_string_buffer(PARAMS_MAX + 64)
        base = ctypes.addressof(self.raw)
        self.offset = -base % 64
        self.address = base + self.offset
        self.params = (ctypes.c_void_p * 1)(self.address)
        self.ctx = ctypes.c_void_p()
        self.ctx_ref = ctypes.byref(self.ctx)
        # a programmatic dependent launch's configuration: one attribute, filled per launch
        attribute = LaunchAttribute(LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, b"", 1)
        self.config = LaunchConfig(block_y=1, block_z=1, attrs=ctypes.pointer(attribute), num_attrs=1)
        self.config_ref = ctypes.byref(self.config)
        self.launch_ex = None

    def launch_programmatic(self, function, grid, threads: int, smem: int, stream) -> int:
        """cuLaunchKernelEx of `function` (a CUfunction as c_void_p) with this thread's Params, as a
        programmatic dependent of the kernel ahead of it on `stream`; the driver's result code."""
        if self.launch_ex is None:
            self.launch_ex = lib().cuLaunchKernelEx
        config = self.config
        config.grid_x, config.grid_y, config.grid_z = grid
        config.block_x, config.smem, config.stream = threads, smem, stream
        return self.launch_ex(self.config_ref, function, self.params, None)


_threads = threading.local()


def thread_state() -> ThreadState:
    try:
        return _threads.state
    except AttributeError:
        _threads.state = ThreadState()
        return _threads.state


__all__ = ["DriverError", "LaunchAttribute", "LaunchConfig", "PARAMS_MAX", "ThreadState", "check", "context_current",
           "current_context",
           "device", "device_attribute", "error_text", "kernel_attribute", "lib", "library_kernel", "load_library",
           "primary_context", "programmatic_launches", "set_current_context", "set_kernel_attribute",
           "stream_synchronize", "thread_state"]
