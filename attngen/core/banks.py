"""Shared-memory bank-conflict analysis of the access patterns a kernel's template uses.

The primitives here turn a plan's address function into per-phase addresses; each kind lists the
patterns its template uses (its `bank_patterns`).

Each pattern lists, per hardware phase, the byte addresses a warp touches. Shared memory has 32
banks of 4 bytes; a phase needs as many wavefronts as the largest number of distinct 4-byte words
that fall into one bank. 16-byte accesses (uint4, cp.async 16, one ldmatrix 8x8 matrix) are served
8 threads per phase; 4-byte accesses 32 threads per phase. Degree 1 means conflict-free.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable

BANKS = 32
WORD = 4


@dataclass(frozen=True)
class Pattern:
    name: str           # what the template does
    width: int          # bytes per thread access
    degree: int         # worst-case wavefronts per phase (1 = conflict-free)
    phases: int         # phases examined


def phase_degree(addresses: Iterable[int], width: int) -> int:
    """The wavefronts one phase needs: the most distinct 4-byte words that fall into one bank."""
    per = width // WORD
    words = {a // WORD + w for a in addresses for w in range(per)}
    return max(Counter(word % BANKS for word in words).values(), default=1)


def worst(phases: list[list[int]], width: int) -> int:
    return max((phase_degree(p, width) for p in phases), default=1)


def _phases(per_lane: list[int], width: int) -> list[list[int]]:
    group = {16: 8, 8: 16, 4: 32}[width]
    return [per_lane[i:i + group] for i in range(0, len(per_lane), group)]


def tile_store_pattern(plan, region_rows: int, threads: int) -> list[list[int]]:
    """A warp's 16-byte chunk stores while copying a tile (thread t copies chunk t + i*threads)."""
    sw, cpr = plan.swizzle, plan.chunks_per_row
    phases = []
    for it in range(-(-region_rows * cpr // threads)):
        for warp0 in range(0, threads, 32):
            lanes = []
            for lane in range(32):
                c = warp0 + lane + it * threads
                if c < region_rows * cpr:
                    lanes.append(sw.chunk_offset(c // cpr, c % cpr))
            phases += _phases(lanes, 16)
    return phases


def word_store_pattern(plan, region_rows: int, threads: int) -> list[list[int]]:
    """A tile copy that stores each 16-byte chunk as four 4-byte words (padded rows need not be
    16-byte aligned)."""
    sw, cpr = plan.swizzle, plan.chunks_per_row
    phases = []
    for it in range(-(-region_rows * cpr // threads)):
        for warp0 in range(0, threads, 32):
            for word in range(4):
                lanes = []
                for lane in range(32):
                    c = warp0 + lane + it * threads
                    if c < region_rows * cpr:
                        lanes.append(sw.chunk_offset(c // cpr, c % cpr) + 4 * word)
                phases.append(lanes)
    return phases


def ldmatrix_phases(plan, rows: int, cols: int, lane_row, lane_chunk) -> list[list[int]]:
    """ldmatrix.x4 over every 16x16 block of a rows x cols tile: one phase per 8x8 matrix."""
    sw = plan.swizzle
    phases = []
    for r0 in range(0, rows, 16):
        for c0 in range(0, cols // 8, 2):
            lanes = [sw.chunk_offset(r0 + lane_row(i), c0 + lane_chunk(i)) for i in range(32)]
            phases += _phases(lanes, 16)
    return phases


# ldmatrix.x4 lane -> (row, chunk) maps of the mma.sync templates (templates/lib/mma_sync.j2's users):
# A fragments (Q; V through .trans) and B fragments (K).
def a_row(i: int) -> int: return i % 8 + (i // 8) % 2 * 8
def a_chunk(i: int) -> int: return i // 16
def b_row(i: int) -> int: return i % 8 + i // 16 * 8
def b_chunk(i: int) -> int: return (i // 8) % 2


def mma_sync_patterns(plan, copy_threads: int) -> list[Pattern]:
    """The K/V tile copy and the three ldmatrix.x4 reads of an mma.sync kernel over block_m Q rows
    and block_n K/V rows."""
    d, bn, bm = plan.head_dim, plan.block_n, plan.block_m
    kv = tile_store_pattern(plan, bn, copy_threads)
    verb = "cp.async" if plan.async_copy else "uint4"
    q = ldmatrix_phases(plan, bm, d, a_row, a_chunk)
    k = ldmatrix_phases(plan, bn, d, b_row, b_chunk)
    v = ldmatrix_phases(plan, bn, d, a_row, a_chunk)
    return [Pattern(f"K/V tile store ({verb}, 16 B)", 16, worst(kv, 16), len(kv)),
            Pattern("ldmatrix.x4 Q (A fragments)", 16, worst(q, 16), len(q)),
            Pattern("ldmatrix.x4 K (B fragments of Q.K^T)", 16, worst(k, 16), len(k)),
            Pattern("ldmatrix.x4.trans V (B fragments of P.V)", 16, worst(v, 16), len(v))]
