"""The attention-forward plan every forward kind builds on: Q tile, K/V ring, copies, warp roles,
mbarriers, the Params ABI and the kernel functions. A kind adds its own regions, its typed
fragment numbers and its bank patterns; this module knows no kind."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from ..errors import SpecError
from ..targets import TARGETS, Target
from .abi import Abi, float32, float_pointer, int32, int64, pointer
from .constants import LN2, LOG2E    # noqa: F401  (still importable from here)
from .kind import Kind
from .launch_rules import compile_arch, forward_grid, query_block_grid
from .layout import (CHUNK_BYTES, MBARRIER_BYTES, Barrier, Budget, Occupancy, Region, Swizzle,
                     TileCopy, barrier_region, check_budget, layout_regions, ring_stride, xor_misfit)
from .spec_keys import ForwardSpec, PadSwizzle, XorSwizzle, blocks_that_fit
from .variants import MASKS, SCORES, MaskVariant, ScoreVariant
from .input_errors import ERRORS_FIELD
from .varlen_plan import PAGED_VARLEN_ABI_FIELDS, VARLEN_ABI_FIELDS, is_varlen, mask_of, varlen_key

ELEMENT_TYPES = {"fp16": ("half", "half2", "f16"), "bf16": ("__nv_bfloat16", "__nv_bfloat162", "bf16"),
                 "e4m3": ("__nv_fp8_e4m3", "__nv_fp8x2_e4m3", "e4m3")}


def stride_fields(t: str, what: str) -> tuple:
    """The batch, head and row strides of a (batch, heads, rows, dim) tensor, as ABI fields."""
    return tuple(int64(f"{t}_{d}_stride", f"{what}: elements between {p}") for d, p in
                 (("batch", "batches"), ("head", "heads"), ("row", "rows")))


# Every by-value parameter a forward kernel may read; the mask variants add theirs
# (core/variants.py). A plan's Params is this list less what its kernels do not read (plan_abi).
FORWARD_ABI = Abi("Params", (
    pointer("q", "query (batch, heads, seqlen_q, head_dim), any strides, last dim contiguous"),
    pointer("k", "keys (batch, kv_heads, seqlen_k, head_dim)"),
    pointer("v", "values, shaped like k"),
    pointer("o", "output, shaped like q", const=False),
    float_pointer("lse", "fp32 natural-log LSE of every query row, rows contiguous; null: not written", optional=True),
    *stride_fields("q", "q"), *stride_fields("k", "k"), *stride_fields("v", "v"), *stride_fields("o", "o"),
    int64("lse_batch_stride", "lse: elements between batches (heads x seqlen_q padded; 0 varlen)"),
    int64("lse_head_stride", "lse: elements between heads (seqlen_q padded; total_q varlen)"),
    int32("batch", "batch size"),
    int32("heads", "query heads"),
    int32("kv_heads", "key/value heads; heads is a multiple (GQA/MQA)"),
    int32("seqlen_q", "query rows per head"),
    int32("seqlen_k", "keys per head"),
    float32("scale_log2", "softmax scale * log2(e): scores are exponentiated with exp2"),
) + tuple(f for m in MASKS.values() for f in m.abi_fields) + tuple(f for s in SCORES.values() for f in s.abi_fields)
  + VARLEN_ABI_FIELDS)


def tensor_fields(tensor: str) -> tuple[str, ...]:
    """The Params fields that locate a (batch, heads, rows, head_dim) tensor: pointer and strides."""
    return (tensor,) + tuple(f"{tensor}_{d}_stride" for d in ("batch", "head", "row"))


def plan_abi(masks, *, varlen: bool, reports_errors: bool, through_maps=(), unread=(), scores=(),
             base: Abi = FORWARD_ABI) -> Abi:
    """The Params of a plan: `base` less the fields its kernels never read, so a generated file
    declares no field it does not use. Left out: the fields of masks the plan has no function for and
    of score modifiers it does not apply,
    and of varlen sequences (those a mask reads only per sequence too) unless it has varlen
    functions; the error-flag pointer unless its kernels report input errors; the pointer and
    strides of the tensors it loads through TMA maps (the maps carry them); and the `unread` fields a
    kind's kernels never read."""
    base = base.with_fields(tuple(f for s in scores if s.name not in SCORES for f in s.abi_fields))  # an expression's
    names = {f.name for f in base.fields}
    unread = set(unread) | {f.name for m in MASKS.values() if m not in masks for f in m.abi_fields}
    unread |= {f.name for s in SCORES.values() if s not in scores for f in s.abi_fields}
    if not varlen:
        unread |= {n for m in masks for n in m.varlen_only}
        unread |= {f.name for f in VARLEN_ABI_FIELDS if f.name != ERRORS_FIELD.name}
    if not (varlen or reports_errors):
        unread.add(ERRORS_FIELD.name)
    for tensor in through_maps:
        unread |= set(tensor_fields(tensor))
    return base.without(unread & names)


@dataclass(frozen=True)
class Part:
    """One generated file of a bundle: a template of the kind and the kernel functions it defines."""

    name: str                                  # e.g. fwd; split, combine for a decode bundle
    template: str                              # template file in the kind's folder
    file_name: str                             # generated/<file_name>
    functions: tuple[tuple[str, str], ...]     # (function key, extern "C" function name); the key is a mask,
                                               # or core.varlen_plan.varlen_key(mask) for varlen sequences
    static_smem: int | None = None             # shared memory its kernels declare statically; None: the plan's
    threads: int | None = None                 # threads per block of its kernels; None: the plan's
    reads: tuple[str, ...] = ()                # the Params fields its kernels read when not all of them: its
                                               # struct declares those and reserves the other bytes (Abi.view)
    awaits_predecessor: bool = False           # its kernels wait for the kernel ahead of them on the stream
                                               # themselves (griddepcontrol.wait), so they are launched before
                                               # it ends (programmatic dependent launch, sm_90 and up)
    awaiting_twins: tuple[tuple[str, str], ...] = ()   # (function key, name) of entry points compiled a second
                                               # time as programmatic dependents (awaiting_twin_functions); the
                                               # runtime launches them for short calls on sm_90 and up


@dataclass(frozen=True)
class ForwardPlan:
    spec: ForwardSpec
    kind: Kind                      # the kind that made it: its name, call convention and templates
    title: str
    target: Target
    masks: tuple[str, ...]          # the spec's mask names, one kernel function each
    mask_variants: tuple[MaskVariant, ...]
    parts: tuple[Part, ...]
    abi: Abi
    ctype: str                      # CUDA element type of the output (and of the inputs but for e4m3 ones)
    ctype2: str                     # its two-element vector type
    ptx_type: str                   # its PTX name (f16, bf16)
    head_dim: int
    block_m: int
    block_n: int
    compute_warps: int
    producer_warps: int
    threads: int
    compute_threads: int
    producer_threads: int
    rows_per_warp: int
    chunks_per_row: int
    swizzle: Swizzle
    regions: tuple[Region, ...]
    smem_bytes: int
    smem_budget: int
    smem_dynamic: bool              # launched with dynamic shared memory (needed above 48 KiB)
    stages: int
    async_copy: bool
    q_in_registers: bool
    rescale: str
    q_copy: TileCopy
    kv_copy: TileCopy
    barriers: tuple[Barrier, ...]
    kv_stage_stride: int            # bytes from stage s's K (or V) tile to stage s+1's
    min_blocks_per_sm: int | None   # __launch_bounds__ minimum blocks per SM (None: ptxas chooses)
    fragments: object               # the kind's typed fragment numbers
    bank_report: tuple = ()
    roles: tuple[str, ...] = ()     # who does what, for explain (warp-specialized plans)
    schedule: tuple[str, ...] = ()  # the hand-off, step by step, for explain
    copy_engine: str = ""           # how K/V tiles travel, for explain (default: from async_copy)
    arch_suffix: str = ""           # "a": needs the arch-specific target (sm_90a: wgmma, setmaxnreg)
    tensor_maps: tuple = ()         # TMA tensor maps the runtime encodes per call (core.tensor_maps.TensorMapSpec)
    params_qualifier: str = ""      # "__grid_constant__ ": Params stays in parameter space (TMA maps need its address)
    persistent: bool = False        # one resident block per SM loops over every query block (grid = SM count)
    score_variants: tuple[ScoreVariant, ...] = ()   # the spec's score modifiers, in the order they apply
    expression: object = None       # the spec's variant: expressions (core.expression_variant), or None
    expression_cuda: object = None  # ... and the C++ its templates render (expression_variant.CudaPieces)
    block_text: tuple[str, ...] = ()  # explain's block, threads and masks lines when the forward ones do not fit
    head_dim_v: int = 0             # V's and O's head dim where it differs from head_dim (0: the same)
    pipeline_text: str = ""         # explain's copies line where the K/V ring's does not describe the kernel
    swizzle_hint: str = ""          # an XOR swizzle the kind takes under which the bank report is conflict-free
                                    # (only where the spec's own has conflicts)
    paged: bool = False             # varlen functions also read K/V page pools through a block table (page_size,
                                    # page_shift in Params); false: packed K/V only

    @property
    def v_dim(self) -> int:
        """The head dim of V and O."""
        return self.head_dim_v or self.head_dim

    def region(self, name: str) -> Region:
        for r in self.regions:
            if r.name == name:
                return r
        raise KeyError(name)

    @property
    def smem_align(self) -> int:
        """Alignment the kernel declares its shared memory with: the largest any region needs."""
        return max((r.align for r in self.regions), default=128)

    @property
    def kv_regions(self) -> list[tuple[Region, Region]]:
        return [(self.region(f"k{s}"), self.region(f"v{s}")) for s in range(self.stages)]

    @property
    def functions(self) -> tuple[tuple[str, str], ...]:
        """(mask, function name) of every part, in order; names are unique, masks repeat across parts."""
        return tuple(f for part in self.parts for f in part.functions)

    @property
    def entry_functions(self) -> dict[str, str]:
        """function key -> function name of the part a call launches first (the bundle's entry,
        parts[0]); keys are masks, plus their varlen keys in a varlen spec."""
        return dict(self.parts[0].functions)

    @property
    def awaiting_entry_functions(self) -> dict[str, str]:
        """function key -> the entry part's awaiting twin of that key's function (none without
        awaiting_twins)."""
        return dict(self.parts[0].awaiting_twins)

    @property
    def mask_cpp(self) -> dict[str, str]:
        """function key -> the C++ enumerator of the mask its kernel function is instantiated with."""
        cpp = {m.name: m.cpp for m in self.mask_variants}
        return {key: cpp[self.key_mask(key)] for part in self.parts for key, _ in part.functions
                if self.key_mask(key) in cpp}

    def key_mask(self, key: str) -> str:
        """The mask a function key runs (a varlen key without its suffix)."""
        return mask_of(key)

    @property
    def varlen(self) -> bool:
        """The bundle emits varlen functions."""
        return any(is_varlen(key) for key, _ in self.functions)

    def expression_lines(self) -> list[str]:
        """explain's lines on how the kernels apply the spec's expressions (none without them)."""
        if self.expression is None:
            return []
        return self.expression.explain_lines(self.block_m, self.block_n, backward=self.kind.convention.gradients)

    def body(self, key: str) -> str:
        """The C++ function an entry point runs: attention, or attention_varlen for varlen sequences."""
        return "attention_varlen" if is_varlen(key) else "attention"

    @property
    def occupancy(self) -> Occupancy:
        return Occupancy(self.target, self.smem_bytes, self.threads)

    @property
    def barrier_bytes(self) -> int:
        return MBARRIER_BYTES

    @property
    def copy_by_row_steps(self) -> bool:
        """Every copy group (a multiple of 32 threads) covers whole rows of 16-byte chunks, so a
        thread copies one chunk column every threads / chunks_per_row rows: one global pointer and
        one shared offset per thread instead of an address per chunk (fewer live registers)."""
        return 32 % self.chunks_per_row == 0

    @property
    def smem_note(self) -> str:
        """Why the kernel declares its shared memory the way it does."""
        if self.smem_dynamic:
            return (f"dynamic: {self.smem_bytes} B exceed the {self.target.smem_per_block} B a block gets by default, so the "
                    f"kernel declares extern __shared__ and the launch raises the opt-in attribute")
        return f"static: {self.smem_bytes} B fit the {self.target.smem_per_block} B default, so ptxas can confirm the plan"

    def compile_arch(self, arch: str) -> str:
        """The nvcc target for a GPU of `arch` (sm_90 -> sm_90a when the kernel needs it); ValueError
        when the kernel's arch-specific instructions do not exist on that GPU."""
        return compile_arch(self.spec.name, self.target.arch, self.arch_suffix, arch)

    def grid(self, batch: int, heads: int, seqlen_q: int, sm_count: int | None = None) -> tuple[int, int, int]:
        """One block per block_m query rows of each (head, batch); persistent: one block per SM of
        the GPU (`sm_count`, default the target's), never more than there are query blocks."""
        return forward_grid(self.block_m, self.persistent, self.target.sm_count, batch, heads, seqlen_q, sm_count)

    def varlen_grid(self, batch: int, heads: int, max_seqlen_q: int) -> tuple[int, int, int]:
        """One block per block_m query rows (of the longest sequence, in a varlen call), head and
        batch (or sequence): a non-persistent plan's grid, and every plan's varlen grid (a persistent
        plan's varlen functions compute one query block per block too)."""
        return query_block_grid(self.block_m, batch, heads, max_seqlen_q)


# -- derivations ---------------------------------------------------------------------------------

def spec_variants(spec: ForwardSpec) -> dict:
    """The plan fields of a spec's variants: its masks, its score modifiers (the built-in ones, then an
    expression variant's) and the expression variant itself."""
    from .expression_variant import expression_variant
    expression = expression_variant(spec.variant, varlen=bool(spec.varlen))
    scores = tuple(SCORES[s] for s in spec.scores) + ((expression.as_score_variant(),) if expression else ())
    return {"masks": tuple(spec.masks), "mask_variants": tuple(MASKS[m] for m in spec.masks),
            "score_variants": scores, "expression": expression,
            "expression_cuda": expression.cuda(spec.tile.block_m, spec.tile.block_n) if expression else None}


def function_name(spec: ForwardSpec, key: str) -> str:
    return f"attngen_{spec.name}_{key}"


def forward_functions(spec: ForwardSpec) -> tuple[tuple[str, str], ...]:
    """(key, name) of every kernel function: one per mask (but for `varlen: only`), then with `varlen`
    one per mask for varlen sequences."""
    keys = (list(spec.masks) if spec.padded else []) + ([varlen_key(m) for m in spec.masks] if spec.varlen else [])
    return tuple((key, function_name(spec, key)) for key in keys)


AWAITING_TWIN_SUFFIX = "_awaits"


def awaiting_twin_functions(functions: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """(key, name) of the awaiting twin of each function of a mask (varlen functions have none: a
    varlen call's work is not known on the host): the same body, with the wait for the kernel ahead
    first, in a kernel function of its own, so the usual function's code is left as it was."""
    return tuple((key, name + AWAITING_TWIN_SUFFIX) for key, name in functions if not is_varlen(key))


def tile_swizzle(spec: ForwardSpec, file: str | None = None) -> Swizzle:
    """The address function of the Q, K and V tile rows; SpecError for an XOR swizzle that would move
    a chunk past its row (every kind's tiles go through here)."""
    row_bytes = spec.head_dim * spec.elem_bytes
    sw = spec.smem.swizzle
    if isinstance(sw, PadSwizzle):
        return Swizzle("pad", row_bytes + sw.pad_bytes)
    if isinstance(sw, XorSwizzle):
        check_xor_fits_row(row_bytes // CHUNK_BYTES, sw.xor_bits, spec.head_dim, file)
        return Swizzle("xor", row_bytes, sw.xor_bits, sw.row_shift)
    return Swizzle("none", row_bytes)


def check_xor_fits_row(chunks: int, xor_bits: int, head_dim: int, file: str | None) -> None:
    """SpecError where the XOR swizzle would move a chunk past its row (core.layout.xor_misfit)."""
    problem = xor_misfit(chunks, xor_bits, head_dim)
    if problem:
        raise SpecError(problem, file=file, key="smem.swizzle.xor_bits")


def tile_regions(spec: ForwardSpec, sw: Swizzle) -> list[Region]:
    """Q tile, then each pipeline stage's K and V tile."""
    ctype, eb = ELEMENT_TYPES[spec.dtype][0], spec.elem_bytes
    d, bn, bm = spec.head_dim, spec.tile.block_n, spec.tile.block_m
    desc = sw.describe()
    regions = [Region("q", bm, d, ctype, eb, sw.pitch_bytes, swizzle=desc, per="Q tile, loaded once")]
    for s in range(spec.smem.stages):
        regions.append(Region(f"k{s}", bn, d, ctype, eb, sw.pitch_bytes, swizzle=desc, per=f"K tile, stage {s}"))
        regions.append(Region(f"v{s}", bn, d, ctype, eb, sw.pitch_bytes, swizzle=desc, per=f"V tile, stage {s}"))
    return regions


def role_barrier_regions(spec: ForwardSpec) -> list[Region]:
    """The mbarriers of the producer/consumer hand-off: full[0..stages), then empty[0..stages)."""
    if not spec.producer_warps:
        return []
    n = spec.smem.stages
    return [barrier_region("bars", 2 * n, f"mbarriers full[0..{n}), empty[0..{n})")]


def producer_consumer_barriers(spec: ForwardSpec, regions: tuple[Region, ...]) -> tuple[Barrier, ...]:
    """full[s]: one arrival per producer thread, made by the hardware when that thread's cp.async
    copies into stage s have landed; empty[s]: one arrival per consumer thread after its last read."""
    if not spec.producer_warps:
        return ()
    base = next(r.offset for r in regions if r.name == "bars")
    stages = spec.smem.stages
    producers, consumers = 32 * spec.producer_warps, 32 * spec.compute_warps
    full = [Barrier(f"full{s}", s, base + MBARRIER_BYTES * s, producers,
                    "producer threads, when their copies land (cp.async.mbarrier.arrive.noinc)",
                    "consumer threads") for s in range(stages)]
    empty = [Barrier(f"empty{s}", s, base + MBARRIER_BYTES * (stages + s), consumers,
                     "consumer threads, after their last read of the stage (mbarrier.arrive)",
                     "producer threads") for s in range(stages)]
    return tuple(full + empty)


def producer_consumer_text(spec: ForwardSpec) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(roles, schedule) lines of the cp.async producer/consumer hand-off, for explain."""
    if not spec.producer_warps:
        return (), ()
    c, p, stages = spec.compute_warps, spec.producer_warps, spec.smem.stages
    roles = (f"producer warps {c}..{c + p - 1} (threads {32 * c}..{32 * (c + p) - 1}) copy K/V tile t into stage "
             f"t % {stages}",
             f"consumer warps 0..{c - 1} compute tile t from stage t % {stages}")
    schedule = ("schedule, tile t in stage s = t % stages, phase t / stages (waiters test its parity):",
                "  producer: wait empty[s] (when t >= stages), issue cp.async of K and V tile t,"
                " cp.async.mbarrier.arrive on full[s], go on without waiting for the copies",
                "  consumer: wait full[s], compute tile t, arrive empty[s]",
                f"up to {stages} tiles in flight; thread 0 initialises the mbarriers, and the Q copy's"
                " __syncthreads (the kernel's only block-wide barrier) publishes them")
    return roles, schedule


def launch_min_blocks(spec: ForwardSpec, target: Target, threads: int, file: str | None) -> int | None:
    """The spec's min_blocks_per_sm, refused when that many blocks cannot be resident on the target.
    The count it suggests also leaves the kernel its registers (a resident count could spill)."""
    n = spec.min_blocks_per_sm
    if n is not None and n * threads > target.max_threads_per_sm:
        fit = blocks_that_fit(spec, threads)
        raise SpecError(f"{n} blocks of {threads} threads exceed the {target.max_threads_per_sm} threads an SM of "
                        f"the {target.name} holds", file=file, key="min_blocks_per_sm",
                        hint=(f"use min_blocks_per_sm <= {fit}, or leave it unset" if fit > 1 else
                              "leave min_blocks_per_sm unset"))
    return n


def plan_forward(spec: ForwardSpec, *, kind: Kind, title: str, file: str | None,
                 fragments: Callable[[ForwardSpec, int], object],
                 extra_regions: Callable[[ForwardSpec], list[Region]] = lambda spec: [],
                 bank_patterns: Callable[["ForwardPlan"], list] = lambda plan: [],
                 template: str = "kernel.cu.j2",
                 tiles: Callable[[ForwardSpec, Swizzle], list[Region]] = tile_regions,
                 abi: Abi = FORWARD_ABI) -> ForwardPlan:
    """The forward plan of `spec`; the kind supplies its fragment numbers, regions and bank patterns
    (and, where its tiles or Params differ from the forward's, its `tiles` and `abi`)."""
    target = TARGETS[spec.target]
    ctype, ctype2, ptx_type = ELEMENT_TYPES[spec.out_dtype]
    sw = tile_swizzle(spec, file)
    regions = layout_regions(tiles(spec, sw) + extra_regions(spec) + role_barrier_regions(spec))
    total = check_budget(regions, Budget.of(target, spec.smem.opt_in), file)
    compute_threads = 32 * spec.compute_warps
    producer_threads = 32 * spec.producer_warps
    threads = compute_threads + producer_threads
    rows_per_warp = spec.tile.block_m // spec.compute_warps
    chunks_per_row = spec.head_dim * spec.elem_bytes // CHUNK_BYTES
    functions = forward_functions(spec)
    variants = spec_variants(spec)
    paged = bool(getattr(spec, "paged", False))
    if paged:
        abi = abi.with_fields(PAGED_VARLEN_ABI_FIELDS)
    plan = ForwardPlan(
        spec=spec, kind=kind, title=title, target=target, **variants,
        parts=(Part("fwd", template, f"{spec.name}.cu", functions),),
        abi=plan_abi(variants["mask_variants"], varlen=spec.varlen, reports_errors=False,
                     scores=variants["score_variants"], base=abi),
        ctype=ctype, ctype2=ctype2, ptx_type=ptx_type, head_dim=spec.head_dim,
        block_m=spec.tile.block_m, block_n=spec.tile.block_n,
        compute_warps=spec.compute_warps, producer_warps=spec.producer_warps,
        threads=threads, compute_threads=compute_threads, producer_threads=producer_threads,
        rows_per_warp=rows_per_warp, chunks_per_row=chunks_per_row, swizzle=sw,
        regions=regions, smem_bytes=total, smem_budget=Budget.of(target, spec.smem.opt_in).bytes,
        smem_dynamic=total > target.smem_per_block,
        stages=spec.smem.stages, async_copy=spec.smem.async_copy,
        q_in_registers=spec.smem.q_in_registers, rescale=spec.softmax.rescale,
        q_copy=TileCopy(spec.tile.block_m, chunks_per_row, threads),
        kv_copy=TileCopy(spec.tile.block_n, chunks_per_row, producer_threads or threads),
        barriers=producer_consumer_barriers(spec, regions),
        kv_stage_stride=ring_stride(regions, "k", "v"),
        min_blocks_per_sm=launch_min_blocks(spec, target, threads, file),
        fragments=fragments(spec, rows_per_warp, file),
        roles=producer_consumer_text(spec)[0], schedule=producer_consumer_text(spec)[1], paged=paged,
    )
    # The bank analysis reads the finished plan's address function, so it is attached last.
    report = tuple(bank_patterns(plan))
    hint = conflict_free_swizzle(spec, plan, bank_patterns) if any(p.degree > 1 for p in report) else ""
    return replace(plan, bank_report=report, swizzle_hint=hint)


def conflict_free_swizzle(spec: ForwardSpec, plan: ForwardPlan, bank_patterns) -> str:
    """The first XOR swizzle (fewest bits, then smallest row shift) that fits a row, that the spec's
    kind accepts, and under which every pattern of the bank report is conflict-free; "" when none
    is. A row of 10 or 12 16-byte chunks puts rows r and r + 2 or r + 4 on the same banks under a
    plain XOR: the row shift is what a hand-picked swizzle tends to miss."""
    chunks = spec.head_dim * spec.elem_bytes // CHUNK_BYTES
    data = spec.model_dump(by_alias=True, exclude_none=True)
    for bits in (1, 2, 3):
        for shift in range(4):
            if xor_misfit(chunks, bits, spec.head_dim):
                continue
            swizzle = {"xor_bits": bits, "row_shift": shift}
            try:
                alt_spec = type(spec).model_validate({**data, "smem": {**data["smem"], "swizzle": swizzle}})
            except ValueError:
                continue    # the kind does not take it (scalar, wmma), or a rule refuses it
            if all(p.degree == 1 for p in bank_patterns(replace(plan, swizzle=tile_swizzle(alt_spec)))):
                return f"{{xor_bits: {bits}" + (f", row_shift: {shift}" if shift else "") + "}"
    return ""
