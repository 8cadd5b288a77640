"""Shared-memory bank-conflict analysis of the access patterns a kernel's template uses.

The primitives here turn a plan's address function into per-phase addresses; each kind lists the
patterns its template uses (its `bank_patterns`).

Each pattern lists, per hardware phase, the byte addresses a warp touches. Shared memory has 32
banks of 4 bytes; a phase needs as many wavefronts as the largest number of distinct 4-byte words
that fall into one bank. 16-byte accesses (uint4, cp.async 16, one ldmatrix 8x8 matrix) are served
8 threads per phase; 4-byte accesses 32 threads per phase. Degree 1 means conflict-free.
"""
from __future__ import annotations

from collections import defaultdict
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
    words_in_bank: dict[int, set[int]] = defaultdict(set)
    for a in addresses:
        for w in range(width // WORD):
            word = a // WORD + w
            words_in_bank[word % BANKS].add(word)
    return max((len(v) for v in words_in_bank.values()), default=1)


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
