"""Run a generated kernel on torch tensors: input checks, the Params struct, grid, launch.

The CUDA source always comes from the renderer (the same bytes as generated/<name>.cu for a spec
file); it is compiled for the GPU torch is using, loaded with PyCUDA into torch's primary context
and launched on torch's current stream.

Streams: PyCUDA launches only on a ``pycuda.driver.Stream`` (or the legacy default stream when
given none) and cannot wrap a raw ``cudaStream_t``. So when torch's current stream is the legacy
default stream (handle 0, torch's default) the kernel goes straight onto it; otherwise it is
launched on a PyCUDA stream owned by the Kernel, wrapped for torch as ``torch.cuda.ExternalStream``
and ordered with events: that stream waits for torch's current stream before the launch, and
torch's current stream waits for it after. Work queued later on torch's stream therefore sees the
output, and memory freed on torch's stream is reused only after the kernel finished with it.

Nothing here imports torch or pycuda at module import time: the CPU-only install has neither.
"""
from __future__ import annotations

import math
import numbers
import os
import sys
from dataclasses import dataclass

from .errors import NoGpuError, ToolError
from .core.forward import LOG2E
from .core.varlen import is_packed, mask_of
from .plan import Plan, make_plan
from .spec import Spec, spec_dict, spec_yaml

LAYOUTS = ("bhsd", "bshd")          # bhsd: (batch, heads, seq, dim) as torch SDPA; bshd: (batch, seq, heads, dim)
PACKED = "packed"                   # varlen calls: (total_rows, heads, dim), sequences back to back
LOAD_BYTES = 16                     # the kernels read and write rows in 16-byte vectors
ELEM_BYTES = 2                      # fp16 / bf16
MAX_GRID_YZ = 65535                 # CUDA limit of gridDim.y and gridDim.z (heads, batch)
MAX_GRID_X = 2**31 - 1
TORCH_DTYPE_NAMES = {"fp16": "float16", "bf16": "bfloat16"}
SYNC_ENV = "ATTNGEN_SYNC"           # "1": synchronize after every launch, so asynchronous faults name the kernel


class LaunchError(RuntimeError):
    """CUDA refused or aborted a kernel launch; the message names the kernel and launch config."""


@dataclass(frozen=True)
class LaunchConfig:
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem_dynamic: int               # bytes of dynamic shared memory (0 when the kernel's is static)

    def describe(self) -> str:
        return f"grid={self.grid}, block={self.block}, dynamic smem={self.smem_dynamic} B"


def launch_config(plan: Plan, batch: int, heads: int, seqlen_q: int, sm_count: int | None = None) -> LaunchConfig:
    """The plan's grid for this problem (persistent plans: `sm_count` blocks at most), one block of
    plan.threads."""
    return LaunchConfig(plan.grid(batch, heads, seqlen_q, sm_count), (plan.threads, 1, 1),
                        plan.smem_bytes if plan.smem_dynamic else 0)


def pack_params(plan: Plan, *, strides: dict, **values) -> bytes:
    """The kernel's by-value Params, laid out by the plan's ABI list: `values` by field name, plus
    the (batch, head, row) element strides of each (B, H, S, D) tensor in `strides`."""
    for t, view in strides.items():
        for d, name in enumerate(("batch", "head", "row")):
            values[f"{t}_{name}_stride"] = view.stride(d)
    return plan.abi.pack(values)


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)


def to_bhsd(t, layout: str):
    """A (batch, heads, seq, dim) view of a tensor given in `layout` (no copy); packed tensors
    (total_rows, heads, dim) have no batch dimension and come back as they are."""
    return t if layout in ("bhsd", PACKED) else t.permute(0, 2, 1, 3)


def render_bundle(spec_or_path) -> tuple[Plan, tuple[str, ...], str]:
    """(plan, CUDA source of every part, label) for a spec path, Spec or Plan, through attngen.render.

    A path renders exactly its files under generated/. A Spec or Plan has no YAML text of its own,
    so its header quotes the spec as dumped YAML; the code below the header is the same.
    """
    from .render import render_parts, render_spec_file
    if isinstance(spec_or_path, (str, os.PathLike)):
        r = render_spec_file(spec_or_path)
        return r.plan, tuple(p.source for p in r.parts), r.spec_path
    if isinstance(spec_or_path, Spec):
        plan = make_plan(spec_or_path)
    elif isinstance(spec_or_path, Plan):
        plan = spec_or_path
    else:
        raise TypeError(f"load() takes a spec path, a Spec or a Plan (got {type(spec_or_path).__name__})")
    label = f"<spec {plan.spec.name}>"
    return plan, tuple(p.source for p in render_parts(plan, label, spec_yaml(spec_dict(plan.spec)))), label


def render_for(spec_or_path) -> tuple[Plan, str, str]:
    """(plan, CUDA source, label) of a one-part spec (every forward kind), as render_bundle."""
    plan, sources, label = render_bundle(spec_or_path)
    if len(sources) != 1:
        raise ValueError(f"{label} renders {len(sources)} parts; use render_bundle")
    return plan, sources[0], label


def load(spec_or_path, *, on_compile=None, synchronize: bool | None = None) -> "Kernel":
    """Render, compile (cached) and load a spec for the current GPU; returns a callable Kernel.

    `spec_or_path`: a spec file path, a Spec or a Plan. Every part of its bundle is compiled and
    loaded. `on_compile(arch)` is called on a cubin cache miss (default: a line on stderr).
    `synchronize`: wait for every launch and turn asynchronous CUDA faults into LaunchError
    (default: env ATTNGEN_SYNC=1).
    """
    from .kinds import kind_of
    plan, sources, label = render_bundle(spec_or_path)
    cls = Kernel
    if kind_of(plan.spec).calls == "decode":
        from .decode import DecodeKernel as cls
    return cls.from_sources(plan, sources, label=label, on_compile=on_compile, synchronize=synchronize)


# -- GPU access ----------------------------------------------------------------------------------

def gpu_modules():
    """(torch, pycuda.driver, pycuda.autoprimaryctx) with torch's primary context current.

    Raises NoGpuError when torch, a CUDA GPU or pycuda is missing.
    """
    try:
        import torch
    except ImportError as exc:
        raise NoGpuError(f"torch is not installed: pip install -e '.[gpu]' ({exc})") from exc
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise NoGpuError(f"no CUDA GPU: torch {torch.__version__} ({build}) sees none")
    try:
        import pycuda.driver as drv
    except ImportError as exc:
        raise NoGpuError(f"pycuda is not installed: pip install -e '.[gpu]' ({exc})") from exc
    torch.cuda.init()
    try:
        # Retains and pushes the device's primary context, the one torch's runtime uses, so
        # torch's pointers are valid in PyCUDA launches. (pycuda.autoinit would make a new context.)
        import pycuda.autoprimaryctx as primary
    except drv.Error as exc:
        raise NoGpuError(f"no CUDA GPU: pycuda could not retain the primary context ({exc})") from exc
    _check_same_device(torch, primary.device)
    return torch, drv, primary


def _check_same_device(torch, device) -> None:
    """PyCUDA picks its device itself (env CUDA_DEVICE, else the first usable); torch may differ."""
    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    want = tuple(getattr(props, a, None) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
    if None in want:
        return
    try:
        domain, bus, dev_fn = device.pci_bus_id().split(":")
        have = (int(domain, 16), int(bus, 16), int(dev_fn.split(".")[0], 16))
    except (AttributeError, ValueError):
        return
    if have != want:
        raise ToolError(f"pycuda's context is on GPU {device.pci_bus_id()} but torch's current device is "
                        f"cuda:{index}; run with CUDA_DEVICE={index} or torch.cuda.set_device to match")


def device_arch(torch) -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


# -- the kernel ----------------------------------------------------------------------------------

class Kernel:
    """One compiled spec: every mask variant it emits, callable on torch tensors.

    ``kernel(q, k, v, causal=False, scale=None, return_lse=False, layout="bhsd")`` returns o, or
    (o, lse) with lse of shape (batch, heads, seqlen_q), fp32, natural log.
    """

    def __init__(self, plan: Plan, sources: tuple[str, ...], *, label: str, compiled: tuple, modules: tuple,
                 functions: dict, device, synchronize: bool):
        self.plan = plan
        self.sources = sources              # one CUDA source per part of the plan's bundle
        self.label = label
        self.compiled = compiled            # attngen.compile.CompileResult per part
        self.arch = compiled[0].arch
        self.modules = modules
        self.functions = functions          # function name -> (parameter gap, pycuda Function), every part's
        self.entry = plan.entry_functions   # mask -> the function a call launches
        self.device = device                # torch.device
        self.synchronize = synchronize
        self._side = None                   # (pycuda Stream, torch ExternalStream), made on first use
        self._tensor_maps = None            # TensorMapCache, for plans that read TMA tensor maps

    @property
    def source(self) -> str:
        """The source of a one-part kernel (every forward kind)."""
        if len(self.sources) != 1:
            raise ValueError(f"{self.label} has {len(self.sources)} parts; see .sources")
        return self.sources[0]

    @classmethod
    def from_source(cls, plan: Plan, source: str, **kw) -> "Kernel":
        """Compile one-part `source` (which must define plan.functions with the plan's Params ABI)
        and load it.

        `load()` always renders the source from the spec; this entry exists for sources that
        differ on purpose, e.g. a kernel with a planted bug that the verifier must reject.
        """
        return cls.from_sources(plan, (source,), **kw)

    @classmethod
    def from_sources(cls, plan: Plan, sources, *, label: str | None = None, on_compile=None,
                     synchronize: bool | None = None) -> "Kernel":
        """Compile and load one source per part of the plan's bundle."""
        from .compile import compile_source
        from .cubin import param_layout
        torch, drv, primary = gpu_modules()
        device = device_arch(torch)
        if plan.arch_suffix and device != plan.target.arch:
            raise ToolError(f"{plan.spec.name} needs an {plan.target.arch}{plan.arch_suffix} GPU ({plan.target.name}); "
                            f"this one is {device}")
        arch = plan.compile_arch(device)   # e.g. sm_90a for wgmma / setmaxnreg
        label = label or plan.spec.name
        sources = tuple(sources)
        if len(sources) != len(plan.parts):
            raise ValueError(f"{label}: {len(sources)} source(s) for {len(plan.parts)} part(s)")
        if on_compile is None:
            def on_compile(a, name=label):
                print(f"compiling {name} for {a} ...", file=sys.stderr, flush=True)
        compiled, modules, functions = [], [], {}
        for part, source in zip(plan.parts, sources):
            result = compile_source(source, arch, on_compile=on_compile)
            layout = param_layout(result.cubin)
            try:
                module = drv.module_from_buffer(result.cubin)
            except drv.Error as exc:
                raise ToolError(f"cannot load the {arch} cubin of {label} ({part.name}): {exc}") from exc
            for mask, name in part.functions:
                try:
                    fn = module.get_function(name)
                except drv.Error as exc:
                    raise ToolError(f"{label}: the cubin has no kernel {name} ({exc})") from exc
                _configure(drv, primary.device, plan, fn, name, part.threads or plan.threads)
                # A 64-byte aligned Params starts past a gap in the parameter buffer (the cubin says where).
                gap, size = layout.get(name, (None, None))
                if gap is None or (size >= 0 and gap + plan.abi.size != size):
                    raise ToolError(f"{label}: the cubin's parameter layout of {name} (offset {gap}, buffer {size} B) "
                                    f"does not match Params ({plan.abi.size} B)")
                functions[name] = (gap, fn.prepare(f"{gap + plan.abi.size}s"))
            compiled.append(result)
            modules.append(module)
        if synchronize is None:
            synchronize = os.environ.get(SYNC_ENV, "") == "1"
        return cls(plan, sources, label=label, compiled=tuple(compiled), modules=tuple(modules),
                   functions=functions, device=torch.device("cuda", torch.cuda.current_device()),
                   synchronize=synchronize)

    # -- public ------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.plan.spec.name

    @property
    def masks(self) -> tuple[str, ...]:
        """The masks of the padded call (kernel(q, k, v, causal=...))."""
        return tuple(key for key in self.entry if not is_packed(key))

    @property
    def varlen_masks(self) -> tuple[str, ...]:
        """The masks of the packed-sequence call (kernel.varlen(...)); empty unless the spec sets varlen."""
        return tuple(mask_of(key) for key in self.entry if is_packed(key))

    def varlen(self, q, k, v, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q: int | None = None, causal: bool = False,
               alignment: str | None = None, scale: float | None = None, return_lse: bool = False, out=None,
               lse_out=None, validate: bool = True):
        """Attention over packed sequences of different lengths (see attngen.varlen.varlen_call):
        q (total_q, Hq, D), k and v (total_k, Hkv, D), cu_seqlens_q/k int32 (batch + 1); returns o
        shaped like q, or (o, lse) with lse fp32 (Hq, total_q)."""
        from .varlen import varlen_call
        return varlen_call(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=max_seqlen_q, causal=causal,
                           alignment=alignment, scale=scale, return_lse=return_lse, out=out, lse_out=lse_out,
                           validate=validate)

    @property
    def dtype(self):
        import torch
        return getattr(torch, TORCH_DTYPE_NAMES[self.plan.spec.dtype])

    def __repr__(self) -> str:
        return (f"<attngen.Kernel {self.label} {self.plan.spec.dtype} head_dim={self.plan.head_dim} "
                f"masks={list(self.masks)} {self.arch}>")

    def __call__(self, q, k, v, *, causal: bool = False, alignment: str | None = None, scale: float | None = None,
                 return_lse: bool = False, layout: str = "bhsd", out=None, lse_out=None):
        """Attention softmax(scale * q k^T) v of q (B, Hq, Sq, D), k and v (B, Hkv, Sk, D).

        layout "bshd" takes and returns (B, S, H, D) instead. Any strides work as long as the
        last dimension is contiguous and the others are multiples of 8 elements. `alignment` of a
        causal mask: "top_left" (default, torch SDPA is_causal: query i sees keys <= i) or
        "bottom_right" (FlashAttention >= 2.1: query i sees keys <= i + Sk - Sq; rows that see no
        key give zeros and LSE -inf). GQA/MQA: query head h reads kv head
        h // (Hq // Hkv). `out` (shaped like q) and `lse_out` (fp32 (B, Hq, Sq), contiguous)
        receive the results instead of new tensors; lse_out implies return_lse.
        """
        import torch
        qb, kb, vb = self._views(layout, q=q, k=k, v=v)
        batch, heads, seqlen_q, _ = qb.shape
        _, kv_heads, seqlen_k, _ = kb.shape
        if kb.shape[0] != batch or vb.shape[0] != batch:
            raise ValueError(f"q, k and v must have the same batch size (got {qb.shape[0]}, {kb.shape[0]}, "
                             f"{vb.shape[0]})")
        if tuple(kb.shape) != tuple(vb.shape):
            raise ValueError(f"k and v must have the same shape (got {tuple(k.shape)} and {tuple(v.shape)})")
        if heads % kv_heads:
            raise ValueError(f"query heads ({heads}) must be a multiple of kv heads ({kv_heads}) for GQA/MQA")
        if heads > MAX_GRID_YZ or batch > MAX_GRID_YZ:
            raise ValueError(f"heads ({heads}) and batch ({batch}) must be at most {MAX_GRID_YZ} (grid y/z limit)")
        cfg = launch_config(self.plan, batch, heads, seqlen_q, self._sm_count(q))
        if cfg.grid[0] > MAX_GRID_X:
            raise ValueError(f"seqlen_q {seqlen_q} needs more than {MAX_GRID_X} blocks")
        mask = self._check_mask(causal)
        variant = self._mask_variant(mask, causal, alignment)
        extra_params = variant.abi_values(alignment, seqlen_q, seqlen_k)
        scale = self._check_scale(scale)

        out, ob = self._output(out, q, layout)
        if lse_out is not None:
            self._check_lse(lse_out, (batch, heads, seqlen_q))
            return_lse = True
        elif return_lse:
            lse_out = torch.empty((batch, heads, seqlen_q), dtype=torch.float32, device=q.device)

        if self.plan.tensor_maps:
            extra_params.update(self._maps().fields({"q": qb, "k": kb, "v": vb, "o": ob}))
        params = pack_params(self.plan, q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=out.data_ptr(),
                             lse=lse_out.data_ptr() if return_lse else 0,
                             strides={"q": qb, "k": kb, "v": vb, "o": ob},
                             batch=batch, heads=heads, kv_heads=kv_heads, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
                             lse_batch_stride=heads * seqlen_q, lse_head_stride=seqlen_q,
                             scale_log2=float(scale) * LOG2E, **extra_params)
        self._launch(mask, params, cfg)
        return (out, lse_out) if return_lse else out

    # -- checks ------------------------------------------------------------------------------
    def _views(self, layout: str, **tensors) -> tuple:
        """The (B, H, S, D) views of the named input tensors given in `layout`, each checked."""
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)} (got {layout!r})")
        return self._checked(layout, tensors)

    def _checked(self, layout: str, tensors: dict) -> tuple:
        """Each named tensor checked for `layout` (one of LAYOUTS, or PACKED for varlen calls); their views."""
        for name, t in tensors.items():
            self._check_tensor(name, t, layout)
        return tuple(to_bhsd(t, layout) for t in tensors.values())

    def _check_mask(self, causal: bool) -> str:
        """The mask variant a call asks for, refused when the spec does not emit it."""
        mask = "causal" if causal else "none"
        if mask not in self.entry:
            raise ValueError(f"{self.label} has no {'causal' if causal else 'non-causal'} variant (its spec lists "
                             f"masks {list(self.masks)}); add {mask!r} to the spec's masks")
        return mask

    def _mask_variant(self, mask: str, causal: bool, alignment: str | None):
        """The variant of a call's mask; an alignment is refused without causal (the variant checks its value)."""
        variant = next(m for m in self.plan.mask_variants if m.name == mask)
        if alignment is not None and not causal:
            raise ValueError(f"alignment={alignment!r} applies to causal=True only")
        return variant

    def _output(self, out, q, layout: str) -> tuple:
        """(out, its (B, H, S, D) view): a new tensor like q, or the caller's, checked against q."""
        import torch
        if out is None:
            out = torch.empty_like(q, memory_format=torch.preserve_format)
        else:
            self._check_tensor("out", out, layout)
            if tuple(out.shape) != tuple(q.shape):
                raise ValueError(f"out must have q's shape {tuple(q.shape)} (got {tuple(out.shape)})")
        return out, to_bhsd(out, layout)

    def _check_scale(self, scale) -> float:
        """The softmax scale of a call: 1/sqrt(head_dim) when None, else a positive finite number."""
        if scale is None:
            return default_scale(self.plan.head_dim)
        if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
            raise TypeError(f"scale must be a positive number (got {type(scale).__name__})")
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"scale must be positive and finite (got {scale})")
        return float(scale)

    def _sm_count(self, tensor) -> int | None:
        """Streaming multiprocessors of the tensor's GPU (persistent plans launch one block per SM)."""
        if not self.plan.persistent:
            return None
        torch, _drv, _ctx = gpu_modules()
        return torch.cuda.get_device_properties(tensor.device).multi_processor_count

    def _check_tensor(self, name: str, t, layout: str) -> None:
        import torch
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor (got {type(t).__name__})")
        dims, ndim = {"bhsd": ("(batch, heads, seq, head_dim)", 4), "bshd": ("(batch, seq, heads, head_dim)", 4),
                      PACKED: ("(total_rows, heads, head_dim)", 3)}[layout]
        if t.dim() != ndim:
            what = "packed sequences" if layout == PACKED else f"layout {layout!r}"
            raise ValueError(f"{name} must be {ndim}-D {dims} for {what} (got shape {tuple(t.shape)})")
        if not t.is_cuda:
            raise ValueError(f"{name} is on {t.device}; the kernel needs CUDA tensors (e.g. {name}.cuda())")
        if t.device != self.device:
            raise ValueError(f"{name} is on {t.device} but the kernel was loaded for {self.device}")
        if t.dtype != self.dtype:
            raise TypeError(f"{name} is {t.dtype} but {self.label} takes {self.dtype} (spec dtype "
                            f"{self.plan.spec.dtype})")
        if t.numel() == 0:
            raise ValueError(f"{name} is empty (shape {tuple(t.shape)}): every dimension must be at least 1")
        if t.shape[-1] != self.plan.head_dim:
            raise ValueError(f"{name} has head_dim {t.shape[-1]} but {self.label} is generated for head_dim "
                             f"{self.plan.head_dim}")
        if t.stride(-1) != 1:
            raise ValueError(f"{name}'s last dimension must be contiguous (stride 1, got {t.stride(-1)}); "
                             f"pass {name}.contiguous()")
        unit = LOAD_BYTES // ELEM_BYTES
        for d in range(ndim - 1):
            # A dimension of size 1 is only ever indexed at 0, so its stride does not matter.
            if t.shape[d] > 1 and t.stride(d) % unit:
                raise ValueError(f"{name}'s strides {tuple(t.stride())} must be multiples of {unit} elements "
                                 f"({LOAD_BYTES}-byte rows for vector loads); pass {name}.contiguous()")
        if t.data_ptr() % LOAD_BYTES:
            raise ValueError(f"{name}'s data pointer is not {LOAD_BYTES}-byte aligned (offset view?); "
                             f"pass {name}.clone()")

    def _check_lse(self, lse, shape: tuple[int, int, int]) -> None:
        import torch
        if not isinstance(lse, torch.Tensor):
            raise TypeError(f"lse_out must be a torch.Tensor (got {type(lse).__name__})")
        if lse.dtype != torch.float32 or tuple(lse.shape) != shape or not lse.is_contiguous():
            raise ValueError(f"lse_out must be a contiguous float32 tensor of shape {shape} (got "
                             f"{lse.dtype}, {tuple(lse.shape)}, strides {tuple(lse.stride())})")
        if lse.device != self.device:
            raise ValueError(f"lse_out is on {lse.device} but the kernel was loaded for {self.device}")

    # -- launch ------------------------------------------------------------------------------
    def _launch(self, mask: str, params: bytes, cfg: LaunchConfig) -> None:
        self._launch_function(self.entry[mask], params, cfg)

    def _launch_function(self, name: str, params: bytes, cfg: LaunchConfig) -> None:
        """Launch kernel function `name` (of any part) with the packed Params on torch's current stream."""
        import torch
        from pycuda import driver as drv
        gap, fn = self.functions[name]
        params = bytes(gap) + params
        current = torch.cuda.current_stream(self.device)
        where = f"{name} (grid={cfg.grid}, block={cfg.block}, dynamic smem={cfg.smem_dynamic} B)"
        try:
            if current.cuda_stream == 0:
                fn.prepared_async_call(cfg.grid, cfg.block, None, params, shared_size=cfg.smem_dynamic)
            else:
                side, side_torch = self._side_stream()
                if side_torch is None:
                    # No stream handle from this pycuda: fall back to full synchronization.
                    current.synchronize()
                    fn.prepared_async_call(cfg.grid, cfg.block, None, params, shared_size=cfg.smem_dynamic)
                    drv.Context.synchronize()
                else:
                    side_torch.wait_stream(current)
                    fn.prepared_async_call(cfg.grid, cfg.block, side, params, shared_size=cfg.smem_dynamic)
                    current.wait_stream(side_torch)
        except drv.Error as exc:
            raise LaunchError(f"launch of {where} failed: {exc}") from exc
        if self.synchronize:
            try:
                current.synchronize()
            except RuntimeError as exc:
                raise LaunchError(f"{where} failed while running: {exc}") from exc

    def _maps(self):
        if self._tensor_maps is None:
            from .tma import TensorMapCache
            self._tensor_maps = TensorMapCache(self.plan.tensor_maps)
        return self._tensor_maps

    def _side_stream(self):
        if self._side is None:
            import torch
            from pycuda import driver as drv
            side = drv.Stream()
            handle = getattr(side, "handle", None)
            self._side = (side, torch.cuda.ExternalStream(handle, device=self.device) if handle else None)
        return self._side


def _configure(drv, device, plan: Plan, fn, name: str, threads: int) -> None:
    """Opt the function into its dynamic shared memory and check it can run `threads` per block."""
    if plan.smem_dynamic:
        limit = device.get_attribute(drv.device_attribute.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        if plan.smem_bytes > limit:
            raise ToolError(f"{name} needs {plan.smem_bytes} B of shared memory per block; {device.name()} "
                            f"allows at most {limit} B")
        fn.set_attribute(drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, plan.smem_bytes)
    max_threads = fn.get_attribute(drv.function_attribute.MAX_THREADS_PER_BLOCK)
    if max_threads < threads:
        regs = fn.get_attribute(drv.function_attribute.NUM_REGS)
        raise ToolError(f"{name} can run at most {max_threads} threads per block ({regs} registers per thread) "
                        f"but the plan launches {threads}")


__all__ = ["Kernel", "LaunchConfig", "LaunchError", "default_scale",
           "launch_config", "load", "pack_params", "render_bundle", "render_for", "to_bhsd"]
