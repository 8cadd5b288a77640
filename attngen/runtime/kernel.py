"""A compiled spec on the GPU: its bundle's cubins loaded, its functions ready on every device a
call uses, the checks every call convention shares, and the launch.

The CUDA source comes from the renderer, or for a shipped spec from its committed generated/<name>.cu
when that is provably the same bytes (attngen.shipped); it is compiled for the GPU torch is using and loaded as a context-independent library
(attngen.runtime.driver says why), so one Kernel runs on any GPU of the same arch, from any thread.

Host work happens at load: the Params layout becomes one precompiled struct per call convention
(core.abi.Packer), function handles and per-device attributes are read once. A call checks its
tensors, packs the fields that change, makes the device's primary context current if the thread
has another (or none), and launches on torch's current stream: a user's stream, or a CUDA graph
being captured, orders the kernel like any torch op. Nothing in a default call waits for the GPU.

The call conventions (forward, varlen, decode) live in attngen/runtime/calls/; this module names
none of them.
"""
from __future__ import annotations

import contextlib
import math
import numbers
import os
import sys
import threading
from ctypes import c_void_p, memmove
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from ..compile import compile_source
from ..core.launch_rules import launches_awaiting_twin
from ..core.variants import call_mask, check_window, score_values
from ..core.varlen_plan import is_varlen, mask_of, varlen_key
from ..cubin import param_layout
from ..errors import SpecError, ToolError
from ..shipped import committed_launch, committed_sources
from . import driver
from .gpu import device_info, gpu_modules

if TYPE_CHECKING:
    from ..core.launch_plan import LaunchPlan
    from ..plan import Plan

LAYOUTS = ("bhsd", "bshd")          # bhsd: (batch, heads, seq, dim) as torch SDPA; bshd: (batch, seq, heads, dim)
VARLEN_LAYOUT = "thd"               # varlen calls: (total_rows, heads, dim), sequences back to back
LOAD_BYTES = 16                     # the kernels read and write rows in 16-byte vectors
MAX_GRID_YZ = 65535                 # CUDA limit of gridDim.y and gridDim.z (heads, batch)
MAX_GRID_X = 2**31 - 1
TORCH_DTYPE_NAMES = {"fp16": "float16", "bf16": "bfloat16", "e4m3": "float8_e4m3fn"}
SYNC_ENV = "ATTNGEN_SYNC"           # "1": synchronize after every launch, so asynchronous faults name the kernel
DIMS = {"bhsd": ("(batch, heads, seq, head_dim)", 4), "bshd": ("(batch, seq, heads, head_dim)", 4),
        VARLEN_LAYOUT: ("(total_rows, heads, head_dim)", 3)}


class LaunchError(RuntimeError):
    """CUDA refused or aborted a kernel launch; the message names the kernel and launch config."""


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)


def to_bhsd(t, layout: str):
    """A (batch, heads, seq, dim) view of a tensor given in `layout` (no copy); varlen tensors
    (total_rows, heads, dim) have no batch dimension and come back as they are."""
    return t if layout in ("bhsd", VARLEN_LAYOUT) else t.permute(0, 2, 1, 3)


def bundle_of(spec_or_path) -> tuple[Plan, tuple[str, ...], str]:
    """(plan, CUDA source of every part, label) for a spec path, Spec or Plan: a shipped spec's
    committed files when they are provably current (committed_bundle), else rendered
    (attngen.render.render_bundle), with the same bytes either way."""
    if isinstance(spec_or_path, (str, os.PathLike)):
        committed = committed_bundle(spec_or_path)
        if committed is not None:
            return committed
    # The renderer (Jinja2, the templates) loads only when a source must be rendered: a served
    # spec's first call reads its committed files and never needs it.
    from ..render import render_bundle
    return render_bundle(spec_or_path)


def launch_bundle(spec_path) -> tuple[Plan | LaunchPlan, tuple[str, ...], str]:
    """What the dispatcher loads a served spec from: its launch record (a LaunchPlan) and committed
    sources when they are provably current (attngen.shipped.committed_launch), read without the spec
    parser, the planner or the renderer; else bundle_of's full plan. A Kernel calls either alike."""
    launch = committed_launch(spec_path)
    if launch is None:
        return bundle_of(spec_path)
    plan, sources, spec_file = launch
    return plan, sources, shown_path(spec_file)


def committed_bundle(path) -> tuple[Plan, tuple[str, ...], str] | None:
    """(plan, committed source of every part, label) of a shipped spec whose generated files are what
    rendering would give now (attngen.shipped.committed_sources says how that is known), without
    loading the renderer; None otherwise, and for a spec the planner refuses (rendering reports it
    with its line)."""
    # The spec parser and the planner (pydantic, the YAML loader) load only here: a served spec
    # with a current launch record never needs them (launch_bundle).
    from ..core.spec_cells import cell_at
    from ..plan import make_plan
    from ..spec import parse_cell
    try:
        cell = cell_at(path)
        shown = shown_path(cell.file)
        plan = make_plan(parse_cell(cell, shown), file=shown)
    except SpecError:
        return None
    sources = committed_sources(plan, cell.address, cell.text)
    return None if sources is None else (plan, sources, shown)


def shown_path(path) -> str:
    """The spec path as messages name it, as attngen.render.display_path writes it (relative to the
    working directory when inside it), without importing the renderer and Jinja2."""
    p = Path(path)
    try:
        return p.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return p.as_posix()


PREPARED_ENTRIES = 512               # prepared calls a kernel keeps (one per shape, strides and options)


class Prepared(NamedTuple):
    """Everything about a call that one shape (and its strides, dtypes, device and options)
    decides, worked out by the first such call: later calls of that shape check their pointers,
    patch them into the template and launch."""

    # A NamedTuple, not a frozen dataclass: a first call defines this class (core.frozen says why).
    info: object                # DeviceInfo of the GPU
    launches: tuple             # (Function, CUfunction on this device, grid) in launch order; all read one Params
    template: bytes             # the Params, pointers included (each call patches its own)
    patch: object               # core.abi.Patch of the per-call pointer fields
    extra: tuple = ()           # the convention's own per-shape numbers (lse and workspace shapes)


class Function(NamedTuple):
    """One kernel function of a loaded bundle."""

    # A NamedTuple, not a frozen dataclass: a first call defines this class (core.frozen says why).
    name: str
    handle: int                 # CUkernel: launches in the current context, on any device
    threads: int                # per block (its part's)
    smem_dynamic: int           # bytes of dynamic shared memory it is launched with (0: static)
    programmatic: bool = False  # launched as a programmatic dependent of the kernel ahead of it (its
                                # part awaits_predecessor, on a GPU of sm_90 or later)


def _compile_notice(label: str, part: str, number: int, parts: int):
    """The default on_compile of a bundle's part: one line on stderr, naming the part where the bundle has
    several (a backward spec compiles three: one line each, not three compiles of one)."""
    what = label if parts == 1 else f"{label} ({part}, part {number} of {parts})"

    def notice(arch):
        print(f"compiling {what} for {arch} ...", file=sys.stderr, flush=True)
    return notice


class Kernel:
    """One compiled spec: every function of its bundle, callable on torch tensors by its call
    convention (attngen/runtime/calls: the class `load` returns is the convention's)."""

    def __init__(self, plan: Plan, sources: tuple[str, ...], *, label: str, compiled: tuple, libraries: tuple,
                 functions: dict, device, synchronize: bool):
        import torch
        self.plan = plan
        self.sources = sources              # one CUDA source per part of the plan's bundle
        self.label = label
        self.compiled = compiled            # attngen.compile.CompileResult per part
        self.arch = compiled[0].arch
        self.libraries = libraries          # CUlibrary per part
        self.functions = functions          # function name -> Function, every part's
        self.entry = plan.entry_functions   # function key -> the function a call launches
        self.awaiting_entry = plan.awaiting_entry_functions   # function key -> its awaiting twin (short calls)
        self.device = device                # torch.device it was loaded for (verify and bench allocate there)
        self.synchronize = synchronize
        self.dtype = getattr(torch, TORCH_DTYPE_NAMES[plan.spec.dtype])
        self._torch = torch
        self._tensor_type = torch.Tensor
        self._ready: dict[int, object] = {}   # device index -> DeviceInfo, once its functions are set up there
        self._handles: dict[int, dict] = {}   # device index -> function name -> CUfunction there
        self._ready_lock = threading.Lock()
        self._launch_kernel, self._get_context = driver.raw_calls()
        self._streams: dict = {}            # raw stream handle -> c_void_p (the raw launch converts nothing)
        self._raw_stream = torch._C._cuda_getCurrentRawStream
        self._prepared: dict = {}           # call key -> Prepared (see the conventions' fast paths)
        self._launcher = None               # another launcher of the same Params (verify's PyCUDA one), or None
        self._setup()

    def _setup(self) -> None:
        """The call convention's load-time work (its Packer, its fixed fields)."""

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
        """Compile and load one source per part of the plan's bundle, as this call convention's
        Kernel (attngen.runtime.calls.kernel_class(plan) is the plan's)."""
        if cls is Kernel:
            raise TypeError("Kernel is the base of the call conventions: load through attngen.runtime.load, or "
                            "attngen.runtime.kernel_class(plan).from_sources")
        torch, _ = gpu_modules()
        index = torch.cuda.current_device()
        info = device_info(index)
        if plan.arch_suffix and info.arch != plan.target.arch:
            raise ToolError(f"{plan.spec.name} needs an {plan.target.arch}{plan.arch_suffix} GPU ({plan.target.name}); "
                            f"this one is {info.arch}")
        arch = plan.compile_arch(info.arch)   # e.g. sm_90a for wgmma / setmaxnreg
        label = label or plan.spec.name
        sources = tuple(sources)
        if len(sources) != len(plan.parts):
            raise ValueError(f"{label}: {len(sources)} source(s) for {len(plan.parts)} part(s)")
        if plan.abi.size > driver.PARAMS_MAX:
            raise ToolError(f"{label}: Params of {plan.abi.size} B exceed CUDA's {driver.PARAMS_MAX} B of kernel "
                            f"parameters")
        compiled, libraries, functions = [], [], {}
        for number, (part, source) in enumerate(zip(plan.parts, sources), 1):
            notice = on_compile or _compile_notice(label, part.name, number, len(plan.parts))
            result = compile_source(source, arch, on_compile=notice)
            layout = param_layout(result.cubin)
            try:
                library = driver.load_library(result.cubin)
            except driver.DriverError as exc:
                raise ToolError(f"cannot load the {arch} cubin of {label} ({part.name}): {exc}") from exc
            twins = {name for _key, name in part.awaiting_twins}
            for _key, name in part.functions + part.awaiting_twins:
                try:
                    handle = driver.library_kernel(library, name)
                except driver.DriverError as exc:
                    raise ToolError(f"{label}: the cubin has no kernel {name} ({exc})") from exc
                # A 64-byte aligned Params starts past a gap in the parameter buffer (the cubin says
                # where); the driver places it there itself, but the size must be Params'.
                gap, size = layout.get(name, (None, None))
                if gap is None or (size >= 0 and gap + plan.abi.size != size):
                    raise ToolError(f"{label}: the cubin's parameter layout of {name} (offset {gap}, buffer {size} B) "
                                    f"does not match Params ({plan.abi.size} B)")
                functions[name] = Function(name, handle, part.threads or plan.threads,
                                           plan.smem_bytes if plan.smem_dynamic and part is plan.parts[0] else 0,
                                           part.awaits_predecessor or name in twins)
            compiled.append(result)
            libraries.append(library)
        if synchronize is None:
            synchronize = os.environ.get(SYNC_ENV, "") == "1"
        kernel = cls(plan, sources, label=label, compiled=tuple(compiled), libraries=tuple(libraries),
                     functions=functions, device=torch.device("cuda", index), synchronize=synchronize)
        kernel._device(index)   # set up on the loading GPU now: a plan the GPU cannot run fails at load
        return kernel

    # -- public ------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.plan.spec.name

    def __repr__(self) -> str:
        return (f"<attngen.{type(self).__name__} {self.label} {self.plan.spec.dtype} head_dim={self.plan.head_dim} "
                f"{self.arch}>")

    @contextlib.contextmanager
    def launching_through(self, launcher):
        """Within the block, calls launch through `launcher.launch(kernel, prepared, params)` with
        the Params bytes this runtime packed (verify's PyCUDA launcher), not through the driver
        calls below. For one thread's use: the kernel is not shared while it is set."""
        previous, self._launcher = self._launcher, launcher
        try:
            yield self
        finally:
            self._launcher = previous

    # -- per device --------------------------------------------------------------------------
    def _device(self, index: int):
        """The DeviceInfo of cuda:`index` once every function is set up there (dynamic shared
        memory opted in, threads per block checked); from any thread, once per device."""
        info = self._ready.get(index)
        if info is not None:
            return info
        with self._ready_lock:
            info = self._ready.get(index)
            if info is None:
                info = device_info(index)
                if info.arch.rstrip("a") != self.arch.rstrip("a"):
                    raise ValueError(f"{self.label} is compiled for {self.arch}; cuda:{index} is {info.arch}. Load the "
                                     f"spec with cuda:{index} current (torch.cuda.set_device({index})) for a kernel "
                                     f"of that GPU")
                for fn in self.functions.values():
                    self._configure(fn, info)
                # The library's kernels resolved to this device's functions once: a launch of a
                # CUfunction skips the per-launch lookup a CUkernel needs.
                with driver.context_current(info.context):
                    self._handles[index] = {name: driver.kernel_function(fn.handle)
                                            for name, fn in self.functions.items()}
                self._ready[index] = info
        return info

    def _configure(self, fn: Function, info) -> None:
        """Opt the function into its dynamic shared memory on a device and check it can run its threads."""
        if fn.smem_dynamic:
            if fn.smem_dynamic > info.smem_optin:
                raise ToolError(f"{fn.name} needs {fn.smem_dynamic} B of shared memory per block; cuda:{info.index} "
                                f"allows at most {info.smem_optin} B")
            driver.set_kernel_attribute(fn.handle, driver.ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES, fn.smem_dynamic,
                                        info.handle)
        max_threads = driver.kernel_attribute(fn.handle, driver.ATTR_MAX_THREADS_PER_BLOCK, info.handle)
        if max_threads < fn.threads:
            regs = driver.kernel_attribute(fn.handle, driver.ATTR_NUM_REGS, info.handle)
            raise ToolError(f"{fn.name} can run at most {max_threads} threads per block ({regs} registers per "
                            f"thread) but the plan launches {fn.threads}")

    # -- checks every convention shares ---------------------------------------------------------
    def _check_tensor(self, name: str, t, layout: str, index: int, v_dim: bool = False, dtype=None):
        """The tensor's shape, checked for `layout` (one of LAYOUTS, or VARLEN_LAYOUT) on cuda:`index`:
        dtype (the spec's, or `dtype`: an output's), rank, device, head dim (v_dim: V's and O's), a
        contiguous last dimension, 16-byte rows and pointer."""
        if not isinstance(t, self._tensor_type):
            raise TypeError(f"{name} must be a torch.Tensor (got {type(t).__name__})")
        shape = t.shape
        dims, ndim = DIMS[layout]
        if len(shape) != ndim:
            what = "varlen sequences" if layout == VARLEN_LAYOUT else f"layout {layout!r}"
            raise ValueError(f"{name} must be {ndim}-D {dims} for {what} (got shape {tuple(shape)})")
        where = t.get_device()
        if where != index:
            if where < 0:
                raise ValueError(f"{name} is on {t.device}; the kernel needs CUDA tensors (e.g. {name}.cuda())")
            raise ValueError(f"{name} is on {t.device} but q is on cuda:{index}: every tensor of a call must be on "
                             f"one GPU")
        if dtype is not None:
            if t.dtype is not dtype:
                raise TypeError(f"{name} is {t.dtype} but {self.label} writes {dtype}")
        elif t.dtype is not self.dtype:
            raise TypeError(f"{name} is {t.dtype} but {self.label} takes {self.dtype} (spec dtype "
                            f"{self.plan.spec.dtype})")
        want = self.plan.v_dim if v_dim else self.plan.head_dim
        if shape[-1] != want:
            which = "head_dim_v" if v_dim and self.plan.v_dim != self.plan.head_dim else "head_dim"
            raise ValueError(f"{name} has head_dim {shape[-1]} but {self.label} is generated for {which} {want}")
        stride = t.stride()
        if stride[-1] != 1:
            raise ValueError(f"{name}'s last dimension must be contiguous (stride 1, got {stride[-1]}); "
                             f"pass {name}.contiguous()")
        unit = LOAD_BYTES // t.element_size()
        for d in range(ndim - 1):
            # A dimension of size 1 is only ever indexed at 0, so its stride does not matter.
            if shape[d] > 1 and stride[d] % unit:
                raise ValueError(f"{name}'s strides {tuple(stride)} must be multiples of {unit} elements "
                                 f"({LOAD_BYTES}-byte rows for vector loads); pass {name}.contiguous()")
        if t.data_ptr() % LOAD_BYTES:
            raise ValueError(f"{name}'s data pointer is not {LOAD_BYTES}-byte aligned (offset view?); "
                             f"pass {name}.clone()")
        return shape

    def _padded_inputs(self, layout: str, names: tuple[str, str, str], q, k, v):
        """(device index, q's shape, k's shape, v's shape) of a call on (B, H, S, D) or (B, S, H,
        D) tensors, each checked; a ValueError for another layout."""
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)} (got {layout!r})")
        index = self._device_index(q)
        return (index, self._check_tensor(names[0], q, layout, index), self._check_tensor(names[1], k, layout, index),
                self._check_tensor(names[2], v, layout, index, v_dim=True))

    def _check_heads(self, heads: int, kv_heads: int, /, **grid_dims: int) -> None:
        """Query heads a positive multiple of kv heads (GQA/MQA), and each named dimension the grid
        spans in y or z within CUDA's limit."""
        if not heads or not kv_heads or heads % kv_heads:
            raise ValueError(f"query heads ({heads}) must be a positive multiple of kv heads ({kv_heads}) for GQA/MQA")
        if any(n > MAX_GRID_YZ for n in grid_dims.values()):
            named = " and ".join(f"{name} ({n})" for name, n in grid_dims.items())
            raise ValueError(f"{named} must be at most {MAX_GRID_YZ} (grid y/z limit)")

    def _lse_output(self, lse_out, return_lse: bool, shape: tuple, index: int):
        """(lse, return_lse) of a call: the caller's lse_out, checked (it implies return_lse), a new fp32
        tensor of `shape` when return_lse, else None."""
        if lse_out is not None:
            self._check_lse(lse_out, shape, index)
            return lse_out, True
        if return_lse:
            torch = self._torch
            return torch.empty(shape, dtype=torch.float32, device=torch.device("cuda", index)), True
        return None, False

    def _without_launch(self, out, lse, return_lse: bool, batch: int, seqlen_q: int, seqlen_k: int):
        """The result of a padded call with nothing to compute (no query rows, or no keys: zeros and
        LSE -inf), else None."""
        if batch and seqlen_q and seqlen_k:
            return None
        if batch and seqlen_q:
            return self._no_keys(out, lse, return_lse)
        return (out, lse) if return_lse else out

    @staticmethod
    def _no_keys(out, lse, return_lse: bool):
        """FlashAttention's answer where no key exists: zeros and LSE -inf."""
        out.zero_()
        if return_lse:
            lse.fill_(float("-inf"))
        return (out, lse) if return_lse else out

    def _device_index(self, q, name: str = "q") -> int:
        """The GPU a call runs on: q's (the tensor called `name` in messages)."""
        if not isinstance(q, self._tensor_type):
            raise TypeError(f"{name} must be a torch.Tensor (got {type(q).__name__})")
        index = q.get_device()
        if index < 0:
            raise ValueError(f"{name} is on {q.device}; the kernel needs CUDA tensors (e.g. {name}.cuda())")
        return index

    def _check_mask(self, causal: bool, window=None, varlen: bool = False) -> str:
        """The mask variant a call asks for, refused when the spec does not emit it: window when the
        call's window bounds a side (causal bounds its right side at 0), else causal or none. A varlen
        call asks for the mask's varlen function, a padded call for its own."""
        mask = call_mask(causal, window, self.masks)
        if (varlen_key(mask) if varlen else mask) in self.entry:
            return mask
        if not varlen and varlen_key(mask) in self.entry:
            raise ValueError(f"{self.label} has varlen functions only (its spec sets varlen: only): call "
                             f"kernel.varlen(...), or set varlen: true in the spec for padded calls too")
        raise ValueError(f"{self.label} has no {'non-causal' if mask == 'none' else mask} variant (its spec lists "
                         f"masks {list(self.masks)}); add {mask!r} to the spec's masks")

    @property
    def varlen_masks(self) -> tuple[str, ...]:
        """The masks of the varlen call (kernel.varlen(...)); empty unless the spec sets varlen."""
        return tuple(mask_of(key) for key in self.entry if is_varlen(key))

    @property
    def masks(self) -> tuple[str, ...]:
        """The masks of the call: the spec's (a mask's varlen or merging function serves that mask)."""
        return self.plan.masks

    def _mask_variant(self, mask: str, causal: bool, alignment: str | None):
        """The variant of a call's mask; an alignment is refused without causal or a window (the variant
        checks its value)."""
        variant = next(m for m in self.plan.mask_variants if m.name == mask)
        if alignment is not None and not (causal or variant.takes_window):
            raise ValueError(f"alignment={alignment!r} applies to causal=True or a window only")
        return variant

    def _variant_values(self, mask: str, causal: bool, alignment, window, seqlen_q: int, seqlen_k: int,
                        scale: float, scores: dict, context: dict) -> dict:
        """The Params values of a call's mask (its alignment and window) and of the spec's score
        modifiers (`scores`: call keyword -> value; `context`: batch, heads, device). A score modifier
        may set scale_log2 (softcap folds the scale into its multiply)."""
        variant = self._mask_variant(mask, causal, alignment)
        if variant.takes_window:
            left, right = check_window(window)
            window = (left, 0 if causal else right)
        values = variant.abi_values(alignment, seqlen_q, seqlen_k, window)
        values.update(score_values(self.plan.score_variants, scores, scale, context))
        return values

    def _new_output(self, q):
        """A new output for q: like q (its strides too), or, where V's head dim differs, q's shape
        with head_dim_v columns (contiguous)."""
        if self.plan.v_dim == self.plan.head_dim:
            return self._torch.empty_like(q)
        return q.new_empty(q.shape[:-1] + (self.plan.v_dim,))

    def _output(self, out, q, layout: str, index: int):
        """out: a new tensor for q (_new_output), or the caller's, checked against q."""
        if out is None:
            return self._new_output(q)
        self._check_tensor("out", out, layout, index, v_dim=True)
        want = tuple(q.shape[:-1]) + (self.plan.v_dim,)
        if tuple(out.shape) != want:
            what = "q's shape" if self.plan.v_dim == self.plan.head_dim else "q's shape with head_dim_v columns"
            raise ValueError(f"out must have {what} {want} (got {tuple(out.shape)})")
        return out

    def _check_scale(self, scale) -> float:
        """The softmax scale of a call: 1/sqrt(head_dim) when None, else a positive finite number."""
        if scale is None:
            return self._default_scale
        if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
            raise TypeError(f"scale must be a positive number (got {type(scale).__name__})")
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"scale must be positive and finite (got {scale})")
        return float(scale)

    @property
    def _default_scale(self) -> float:
        return default_scale(self.plan.head_dim)

    def _check_lse(self, lse, shape: tuple, index: int, name: str = "lse_out", hint: str = "") -> None:
        """An LSE tensor of a call (`name`: its argument; `hint`: where a right one comes from)."""
        torch = self._torch
        if not isinstance(lse, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor (got {type(lse).__name__})")
        if lse.dtype != torch.float32 or tuple(lse.shape) != shape or not lse.is_contiguous():
            raise ValueError(f"{name} must be a contiguous float32 tensor of shape {shape} (got "
                             f"{lse.dtype}, {tuple(lse.shape)}, strides {tuple(lse.stride())}){hint}")
        if lse.get_device() != index:
            raise ValueError(f"{name} is on {lse.device} but q is on cuda:{index}")

    # -- launch ------------------------------------------------------------------------------
    def _launches(self, info, *named) -> tuple:
        """(Function, its CUfunction on the device of `info`, grid) for each (function name, grid)."""
        handles = self._handles[info.index]
        early = driver.programmatic_launches(info.arch)
        launches = []
        for name, grid in named:
            fn = self.functions[name]
            if fn.programmatic and not early:
                fn = fn._replace(programmatic=False)   # before sm_90: launched after the kernel ahead ends
            launches.append((fn, c_void_p(handles[name]), grid))
        return tuple(launches)

    def _forward_entry(self, mask: str, batch: int, heads: int, seqlen_q: int, seqlen_k: int) -> str:
        """The function a forward call of this shape launches: the mask's awaiting twin where the plan
        has one and the call is short (core.launch_rules.launches_awaiting_twin), else the mask's entry
        point."""
        twin = self.awaiting_entry.get(mask)
        if twin is not None and launches_awaiting_twin(batch, heads, seqlen_q, seqlen_k, mask == "causal"):
            return twin
        return self.entry[mask]

    def _remember(self, key, prepared: Prepared) -> None:
        """Keep a prepared call for later calls of the same key (at most PREPARED_ENTRIES)."""
        if key is None:
            return
        if len(self._prepared) >= PREPARED_ENTRIES:
            self._prepared.clear()
        self._prepared[key] = prepared

    def native_program(self, prepared: Prepared, pointer_names: tuple, maps: tuple = (), map_pointers: tuple = ()):
        """`prepared` as the native step's Program takes it (attngen/runtime/native/train_step.cpp):
        (Params template, the byte offset of each of `pointer_names`' fields in the Params (-1: this
        plan omits it), the tensor-map fields' offsets, the pointer each map maps, the maps (encoded
        for this shape at any aligned pointers: only their address changes), 7 ints per launch, the
        launches' names); None where this kernel launches through another launcher or synchronizes."""
        if self._launcher is not None or self.synchronize:
            return None
        torch = self._torch
        rows = {f.name: (offset, f.size) for f, offset in self.plan.abi.rows()}
        fields = [rows.get(n) for n in pointer_names]
        if any(f is not None and f[1] != 8 for f in fields):
            return None
        launches, names = [], []
        for fn, handle, grid in prepared.launches:
            launches += [handle.value, *grid, fn.threads, fn.smem_dynamic, int(fn.programmatic)]
            names.append(fn.name)
        return (torch.frombuffer(bytearray(prepared.template), dtype=torch.uint8),
                [-1 if f is None else f[0] for f in fields],
                [rows[m.abi_field][0] for m in self.plan.tensor_maps][:len(maps)], list(map_pointers),
                torch.frombuffer(bytearray(b"".join(maps)), dtype=torch.uint8) if maps else
                torch.empty(0, dtype=torch.uint8), launches, names)

    def _run(self, prepared: Prepared, pointers) -> None:
        """Launch a prepared call with this call's `pointers` (in its patch's order) on torch's
        current stream of its device, with that device's primary context current."""
        template = prepared.template
        state = driver.thread_state()
        memmove(state.address, template, len(template))
        prepared.patch.pack_into(state.raw, state.offset, pointers)
        info = prepared.info
        if self._launcher is not None:
            self._launcher.launch(self, prepared, state.raw[state.offset:state.offset + len(template)])
            return
        raw = self._raw_stream(info.index)
        stream = self._streams.get(raw)
        if stream is None:
            if len(self._streams) >= 1024:
                self._streams.clear()
            stream = self._streams[raw] = c_void_p(raw)
        if self._get_context(state.ctx_ref):
            driver.current_context()      # raises with the driver's message
        ctx = state.ctx.value
        if ctx != info.context:
            # This thread has no context current (a worker, an autograd thread) or another GPU's:
            # launch in this GPU's primary context, then give the thread back the one it had.
            driver.set_current_context(info.context)
        try:
            for fn, handle, grid in prepared.launches:
                if fn.programmatic:   # it may start while the kernel ahead still runs, and waits for it itself
                    rc = state.launch_programmatic(handle, grid, fn.threads, fn.smem_dynamic, stream)
                else:
                    rc = self._launch_kernel(handle, grid[0], grid[1], grid[2], fn.threads, 1, 1, fn.smem_dynamic,
                                             stream, state.params, None)
                if rc:
                    name, text = driver.error_text(rc)
                    raise LaunchError(f"launch of {fn.name} (grid={grid}, block=({fn.threads}, 1, 1), dynamic smem="
                                      f"{fn.smem_dynamic} B) failed: {name}: {text}")
        finally:
            if ctx != info.context:
                driver.set_current_context(ctx)
        # synchronize is a debugging aid; a stream being captured into a graph may not be synchronized.
        if self.synchronize and not self._torch.cuda.is_current_stream_capturing():
            try:
                self._torch.cuda.current_stream(info.index).synchronize()
            except RuntimeError as exc:
                raise LaunchError(f"{prepared.launches[0][0].name} failed while running: {exc}") from exc


__all__ = ["Function", "Kernel", "LaunchError", "Prepared", "bundle_of", "committed_bundle", "default_scale",
           "launch_bundle", "to_bhsd"]
