"""Shared-memory layout: named regions, their placement and budget, the tile swizzle, tile copies,
mbarriers and occupancy. Pure arithmetic over numbers a kind hands in; knows no kind."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..errors import BudgetError
from ..targets import Target

REGION_ALIGN = 128          # bytes; every region starts on a 128-byte boundary
CHUNK_BYTES = 16            # one vectorized copy (uint4 / cp.async.cg 16)
MBARRIER_BYTES = 8          # one mbarrier object


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
    align: int = 128        # its start is a multiple of this (1024 for 128-byte-swizzled TMA/wgmma tiles)

    @property
    def bytes(self) -> int:
        return self.rows * self.pitch_bytes

    @property
    def pitch_elems(self) -> int:
        return self.pitch_bytes // self.elem_bytes

    @property
    def end(self) -> int:
        return self.offset + self.bytes


def register_cap(regs_per_sm: int, threads: int, blocks: int) -> int:
    """Registers per thread ptxas may use so that `blocks` blocks of `threads` fit on one SM (it
    allocates in units of 8, at most 255)."""
    return min(255, regs_per_sm // (blocks * threads) // 8 * 8)


def xor_misfit(chunks: int, xor_bits: int, head_dim: int) -> str | None:
    """Why an XOR of the low `xor_bits` bits of the chunk index breaks a row of `chunks` 16-byte
    chunks, with the fix; None when it fits. The XOR permutes aligned groups of 2**xor_bits chunks,
    so it keeps every chunk in its row only when the row is a whole number of groups; otherwise the
    last chunks land past the row, on the next row's chunks or outside the tile."""
    group = 1 << xor_bits
    if not chunks % group:
        return None
    fit = (chunks & -chunks).bit_length() - 1      # the most bits whose groups divide the row
    fix = f"use xor_bits: {fit}" if fit else "use {pad_bytes: 16} or no swizzle"
    first = chunks - chunks % group
    which = f"chunk {first}" if first == chunks - 1 else f"chunks {first}..{chunks - 1}"
    return (f"xor_bits {xor_bits} permutes groups of {group} 16-byte chunks, but a row of head_dim {head_dim} has "
            f"{chunks}: {which} can land past the row's end; {fix}")


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
    def is_xor(self) -> bool:
        return self.kind == "xor"

    @property
    def steps_by_xor(self) -> bool:
        """Fragment steps (row0 a multiple of 16, chunk0 even) can reuse one per-lane offset:
        offset(row0 + r, chunk0 + c) == (offset(r, c) ^ chunk0 * 16) + row0 * pitch. Holds when the
        pitch is a power of two (row bits never overlap chunk bits) and row0 leaves the XOR term alone."""
        pow2 = self.pitch_bytes & (self.pitch_bytes - 1) == 0
        return self.is_xor and pow2 and self.xor_bits + self.row_shift <= 4

    def chunk_offset(self, row: int, chunk: int) -> int:
        if self.is_xor:
            chunk ^= (row >> self.row_shift) & self.xor_mask
        return row * self.pitch_bytes + chunk * CHUNK_BYTES

    def byte_offset(self, row: int, col_byte: int) -> int:
        return self.chunk_offset(row, col_byte // CHUNK_BYTES) + col_byte % CHUNK_BYTES

    def describe(self) -> str:
        if self.is_xor:
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
    """An mbarrier (a 64-bit object in shared memory). A phase completes when `arrivals` arrivals
    have been counted; waiters test the phase's parity."""

    name: str               # full0, empty0, ...
    stage: int
    offset: int             # bytes from the start of shared memory
    arrivals: int           # expected arrivals per phase
    arrive: str             # who arrives, and how
    wait: str               # who waits


@dataclass(frozen=True)
class Budget:
    """The shared memory a block may use on a target, and whether the spec opted in above 48 KiB."""

    bytes: int
    opt_in: bool
    target: Target

    @classmethod
    def of(cls, target: Target, opt_in: bool) -> "Budget":
        return cls(target.smem_per_block_optin if opt_in else target.smem_per_block, opt_in, target)


def layout_regions(regions: list[Region]) -> tuple[Region, ...]:
    """Place regions one after another, each on a REGION_ALIGN boundary (or its own, larger one)."""
    placed, offset = [], 0
    for r in regions:
        align = max(REGION_ALIGN, r.align)
        offset = -(-offset // align) * align
        placed.append(replace(r, offset=offset))
        offset += r.bytes
    return tuple(placed)


def region_bytes(regions: tuple[Region, ...]) -> int:
    return regions[-1].end if regions else 0


def check_budget(regions: tuple[Region, ...], budget: Budget, file: str | None,
                 shrink: tuple[str, ...] = ("tile.block_m", "tile.block_n", "smem.stages")) -> int:
    """Total bytes of the placed regions; BudgetError with a region-by-region table when over."""
    total = region_bytes(regions)
    target = budget.target
    if total > budget.bytes:
        lines = [f"  {'region':<8} {'shape':<14} {'bytes':>8} {'KiB':>8}"]
        for r in regions:
            lines.append(f"  {r.name:<8} {f'{r.rows}x{r.cols} {r.elem}':<14} {r.bytes:>8} {r.bytes / 1024:>8.2f}")
        pad = total - sum(r.bytes for r in regions)
        if pad:
            lines.append(f"  {'(align)':<8} {'':<14} {pad:>8} {pad / 1024:>8.2f}")
        lines.append(f"  {'total':<8} {'':<14} {total:>8} {total / 1024:>8.2f}")
        lines.append(f"  {'budget':<8} {'':<14} {budget.bytes:>8} {budget.bytes / 1024:>8.2f}  "
                     f"({target.name}, {'opt-in maximum' if budget.opt_in else 'default per block'})")
        if not budget.opt_in and total <= target.smem_per_block_optin:
            hint = (f"set smem.opt_in: true (the {target.name} allows {target.smem_per_block_optin} B per block), "
                    f"or shrink {' / '.join(shrink)}")
        else:
            hint = f"shrink {', '.join(shrink[:-1])} or {shrink[-1]}" if len(shrink) > 1 else f"shrink {shrink[0]}"
        raise BudgetError(f"shared memory {total} B ({total / 1024:.2f} KiB) exceeds the budget of {budget.bytes} B "
                          f"({budget.bytes / 1024:.2f} KiB) by {total - budget.bytes} B",
                          breakdown="\n".join(lines), file=file, key="smem", hint=hint)
    return total


def ring_stride(regions: tuple[Region, ...], first: str, second: str) -> int:
    """Bytes between ring slots whose regions are named <first><s>, <second><s>; 0 for one slot.

    The planner lays slots out with one fixed stride so a slot is addressed as base + slot * stride;
    this checks that it did."""
    by_name = {r.name: r for r in regions}
    slots = sum(1 for n in by_name if n.startswith(first) and n[len(first):].isdigit())
    if slots < 2:
        return 0
    stride = by_name[f"{first}1"].offset - by_name[f"{first}0"].offset
    for s in range(1, slots):
        assert by_name[f"{first}{s}"].offset - by_name[f"{first}{s - 1}"].offset == stride
        assert by_name[f"{second}{s}"].offset - by_name[f"{second}{s - 1}"].offset == stride
    return stride


def barrier_region(name: str, count: int, per: str) -> Region:
    return Region(name, count, 1, "uint64", MBARRIER_BYTES, MBARRIER_BYTES, per=per)


@dataclass(frozen=True)
class Occupancy:
    """Resident blocks per SM from shared memory, threads and (once compiled) registers."""

    target: Target
    smem_bytes: int
    threads: int

    def by_threads(self) -> int:
        t = self.target
        return min(t.max_threads_per_sm // self.threads, t.max_blocks_per_sm)

    def by_smem(self) -> int:
        t = self.target
        per_block = self.smem_bytes + t.smem_reserved_per_block
        by_smem = t.smem_per_sm // per_block if self.smem_bytes else t.max_blocks_per_sm
        return min(by_smem, self.by_threads())

    def by_registers(self, regs_per_thread: int) -> int:
        """Registers are allocated per warp in units of 256."""
        per_warp = math.ceil(max(regs_per_thread, 1) * 32 / 256) * 256
        return self.target.regs_per_sm // (per_warp * (self.threads // 32))

    def register_cap(self, min_blocks: int) -> int:
        """Registers per thread ptxas may use so that `min_blocks` blocks fit on one SM."""
        return register_cap(self.target.regs_per_sm, self.threads, min_blocks)
