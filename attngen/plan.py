"""The planner: every number a kernel needs, derived from a spec.

Templates read only a Plan. If a template would need arithmetic on spec fields, the result
belongs here, under a name a reviewer can read in `attngen explain`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from . import banks
from .errors import BudgetError, SpecError
from .spec import PadSwizzle, Spec, XorSwizzle
from .targets import TARGETS, Target

REGION_ALIGN = 128          # bytes; every region starts on a 128-byte boundary
CHUNK_BYTES = 16            # one vectorized copy (uint4 / cp.async.cg 16)
LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class Region:
    """One named shared-memory buffer."""

    name: str
    rows: int
    cols: int
    elem: str               # "half", "bf16", "float" ...
    elem_bytes: int
    pitch_bytes: int        # bytes from one row to the next (includes padding)
    offset: int = 0
    swizzle: str = "none"   # human description
    per: str = ""           # what the buffer is for, for explain

    @property
    def bytes(self) -> int:
        return self.rows * self.pitch_bytes

    @property
    def pitch_elems(self) -> int:
        return self.pitch_bytes // self.elem_bytes

    @property
    def end(self) -> int:
        return self.offset + self.bytes


@dataclass(frozen=True)
class Swizzle:
    """Address function of a tile row of 16-byte chunks: byte(row, chunk) inside a region."""

    kind: str               # none | pad | xor
    pitch_bytes: int
    xor_bits: int = 0
    row_shift: int = 0

    @property
    def rows_16b_aligned(self) -> bool:
        """Rows start on 16-byte boundaries, so a chunk can be stored as one uint4."""
        return self.pitch_bytes % CHUNK_BYTES == 0

    @property
    def xor_mask(self) -> int:
        return (1 << self.xor_bits) - 1

    @property
    def steps_by_xor(self) -> bool:
        """Fragment steps (row0 a multiple of 16, chunk0 even) can reuse one per-lane offset:
        offset(row0 + r, chunk0 + c) == (offset(r, c) ^ chunk0 * 16) + row0 * pitch. Holds when the
        pitch is a power of two (row bits never overlap chunk bits) and row0 leaves the XOR term alone."""
        pow2 = self.pitch_bytes & (self.pitch_bytes - 1) == 0
        return self.kind == "xor" and pow2 and self.xor_bits + self.row_shift <= 4

    def chunk_offset(self, row: int, chunk: int) -> int:
        if self.kind == "xor":
            chunk ^= (row >> self.row_shift) & self.xor_mask
        return row * self.pitch_bytes + chunk * CHUNK_BYTES

    def byte_offset(self, row: int, col_byte: int) -> int:
        return self.chunk_offset(row, col_byte // CHUNK_BYTES) + col_byte % CHUNK_BYTES

    def describe(self) -> str:
        if self.kind == "xor":
            rows = f"(row >> {self.row_shift})" if self.row_shift else "row"
            return f"xor: chunk ^= {rows} & {self.xor_mask}"
        if self.kind == "pad":
            return f"pad to {self.pitch_bytes} B/row"
        return "none"


@dataclass(frozen=True)
class TileCopy:
    """How a group of threads copies an R x D tile global->shared in 16-byte chunks."""

    rows: int
    chunks_per_row: int
    threads: int

    @property
    def chunks(self) -> int:
        return self.rows * self.chunks_per_row

    @property
    def iterations(self) -> int:
        return math.ceil(self.chunks / self.threads)

    @property
    def exact(self) -> bool:
        """True when every thread copies the same number of chunks (no bounds test needed)."""
        return self.chunks % self.threads == 0


@dataclass(frozen=True)
class Barrier:
    """An mbarrier (a 64-bit object in shared memory) of the producer/consumer hand-off.

    A phase completes when `arrivals` arrivals have been counted; waiters test the phase's parity.
    """

    name: str               # full0, empty0, ...
    stage: int
    offset: int             # bytes from the start of shared memory
    arrivals: int           # expected arrivals per phase
    arrive: str             # who arrives, and how
    wait: str               # who waits


MBARRIER_BYTES = 8


@dataclass(frozen=True)
class Plan:
    spec: Spec
    target: Target
    family: str                     # scalar | wmma | mma
    masks: tuple[str, ...]
    functions: tuple[tuple[str, str], ...]   # (mask, extern "C" function name)
    ctype: str                      # CUDA element type
    ctype2: str                     # its two-element vector type
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
    # per-family numbers
    scalar: dict = field(default_factory=dict)
    wmma: dict = field(default_factory=dict)
    mma: dict = field(default_factory=dict)
    barriers: tuple[Barrier, ...] = ()
    bank_report: tuple = ()
    kv_stage_stride: int = 0        # bytes from stage s's K (or V) tile to stage s+1's
    min_blocks_per_sm: int | None = None   # __launch_bounds__ minimum blocks per SM (None: ptxas chooses)


    def region(self, name: str) -> Region:
        for r in self.regions:
            if r.name == name:
                return r
        raise KeyError(name)

    @property
    def full_barrier_offset(self) -> int:
        """Byte offset of full[0]; full[s] = full[0] + 8 s (consecutive by construction)."""
        return self.barriers[0].offset

    @property
    def empty_barrier_offset(self) -> int:
        return self.barriers[self.stages].offset

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
    def kv_regions(self) -> list[tuple[Region, Region]]:
        return [(self.region(f"k{s}"), self.region(f"v{s}")) for s in range(self.stages)]

    def blocks_per_sm_by_smem(self) -> int:
        t = self.target
        per_block = self.smem_bytes + t.smem_reserved_per_block
        by_smem = t.smem_per_sm // per_block if self.smem_bytes else t.max_blocks_per_sm
        return min(by_smem, self.blocks_per_sm_by_threads())

    def blocks_per_sm_by_threads(self) -> int:
        t = self.target
        return min(t.max_threads_per_sm // self.threads, t.max_blocks_per_sm)

    def blocks_per_sm_by_registers(self, regs_per_thread: int) -> int:
        """Registers are allocated per warp in units of 256."""
        per_warp = math.ceil(max(regs_per_thread, 1) * 32 / 256) * 256
        warps = self.threads // 32
        return self.target.regs_per_sm // (per_warp * warps)


# -- derivations ---------------------------------------------------------------------------------

def element_types(dtype: str) -> tuple[str, str]:
    return {"fp16": ("half", "half2"), "bf16": ("__nv_bfloat16", "__nv_bfloat162")}[dtype]


def function_name(spec: Spec, mask: str) -> str:
    return f"attngen_{spec.name}_{mask}"


def tile_swizzle(spec: Spec) -> Swizzle:
    row_bytes = spec.head_dim * spec.elem_bytes
    sw = spec.smem.swizzle
    if isinstance(sw, PadSwizzle):
        return Swizzle("pad", row_bytes + sw.pad_bytes)
    if isinstance(sw, XorSwizzle):
        return Swizzle("xor", row_bytes, sw.xor_bits, sw.row_shift)
    return Swizzle("none", row_bytes)


def smem_budget(spec: Spec, target: Target) -> int:
    return target.smem_per_block_optin if spec.smem.opt_in else target.smem_per_block


def layout_regions(regions: list[Region]) -> tuple[Region, ...]:
    """Place regions one after another, each on a REGION_ALIGN boundary."""
    placed, offset = [], 0
    for r in regions:
        offset = -(-offset // REGION_ALIGN) * REGION_ALIGN
        placed.append(Region(**{**r.__dict__, "offset": offset}))
        offset += r.bytes
    return tuple(placed)


def tile_regions(spec: Spec, sw: Swizzle) -> list[Region]:
    """Q tile, then each pipeline stage's K and V tile."""
    ctype = element_types(spec.dtype)[0]
    d, bn, bm = spec.head_dim, spec.tile.block_n, spec.tile.block_m
    desc = sw.describe()
    regions = [Region("q", bm, d, ctype, 2, sw.pitch_bytes, swizzle=desc, per="Q tile, loaded once")]
    for s in range(spec.smem.stages):
        regions.append(Region(f"k{s}", bn, d, ctype, 2, sw.pitch_bytes, swizzle=desc, per=f"K tile, stage {s}"))
        regions.append(Region(f"v{s}", bn, d, ctype, 2, sw.pitch_bytes, swizzle=desc, per=f"V tile, stage {s}"))
    return regions


def family_regions(spec: Spec) -> list[Region]:
    """Buffers beyond the tiles that a fragment family needs."""
    bm, bn, d = spec.tile.block_m, spec.tile.block_n, spec.head_dim
    ctype = element_types(spec.dtype)[0]
    if spec.mma == "scalar":
        return [Region("p", bm, bn, "float", 4, bn * 4, per="P = softmax numerators, fp32, row per warp slice")]
    if spec.mma == "wmma_m16n16k16":
        # The wmma accumulator layout is opaque, so S, P and the running O go through shared memory.
        return [
            Region("s", bm, bn, "float", 4, bn * 4, per="S = Q.K^T scores, fp32"),
            Region("p", bm, bn, ctype, 2, bn * 2, per="P, softmax numerators in the input type"),
            Region("o", bm, d, "float", 4, d * 4, per="running output O, fp32"),
        ]
    return []  # mma.sync keeps S, P and O in registers


def stage_stride(regions: tuple[Region, ...]) -> int:
    """Stages repeat k, v with one fixed stride, so a ring slot is addressed as base + slot * stride."""
    by_name = {r.name: r for r in regions}
    if "k1" not in by_name:
        return 0
    stride = by_name["k1"].offset - by_name["k0"].offset
    for s in range(1, sum(1 for n in by_name if n.startswith("k") and n[1:].isdigit())):
        assert by_name[f"k{s}"].offset - by_name[f"k{s - 1}"].offset == stride
        assert by_name[f"v{s}"].offset - by_name[f"v{s - 1}"].offset == stride
    return stride


def check_budget(spec: Spec, target: Target, regions: tuple[Region, ...], file: str | None) -> int:
    total = regions[-1].end if regions else 0
    budget = smem_budget(spec, target)
    if total > budget:
        lines = [f"  {'region':<8} {'shape':<14} {'bytes':>8} {'KiB':>8}"]
        for r in regions:
            lines.append(f"  {r.name:<8} {f'{r.rows}x{r.cols} {r.elem}':<14} {r.bytes:>8} {r.bytes / 1024:>8.2f}")
        pad = total - sum(r.bytes for r in regions)
        if pad:
            lines.append(f"  {'(align)':<8} {'':<14} {pad:>8} {pad / 1024:>8.2f}")
        lines.append(f"  {'total':<8} {'':<14} {total:>8} {total / 1024:>8.2f}")
        lines.append(f"  {'budget':<8} {'':<14} {budget:>8} {budget / 1024:>8.2f}  "
                     f"({target.name}, {'opt-in maximum' if spec.smem.opt_in else 'default per block'})")
        if not spec.smem.opt_in and total <= target.smem_per_block_optin:
            hint = (f"set smem.opt_in: true (the {target.name} allows {target.smem_per_block_optin} B per block), "
                    "or shrink tile.block_m / tile.block_n / smem.stages")
        else:
            hint = "shrink tile.block_m, tile.block_n or smem.stages"
        raise BudgetError(f"shared memory {total} B ({total / 1024:.2f} KiB) exceeds the budget of {budget} B "
                          f"({budget / 1024:.2f} KiB) by {total - budget} B",
                          breakdown="\n".join(lines), file=file, key="smem", hint=hint)
    return total


def barrier_regions(spec: Spec) -> list[Region]:
    """The mbarriers of the producer/consumer hand-off: full[0..stages), then empty[0..stages)."""
    if not spec.producer_warps:
        return []
    n = 2 * spec.smem.stages
    return [Region("bars", n, 1, "uint64", MBARRIER_BYTES, MBARRIER_BYTES,
                   per=f"mbarriers full[0..{spec.smem.stages}), empty[0..{spec.smem.stages})")]


def producer_consumer_barriers(spec: Spec, regions: tuple[Region, ...]) -> tuple[Barrier, ...]:
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


def launch_min_blocks(spec: Spec, target: Target, threads: int, file: str | None) -> int | None:
    """The spec's min_blocks_per_sm, refused when that many blocks cannot be resident on the target."""
    n = spec.min_blocks_per_sm
    if n is not None and n * threads > target.max_threads_per_sm:
        fit = target.max_threads_per_sm // threads
        raise SpecError(f"{n} blocks of {threads} threads exceed the {target.max_threads_per_sm} threads an SM of "
                        f"the {target.name} holds", file=file, key="min_blocks_per_sm",
                        hint=f"use min_blocks_per_sm <= {fit}, or leave it unset")
    return n


def scalar_numbers(spec: Spec, rows_per_warp: int) -> dict:
    return {
        "keys_per_lane": spec.tile.block_n // 32,      # S columns each lane owns
        "pairs_per_lane": spec.head_dim // 64,         # half2 column pairs of O each lane owns
        "d_pairs": spec.head_dim // 2,                 # half2 steps of the Q.K^T dot product
        "rows_per_warp": rows_per_warp,
    }


def wmma_numbers(spec: Spec, rows_per_warp: int) -> dict:
    lanes_per_row = 32 // rows_per_warp if rows_per_warp <= 32 else 1
    if rows_per_warp > 32 or 32 % rows_per_warp:
        raise SpecError(f"the wmma kernel gives each warp 16 or 32 rows (got {rows_per_warp})",
                        key="tile.block_m", hint="make block_m = 16 or 32 x warps.compute")
    return {
        "m_tiles": rows_per_warp // 16,
        "n_tiles": spec.tile.block_n // 16,
        "d_tiles": spec.head_dim // 16,
        "k_steps_qk": spec.head_dim // 16,
        "k_steps_pv": spec.tile.block_n // 16,
        "lanes_per_row": lanes_per_row,
        "cols_per_lane": spec.tile.block_n // lanes_per_row,
        "d_per_lane": spec.head_dim // lanes_per_row,
    }


def mma_numbers(spec: Spec, rows_per_warp: int) -> dict:
    m_tiles = rows_per_warp // 16
    n_tiles = spec.tile.block_n // 8
    d_tiles = spec.head_dim // 8
    k_qk = spec.head_dim // 16
    acc = m_tiles * (n_tiles + d_tiles) * 4
    q_regs = m_tiles * k_qk * 4 if spec.smem.q_in_registers else 0
    return {
        "m_tiles": m_tiles,             # 16-row A fragments per warp
        "n_tiles": n_tiles,             # 8-key accumulator tiles of S
        "d_tiles": d_tiles,             # 8-column accumulator tiles of O
        "k_steps_qk": k_qk,             # k16 steps of Q.K^T
        "k_steps_pv": spec.tile.block_n // 16,  # k16 steps of P.V
        "s_regs": m_tiles * n_tiles * 4,
        "o_regs": m_tiles * d_tiles * 4,
        "q_regs": q_regs,
        "est_regs": acc + q_regs,        # fp32 accumulators + Q fragments, before addressing
        "ptx_type": {"fp16": "f16", "bf16": "bf16"}[spec.dtype],
    }


def make_plan(spec: Spec, file: str | None = None) -> Plan:
    target = TARGETS[spec.target]
    ctype, ctype2 = element_types(spec.dtype)
    sw = tile_swizzle(spec)
    regions = layout_regions(tile_regions(spec, sw) + family_regions(spec) + barrier_regions(spec))
    total = check_budget(spec, target, regions, file)
    compute_threads = 32 * spec.compute_warps
    producer_threads = 32 * spec.producer_warps
    threads = compute_threads + producer_threads
    rows_per_warp = spec.tile.block_m // spec.compute_warps
    chunks_per_row = spec.head_dim * spec.elem_bytes // CHUNK_BYTES
    kv_threads = producer_threads or threads
    family = {"scalar": "scalar", "wmma_m16n16k16": "wmma", "mma_m16n8k16": "mma"}[spec.mma]
    numbers = {"scalar": {}, "wmma": {}, "mma": {}}
    if family == "scalar":
        numbers["scalar"] = scalar_numbers(spec, rows_per_warp)
    elif family == "wmma":
        numbers["wmma"] = wmma_numbers(spec, rows_per_warp)
    else:
        numbers["mma"] = mma_numbers(spec, rows_per_warp)
    plan = Plan(
        spec=spec, target=target, family=family, masks=tuple(spec.masks),
        functions=tuple((m, function_name(spec, m)) for m in spec.masks),
        ctype=ctype, ctype2=ctype2, head_dim=spec.head_dim,
        block_m=spec.tile.block_m, block_n=spec.tile.block_n,
        compute_warps=spec.compute_warps, producer_warps=spec.producer_warps,
        threads=threads, compute_threads=compute_threads, producer_threads=producer_threads,
        rows_per_warp=rows_per_warp, chunks_per_row=chunks_per_row, swizzle=sw,
        regions=regions, smem_bytes=total, smem_budget=smem_budget(spec, target),
        smem_dynamic=total > target.smem_per_block,
        stages=spec.smem.stages, async_copy=spec.smem.async_copy,
        q_in_registers=spec.smem.q_in_registers, rescale=spec.softmax.rescale,
        q_copy=TileCopy(spec.tile.block_m, chunks_per_row, threads),
        kv_copy=TileCopy(spec.tile.block_n, chunks_per_row, kv_threads),
        scalar=numbers["scalar"], wmma=numbers["wmma"], mma=numbers["mma"],
        barriers=producer_consumer_barriers(spec, regions),
        kv_stage_stride=stage_stride(regions),
        min_blocks_per_sm=launch_min_blocks(spec, target, threads, file),
    )
    # The bank analysis reads the finished plan's address function, so it is attached last.
    return replace(plan, bank_report=tuple(banks.report(plan)))
