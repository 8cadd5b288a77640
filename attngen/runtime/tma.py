"""Encode TMA tensor maps on the host (cuTensorMapEncodeTiled from the CUDA driver, through ctypes)
for kernels that read them.

Each map describes a (batch, heads, seq, head_dim) view as a 4-D tensor (head_dim, seq, heads,
batch) with the view's strides, so rows past a head's sequence load as zeros instead of the next
head's rows. A prepared call shape caches its maps per tensor pointer (ShapeMaps); they travel by
value in the kernel's parameters, so a call adds no copy to the GPU's stream.
"""
from __future__ import annotations

import ctypes

import threading

from ..core.tensor_maps import MAP_ALIGN, MAP_BYTES, TensorMapSpec
from ..errors import ToolError

# CUtensorMap enums (cuda.h)
DATA_TYPES = {"float16": 6, "bfloat16": 9, "float8_e4m3fn": 0}   # 8-bit types as UINT8: TMA moves bytes
SWIZZLES = {"none": 0, "32B": 1, "64B": 2, "128B": 3}
INTERLEAVE_NONE = 0
CUDA_ERROR_INVALID_CONTEXT = 201   # the encoder found no context current on this thread (an autograd thread)
L2_PROMOTION_128B = 2
OOB_FILL_ZEROS = 0

_driver = None
_driver_lock = threading.Lock()


def driver():
    global _driver
    if _driver is not None:
        return _driver
    with _driver_lock:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise ToolError(f"cannot load the CUDA driver library libcuda.so.1 for tensor maps ({exc})") from exc
        fn = lib.cuTensorMapEncodeTiled
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                       ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
                       ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
                       ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        _driver = fn
    return _driver


def map_strides(shape: tuple[int, int, int, int], strides: tuple[int, ...], esize: int) -> tuple[int, int, int]:
    """Byte strides of the map's dims (seq, heads, batch) for a (B, H, S, D) view. The encoder needs
    multiples of 16 bytes; a dimension of size 1 is only read at index 0, so its stride is free and
    becomes the extent of the dimensions inside it."""
    b, h, s, d = shape
    out, inner = [], d * esize
    for size, stride in ((s, strides[2]), (h, strides[1]), (b, strides[0])):
        step = stride * esize
        if size == 1 and step % 16:
            step = -(-inner // 16) * 16
        out.append(step)
        inner = step * size
    return tuple(out)


def encode(view, spec: TensorMapSpec) -> bytes:
    """The 128-byte tensor map of a (B, H, S, D) torch view for `spec`."""
    return encode_at(view.data_ptr(), tuple(view.shape), tuple(view.stride()),
                     str(view.dtype).replace("torch.", ""), view.element_size(), spec)


def encode_at(pointer: int, shape: tuple, stride: tuple, dtype_name: str, esize: int, spec: TensorMapSpec,
              context: int | None = None) -> bytes:
    """The 128-byte tensor map of (B, H, S, D) elements of `dtype_name` at `pointer` with `stride`.
    context: the tensor's GPU's primary context, made current for the encoder where it refuses a thread
    that has none (torch's autograd threads may have none; launches do the same)."""
    b, h, s, d = shape
    dtype = DATA_TYPES[dtype_name]
    buf = ctypes.create_string_buffer(MAP_BYTES + MAP_ALIGN)
    addr = (ctypes.addressof(buf) + MAP_ALIGN - 1) // MAP_ALIGN * MAP_ALIGN   # the encoder needs 64-byte alignment
    dims = (ctypes.c_uint64 * 4)(d, s, h, b)
    strides = (ctypes.c_uint64 * 3)(*map_strides(shape, stride, esize))
    box = (ctypes.c_uint32 * 4)(spec.box_cols, spec.box_rows, 1, 1)
    elem = (ctypes.c_uint32 * 4)(1, spec.row_stride, 1, 1)   # box_rows traversed, every row_stride-th loaded
    def encoded() -> int:
        return driver()(addr, dtype, 4, pointer, dims, strides, box, elem, INTERLEAVE_NONE,
                        SWIZZLES[spec.swizzle], L2_PROMOTION_128B, OOB_FILL_ZEROS)
    rc = encoded()
    if rc == CUDA_ERROR_INVALID_CONTEXT and context is not None:
        from . import driver as cuda
        with cuda.context_current(context):
            rc = encoded()
    if rc != 0:
        raise ValueError(f"cuTensorMapEncodeTiled refused {spec.tensor} (shape {shape}, strides "
                         f"{stride}, box {spec.box_cols}x{spec.box_rows}): CUresult {rc}")
    return ctypes.string_at(addr, MAP_BYTES)


class ShapeMaps:
    """The tensor maps of one prepared call shape: the shapes, strides and dtype of every mapped
    tensor are fixed, so a map depends on its tensor's pointer alone and is cached per (tensor,
    pointer). A new output pointer re-encodes the output's map only."""

    ENTRIES = 64                    # pointers kept per tensor

    def __init__(self, specs: tuple[TensorMapSpec, ...], views: dict, pointer_names: tuple[str, ...] = ("q", "k", "v", "o")):
        self._maps = tuple((s, tuple(views[s.tensor].shape), tuple(views[s.tensor].stride()),
                            str(views[s.tensor].dtype).replace("torch.", ""), views[s.tensor].element_size())
                           for s in specs)
        self._order = tuple(pointer_names.index(s.tensor) for s in specs)
        self._cache: dict = {}
        self._device = getattr(getattr(next(iter(views.values()), None), "device", None), "index", None)

    def _context(self) -> int | None:
        """The primary context of the GPU the views are on (None: not a CUDA tensor)."""
        if self._device is None:
            return None
        from .gpu import device_info
        return device_info(self._device).context

    @property
    def order(self) -> tuple[int, ...]:
        """Each map's tensor as its index in pointer_names."""
        return self._order

    def values(self, pointers: tuple) -> tuple:
        """The maps, in the specs' order, for a call's pointers (named by pointer_names: by default
        q, k, v, o)."""
        out = []
        for (spec, shape, stride, dtype, esize), at in zip(self._maps, self._order):
            key = (at, pointers[at])
            hit = self._cache.get(key)
            if hit is None:
                if len(self._cache) >= self.ENTRIES * len(self._maps):
                    self._cache.clear()
                hit = self._cache[key] = encode_at(pointers[at], shape, stride, dtype, esize, spec, self._context())
            out.append(hit)
        return tuple(out)
