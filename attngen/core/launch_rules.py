"""The arithmetic a call does on a plan's numbers to launch its kernels: grids, the nvcc target, a
decode call's split count and split function, a backward call's row kernels and dQ accumulator.

Both a full plan (core.forward_plan and the decode and backward plans built on it) and the runtime's
LaunchPlan (core.launch_plan) call these, so the two cannot drift; this module imports nothing
heavier than the function keys, so the dispatcher's first call loads no planner to run them."""
from __future__ import annotations

import math

from .function_keys import KeySuffix

# -- forward --------------------------------------------------------------------------------------

def query_block_grid(block_m: int, batch: int, heads: int, max_seqlen_q: int) -> tuple[int, int, int]:
    """One block per block_m query rows (of the longest sequence, in a varlen call), head and batch
    (or sequence)."""
    return (-(-max_seqlen_q // block_m), heads, batch)


def forward_grid(block_m: int, persistent: bool, target_sm_count: int, batch: int, heads: int, seqlen_q: int,
                 sm_count: int | None = None) -> tuple[int, int, int]:
    """query_block_grid; persistent: one block per SM of the GPU (`sm_count`, default the target's),
    never more than there are query blocks."""
    blocks = query_block_grid(block_m, batch, heads, seqlen_q)
    if persistent:
        return (max(1, min(blocks[0] * heads * batch, sm_count or target_sm_count)), 1, 1)
    return blocks


# The forward's awaiting twins (schedule.awaiting_twins; core.forward_plan.awaiting_twin_functions). Launched as
# programmatic dependents, the twins made every short call measured 0.42-1.89 us faster back to back (H200, 28
# bf16 cells, d64 and d128, both masks, up to 4x16x2048x2048 with no mask: 268 M scores); the wait moves a twin's
# main loops 16 bytes within their instruction-cache lines, which cost the long cells 2x16x8192x8192 and
# 1x16x16384x16384 (d128, no mask) 0.2-1.0 % when every call waited (docs/performance/hopper.md). So calls of at
# most the largest measured short cell's scores launch the twin, longer ones the usual entry point.
AWAITING_TWIN_MAX_SCORES = 4 * 16 * 2048 * 2048


def launches_awaiting_twin(batch: int, heads: int, seqlen_q: int, seqlen_k: int, causal: bool) -> bool:
    """A forward call short enough that its twin, launched as a programmatic dependent, pays: its
    scores (batch x heads x seqlen_q x seqlen_k, about half of them under a causal mask) are at most
    AWAITING_TWIN_MAX_SCORES."""
    scores = batch * heads * seqlen_q * seqlen_k
    return (scores // 2 if causal else scores) <= AWAITING_TWIN_MAX_SCORES


def compile_arch(spec_name: str, target_arch: str, arch_suffix: str, arch: str) -> str:
    """The nvcc target for a GPU of `arch` (sm_90 -> sm_90a when the kernel needs it); ValueError
    when the kernel's arch-specific instructions do not exist on that GPU."""
    plain = arch.rstrip("a")
    if arch_suffix and plain != target_arch:
        raise ValueError(f"{spec_name} uses {target_arch}{arch_suffix}-only instructions and cannot "
                         f"be compiled for {arch}; use --arch {target_arch}")
    return plain + arch_suffix


# -- decode ---------------------------------------------------------------------------------------

MAX_SPLITS = 128
WAVE_EFFICIENCY = 0.95      # the heuristic takes the fewest splits within this fraction of the best
# K/V bytes in flight per SM, on average over the GPU, from which one slice per (KV head, batch)
# already streams at full speed: a split would only add partials to write and a combine to run.
# Measured on the H200 (docs/decode-h200/decode_split_grid.py, a 32-layer loop replayed from a CUDA graph, GQA
# 32/8, 1k-16k keys): d128 at batch 8 (64 blocks x 128 KiB in flight, 62 KiB per SM) is 1-16 %
# faster unsplit than in 2 slices; d64 at batch 8 (64 KiB per block, 31 KiB per SM) is 2-21 % slower
# unsplit from 4k keys on. The threshold lies between the two.
IN_FLIGHT_PER_SM = 48 << 10
# Where a combine kernel merges the key slices (combine: kernel; on sm_90 and up it is launched as a
# programmatic dependent of the split kernel) and the wave rule would cut slices of one K/V tile, a slice
# takes at least COMBINE_KERNEL_MIN_SLICE_TILES tiles where SHORT_CACHE_SLICES such slices remain, else at
# most SHORT_CACHE_SLICES slices of one tile are cut; except that a cache of at most ONE_TILE_CACHE_TILES
# tiles whose one-tile slices fill at most ONE_TILE_GRID_SHARE of the slots keeps them. Measured on the
# H200, bf16 (docs/performance/decode.md, "The combine launched as a programmatic dependent" and "Split
# counts, measured by cell"): B1 with 8 KV heads at 2k keys (16 tiles of 128), 8 slices of two tiles beat
# 16 of one (d128 11.6-11.9 against 11.9-13.3 us); at 1k keys (8 tiles) 8 slices of one tile beat 4 of two
# (d128 9.5 against 10.7, d64 8.3 against 9.0). With one KV head, or MLA's 16 heads in one block, one-tile
# slices filling few SMs were faster up to 24 tiles (MLA B1 16/1 at 768 keys: 11.1 us in 12 slices, 12.0
# in 6; at 1536 keys 11.9 in 24, 12.7 in 12) and slower from 32 (d128 B1 8/1 at 4k keys: 11.7 in 32, 11.2
# in 16).
COMBINE_KERNEL_MIN_SLICE_TILES = 2
SHORT_CACHE_SLICES = 8
ONE_TILE_CACHE_TILES = 24
ONE_TILE_GRID_SHARE = 0.5
# Where the split kernel merges (combine: auto or fused: the last block of a row group to finish reads the
# group's partials), the split count minimises a slice cost in K/V-tile times instead of the wave rule:
#   waves x (SLICE_FIXED_TILES + tiles per slice) + MERGE_TILES_PER_PARTIAL x (splits - FREE_PARTIALS)
# (waves = ceil(blocks x splits / slots); the last term only where positive). The wave rule cut these
# calls into one-tile slices in several waves (B1 32/8 at 4224 keys: 33 slices, 22.4 us against 14.5 in 11)
# and one KV head into 64-128 slices whose partials one block reads alone (B1 8/1 at 16k keys: 36.5 us in
# 128, 19.4 in 22). Fitted on the H200 to 76 cells of d64 and d128 bf16, B1-16, one and eight KV heads,
# 1k-128k keys, each timed at two or more counts (docs/decode-h200/split_rule/forced_counts.json and
# slice_cost_prototype.json): the pick is within 7 % of the fastest count measured in each. Checked after
# against the wave rule on every cell of a grid where the two differ (old_against_new.json): 179 cells, 160
# faster, 13 within 1 %, 6 slower by 1.1-4.6 % (the e4m3 contiguous cell at 4k keys the most).
SLICE_FIXED_TILES = 4.0
MERGE_TILES_PER_PARTIAL = 0.25
FREE_PARTIALS = 8

# A cell whose blocks do not stream at full speed one per SM (co_resident_blocks 2: an e4m3 cell two of whose
# blocks fit an SM) counts that many per SM where the grid has CO_RESIDENT_MIN_BLOCKS blocks (batch x KV heads
# x row blocks) or more and the cache CO_RESIDENT_MIN_TILES tiles or more, and then leaves the in-flight rule
# (measured one block per SM) out. Measured on the H200 (docs/decode.md, "e4m3 KV cache"; the d128
# contiguous cell, fp16 queries): every cell of that kind got faster (B8 32/8 at 32k keys 168 -> 146 us, 128k
# 638 -> 540), shorter caches got slower (B16 32/8 at 512-4k keys, 13.1-45.2 -> 16.5-46.0 us), and smaller
# grids were mixed (8/1 heads: B8 slower up to 32k keys, faster at 128k; B16 slower at 4k-8k, faster from
# 32k; B2 32/8 slower up to 8k, faster from 16k): the thresholds keep to the cells that only gained.
CO_RESIDENT_MIN_BLOCKS = 32
CO_RESIDENT_MIN_TILES = 64
# A merging cell of a 2-stage ring (one tile in flight per block: the d128 e4m3 `contiguous_s2` cells) counts its
# two blocks per SM from TWO_STAGE_CO_RESIDENT_MIN_TILES tiles: a second block is its only second tile in flight.
# Measured on the H200 (docs/decode-h200/e4m3_issue/short_counts.json, every count of 1-8 forced, 2k-6k keys, B4-16,
# 32/8, 8/1 and 32/32 heads): at 16-48 tiles the counts of two per SM ran 1.01-1.12x the counts of one (B8 32/8 at 6k
# keys 40.8 -> 36.4 us in 4 slices against 2; B4 32/32 at 6k 67.5 -> 61.0 in 2 against 1), B16 32/8 at 2k 0.99x;
# the 3-stage cell ran within 1 % either way (its default count stays). Through the entry point, where the table serves
# the 2-stage cells: 1.04-1.18x (docs/decode-h200/e4m3_issue/entry/).
TWO_STAGE_CO_RESIDENT_MIN_TILES = 16
# A combine-kernel cell's spec may set slice_cost_from_tiles: from that many tiles its calls take
# the slice-cost count; the wave rule cut few KV heads into 64-128 two-tile slices whose partials the combine
# kernel reads one split after another. Measured on the H200, every count forced, the old pick against the new in
# alternating rounds (docs/decode-h200/split_rule/combine_kernel_slice_cost.json and combine_kernel_rule_check.json):
# from 128 tiles the slice cost was faster in 60 of 68 d64, d128 and d256 bf16 cells (d128 B1 8/1 at 32k keys
# 24.5 -> 18.9 us in 32 slices against 128; B2 32/1 at 16k 20.1 -> 18.0) and slower in 8 by 0.8-4.6 % (d256
# B1 32/1 at 32k, 43 slices against 64); below 128 tiles it was mixed and below 64 slower (2k-4k keys: 8-11
# slices lost to 16 by up to 11 %); for d96 bf16 (a 4-stage ring) 5-21 % slower at 16k-32k keys, for MLA 2-21 % slower, and for the e4m3
# cells slower at one or two KV heads (B1 8/1 at 128k 31.7 -> 34.6), so those leave it at 0.
# The e4m3 combine-kernel cells (two blocks per SM) keep the wave rule but count both blocks on the grids and
# caches of COMBINE_KERNEL_CO_RESIDENT (blocks, tiles; either pair): that won on every grid of 16 blocks from 128
# tiles (d128 B2 32/8 at 32k keys 52.1 -> 45.0 us in 16 slices, at 128k 175.2 -> 140.6; d256 B2 32/8 at 32k
# 113.6 -> 96.2; d64 B8 32/1 at 128k 107.7 -> 80.7) and of 8 from 256 tiles (d128 B1 32/8 at 128k 94.6 -> 79.9
# in 31); it lost at 8 blocks and 128 tiles (d128 B1 32/8 at 16k 21.3 -> 22.8) and at 64 tiles of d256 (4k
# keys: 1.6-5.6 %), and at 64 tiles of d64 and d128 gained 0-5 %, left out with d256's loss. Grids of 32 blocks
# and more from 64 tiles (the merging cells' CO_RESIDENT_MIN_BLOCKS and _TILES, which these cells had taken before)
# keep the count (the sweep above timed grids of 8 and 16 blocks, and this pair fell out with it): counted, all 56
# grids of d64, d128 and d256 where the two counts differ ran 1.07-1.42x faster, both forced (d128 B8 32/8 from pages
# of 16 at 8k keys 56.3 -> 47.1 us in 4 slices against 2; through the entry point 65.5 -> 43.8;
# docs/decode-h200/e4m3_routing/co_resident_64.json, entry_before1.json, entry_after1.json).
COMBINE_KERNEL_CO_RESIDENT = ((CO_RESIDENT_MIN_BLOCKS, CO_RESIDENT_MIN_TILES), (16, 128), (8, 256))

# A combine part may hold a second, wide function (decode_mla's): narrower column slices per warp and more
# splits loaded at a time, for calls whose few rows each merge many splits. Calls of WIDE_COMBINE_MIN_SPLITS
# splits or more launch it. Measured on the H200 (MLA, bf16; the combine kernel's device time from torch.profiler,
# the two functions alternating in one process; docs/decode-h200/mla_combine/after_{1,2}.json): from 31 splits the
# wide function merged faster in every cell (B1 16 heads at 32k keys, 128 splits: 9.1 -> 4.9 us; B1 64 heads, 64
# splits: 12.7 -> 7.4; B1 128 heads, 31 splits: 9.1 -> 6.5; B4 16 heads, 32 splits: 4.6 -> 3.7); at 16 splits
# and fewer it was slower (B8 16 heads, 16 splits: 3.7 -> 4.1; 4 splits: 3.8 -> 6.4).
WIDE_COMBINE = "combine_wide"
WIDE_COMBINE_MIN_SPLITS = 31

MERGING = KeySuffix("_merging")   # function key (and name) suffix of a mask's merging split function (combine: auto)
merging_key = MERGING.key


# A serving step's decode rows (core.decode_plan.STEP_ROW_FIELDS): function key (and name) suffix of the split and combine
# functions that read each sequence's single query at its packed row (query_rows) and write its output there.
STEP_ROWS = KeySuffix("_rows")
rows_key = STEP_ROWS.key


def split_key(combine: str, mask: str, splits: int, step_rows: bool = False) -> str:
    """The split function a decode call of `splits` slices launches for `mask` (`combine`: the
    plan's; auto has a merging function per mask beside the plain one); step_rows: a serving step's
    decode rows function of that mask."""
    key = merging_key(mask) if splits > 1 and combine == "auto" else mask
    return rows_key(key) if step_rows else key


def merges_in_kernel(combine: str, splits: int) -> bool:
    """The split kernel a decode call launches merges the splits itself (no combine launch)."""
    return splits > 1 and combine != "kernel"


def row_blocks(plan, heads: int, kv_heads: int, seqlen_q: int) -> int:
    """Blocks of block_m group rows per KV head."""
    return -(-(heads // kv_heads) * seqlen_q // plan.block_m)


def visited_tiles(n_tiles: int, block_n: int, seqlen_q: int, left: int) -> int:
    """The most K/V tiles one block of a sequence visits under a window of `left` keys (>= 0) before
    each new token: its seqlen_q tokens see seqlen_q + left keys ending at the sequence's end, which
    span at most one tile more than they fill; never more than the cache's n_tiles."""
    return min(n_tiles, -(-(seqlen_q + left) // block_n) + 1)


def num_splits(blocks: int, n_tiles: int, sm_count: int, blocks_per_sm: int, max_splits: int,
               in_flight: int = 0, min_slice_tiles: int = 1, least_slice_cost: bool = False) -> int:
    """How many key slices a decode call cuts. `blocks` = batch x kv_heads x row_blocks; no slice is
    empty for the longest sequence (n_tiles tiles). One slice when the blocks already fill 0.8 of the
    slots, or keep IN_FLIGHT_PER_SM bytes of K/V in flight per SM (`in_flight`: bytes one block has in
    flight, its ring's stages ahead of the one it computes). `least_slice_cost` (the split kernel merges
    the slices, or a combine-kernel call of a long cache): the count of least slice_cost. Otherwise the
    wave rule: the fewest slices whose wave efficiency (blocks in flight / slots of the last wave) is
    within WAVE_EFFICIENCY of the best; where that cuts one-tile slices and `min_slice_tiles` > 1, the
    slices take at least `min_slice_tiles` tiles if SHORT_CACHE_SLICES of them remain, else at most
    SHORT_CACHE_SLICES of one tile, unless the cache has at most ONE_TILE_CACHE_TILES tiles and its one-tile
    slices fill at most ONE_TILE_GRID_SHARE of the slots."""
    slots = sm_count * blocks_per_sm
    if blocks >= 0.8 * slots or blocks * in_flight >= IN_FLIGHT_PER_SM * sm_count:
        return 1
    cap = min(max_splits, n_tiles)
    if cap <= 1:
        return 1
    if least_slice_cost:
        return min(_slice_counts(n_tiles, cap), key=lambda s: (slice_cost(blocks, n_tiles, slots, s), s))
    splits = _wave_splits(blocks, n_tiles, slots, cap)
    short_and_sparse = n_tiles <= ONE_TILE_CACHE_TILES and blocks * splits <= ONE_TILE_GRID_SHARE * slots
    if min_slice_tiles > 1 and splits > 1 and -(-n_tiles // splits) == 1 and not short_and_sparse:
        splits = _wave_splits(blocks, n_tiles, slots,
                              min(cap, max(SHORT_CACHE_SLICES, n_tiles // min_slice_tiles)))
    return splits


def co_resident_thresholds(kernel_combine: bool, min_tiles: int = 0) -> tuple[tuple[int, int], ...]:
    """The (blocks, tiles) pairs from either of which a cell of co-resident blocks counts them all:
    COMBINE_KERNEL_CO_RESIDENT for a combine-kernel cell, else CO_RESIDENT_MIN_BLOCKS and the plan's
    co_resident_min_tiles (0: CO_RESIDENT_MIN_TILES)."""
    if kernel_combine:
        return COMBINE_KERNEL_CO_RESIDENT
    return ((CO_RESIDENT_MIN_BLOCKS, min_tiles or CO_RESIDENT_MIN_TILES),)


def split_blocks_per_sm(co_resident_blocks: int, blocks: int, n_tiles: int, kernel_combine: bool = False,
                        min_tiles: int = 0) -> int:
    """The blocks per SM num_splits counts for a call of `blocks` blocks over `n_tiles` tiles
    (co_resident_thresholds)."""
    if any(blocks >= least_blocks and n_tiles >= least_tiles
           for least_blocks, least_tiles in co_resident_thresholds(kernel_combine, min_tiles)):
        return co_resident_blocks
    return 1


# A split kernel launched as a programmatic dependent of the kernel ahead may have its blocks placed while that
# kernel's blocks still run: where two of its blocks fit an SM, the placement can put two of one call's blocks on
# one SM and leave another SM without any, and a grid of no more blocks than SMs then ends with its doubled SMs
# (where the blocks landed was not read; a block too large to share an SM removed the loss).
# Such a launch asks for more than half an SM's shared memory (lone_block_smem), so that no two of its blocks share
# one. Measured on the H200 (docs/decode-h200/pdl_packing/smem_floor.json, fp16 queries, 128 blocks, the same bits):
# the e4m3 d128 3-stage cell back to back 49.98 -> 40.77 us at B16 32/8, 4096 keys (launched the usual way 42.01),
# 28.31 -> 23.26 at 2048, B8 32/8 at 4096 keys in 2 slices 30.91 -> 26.22; the d64 cell 23.18 -> 21.90 at B8 32/8
# in 2 slices and level at one (34.29 -> 34.18); timed one call at a time or after a torch op (a decode step),
# 0.993-1.011x.
def lone_block_smem(smem_dynamic: int, smem_per_sm: int, reserved: int, smem_optin: int | None = None) -> int:
    """The dynamic shared memory a block asks for so that no second block fits its SM (each takes its bytes
    and `reserved`): `smem_dynamic` where that is already so, where the block has no dynamic shared memory,
    where the SM's size is not known (0), or where a block may not opt into that much (`smem_optin`)."""
    if not smem_dynamic or not smem_per_sm:
        return smem_dynamic
    alone = max(smem_dynamic, smem_per_sm // 2 - reserved + 1)
    return smem_dynamic if smem_optin is not None and alone > smem_optin else alone


def launches_alone(programmatic: bool, blocks: int, sm_count: int) -> bool:
    """A split launch asks for lone_block_smem: launched as a programmatic dependent, over no more blocks than
    SMs (a larger grid needs its blocks to share SMs)."""
    return programmatic and blocks <= sm_count


def slice_cost(blocks: int, n_tiles: int, slots: int, splits: int) -> float:
    """The time of a call cut into `splits` slices, in K/V-tile times, where the split kernel merges
    (see SLICE_FIXED_TILES)."""
    waves = -(-blocks * splits // slots)
    merge = MERGE_TILES_PER_PARTIAL * max(0, splits - FREE_PARTIALS)
    return waves * (SLICE_FIXED_TILES + -(-n_tiles // splits)) + merge


def _slice_counts(n_tiles: int, cap: int) -> list[int]:
    """The split counts of 1..cap that give distinct schedules: each the fewest slices of its length."""
    return [s for s in range(1, cap + 1) if s == 1 or -(-n_tiles // s) != -(-n_tiles // (s - 1))]


def _wave_splits(blocks: int, n_tiles: int, slots: int, cap: int) -> int:
    """num_splits' wave rule over 1..cap slices."""
    if cap <= 1:
        return 1

    def efficiency(s: int) -> float:
        waves = blocks * s / slots
        return waves / math.ceil(waves)

    counts = _slice_counts(n_tiles, cap)
    best = max(efficiency(s) for s in counts)
    return next(s for s in counts if efficiency(s) >= WAVE_EFFICIENCY * best)


def split_rule_text(combine: str, in_flight: int = 0, co_resident_blocks: int = 1, slice_cost_min_tiles: int = 0,
                    co_resident_min_tiles: int = 0) -> str:
    """How a plan's runtime picks its split count, for `attngen explain` and the generated headers."""
    slice_cost_text = (f"the count of least slice cost, waves x ({SLICE_FIXED_TILES:g} + tiles per slice) + "
                       f"{MERGE_TILES_PER_PARTIAL:g} per partial past {FREE_PARTIALS}")
    if combine == "kernel":
        text = (f"the fewest whose wave efficiency is within {WAVE_EFFICIENCY:.0%} of the best (num_splits); where "
                f"those are slices of one K/V tile, slices of {COMBINE_KERNEL_MIN_SLICE_TILES} tiles if "
                f"{SHORT_CACHE_SLICES} of them remain (the combine kernel merges them), unless the cache has at most "
                f"{ONE_TILE_CACHE_TILES} tiles and one-tile slices fill at most {ONE_TILE_GRID_SHARE:.0%} of the SMs")
        if slice_cost_min_tiles:
            text = f"{slice_cost_text} where the cache has {slice_cost_min_tiles} tiles or more; below, {text}"
    else:
        text = f"{slice_cost_text} (num_splits: the split kernel merges)"
    if in_flight:
        text += (f", or none once the blocks keep {IN_FLIGHT_PER_SM // 1024} KiB of K/V per SM in flight "
                 f"({in_flight // 1024} KiB per block)")
    if co_resident_blocks > 1:
        where = " or ".join(f"{b} blocks or more and the cache {t} tiles or more"
                            for b, t in co_resident_thresholds(combine == "kernel", co_resident_min_tiles))
        text += f"; {co_resident_blocks} blocks per SM counted (and no in-flight rule) where the grid has {where}"
    return text


# -- backward -------------------------------------------------------------------------------------

ROW_THREADS = 128           # threads per block of the preprocess and convert kernels
VECTOR = 8                  # elements each of their threads reads per row (one 16-byte vector)

DETERMINISTIC = KeySuffix("_deterministic")   # function key (and name) suffix of a mask's deterministic main function
deterministic_key = DETERMINISTIC.key
GROUP_SPLIT = KeySuffix("_group_split")   # ... of a mask's GQA main function: a KV head's query heads split over blocks
group_split_key = GROUP_SPLIT.key
KV_CONVERT = "kv_convert"   # the convert part's function (key) that turns the group-split dK and dV sums into dk, dv
DQ_CONVERT, DQ_CONVERT_PAIRS = "convert", "convert_pairs"   # the convert part's dQ functions (dq_convert)


def dq_convert(mask: str, pair_masks: tuple[str, ...]) -> str:
    """The convert function that reads the dQ accumulator of a main function running `mask`:
    convert_pairs where that mask's functions add dQ in register-pair order (pair_masks), else
    convert (register order, or a row's columns in order)."""
    return DQ_CONVERT_PAIRS if mask in pair_masks else DQ_CONVERT

# GQA/MQA backward (a plan with group-split functions). A block of the unsplit grid walks every query
# head of its KV head; group_splits() divides that walk over `splits` blocks, whose dK and dV go into
# fp32 sums (zeroed, `splits` reduce-adds per element, read back by kv_convert).
#
# Key rows per SM the split grid aims for: 1024, i.e. 8 blocks of 128 keys (d64, d128) or 16 of 64
# (d256) per SM. Measured on the H200 (132 SMs, bf16, docs/measurements/gqa_backward.py, every split
# count of 16 shapes, docs/backward-h200/group_split_rule/): the best causal split put 1024 blocks of
# 128 keys or 2048 of 64 keys on the grid; a full mask's equal walks were best unsplit once the grid
# held a block per two SMs.
GROUP_SPLIT_KEY_ROWS_PER_SM = 1024
# What a split buys and what it costs, in steps. A step is one query block of one head against the
# block's keys: 2^20 multiply-adds a product in the cells measured (block_m x block_n x head_dim =
# 64 x 128 x 128, 128 x 128 x 64 or 64 x 64 x 256). The d64 members with 64-row query blocks count
# twice the steps, each half the size, so their gain is overstated (unmeasured).
# - The gain is balance. With uneven walks (causal), the grid ends about half the longest block's
#   walk after its mean, and splitting divides the longest walk (group x query blocks steps) by
#   `splits`.
# - The cost is the sums' traffic: zeroing, `splits` reduce-adds, the convert's read. That is
#   (splits + 2) x 8 B per key row x head_dim x KV head, spread over the SMs.
# The measured cells put a step's time at about 200 KiB of that traffic per SM. At 32x16/4x512x128
# causal the split (gain 8 steps, cost 9.9) was 18 % slower than the unsplit grid; at 32x16/2x512x256
# causal (gain 24, cost 15) it was 16 % faster.
GROUP_SPLIT_SUM_BYTES_PER_STEP = 200 * 1024
# Blocks per SM from which an uneven (causal) unsplit grid is left whole: its many walks of every
# length already even out. Measured: at 1024 blocks (7.8 per SM) the unsplit grid was level with a
# split of 2 at d128 (4x32/8x4096) and 1.7-2.2 % ahead of it at d256 (8x16/4x2048, 2x16/4x8192,
# 1x16/4x16384); at 512 blocks (3.9 per SM) a split was ahead wherever the sums paid (above).
GROUP_SPLIT_WHOLE_WAVES = 6
# Blocks per SM a split must reach where the unsplit grid already has a block on GROUP_SPLIT_MOST_SMS
# of the SMs and the split takes it past one wave: such a split adds the sums and a tail of its own,
# which group_split_pays does not see. Measured (docs/backward-h200/group_split_rule/gqa_gemma.json,
# gqa_zoo_shapes.json): Gemma 3's global layers (2x16/8x1024 causal, group 2) at d128, 128 blocks split
# in 2 to 256, 148 µs unsplit against 173; at d256, 256 blocks to 512 (3.9 per SM), 252 against 277;
# Llama 3 8B's (2x32/8x1024x128 causal, 128 blocks) 221 unsplit, 274 split in 2, 232 in 4 (512 blocks).
# Where such a grid gained, the rule's target split reached 7.8 per SM (2x32/4x2048x128 causal: 128
# blocks to 1024, 542 µs against 698 unsplit; 4, at 3.9 per SM, was level at 540 but is not the
# target's pick). A grid of few blocks (a short sequence, or Qwen3's 2x32/2x1024: 32 blocks) still splits.
GROUP_SPLIT_MIN_WAVES = 4
GROUP_SPLIT_MOST_SMS = 0.75


def group_splits(group: int, kv_heads: int, batch: int, seqlen_q: int, seqlen_k: int, sm_count: int, *,
                 block_m: int, block_n: int, head_dim: int, uneven: bool = True) -> int:
    """How many blocks share each (key block, KV head, batch)'s query heads: the divisor of the group
    (query heads per KV head) whose grid comes nearest GROUP_SPLIT_KEY_ROWS_PER_SM key rows per SM (by
    ratio; the smaller on a tie), with two checks. Where the unsplit grid has a block on
    GROUP_SPLIT_MOST_SMS of the SMs, the split must reach GROUP_SPLIT_MIN_WAVES blocks per SM or stay
    within one wave. With `uneven` walks (the mask makes them differ: causal, a window), the balance it
    buys must outweigh the sums' traffic (group_split_pays). An uneven grid of GROUP_SPLIT_WHOLE_WAVES
    blocks per SM, or an even one of a block per two SMs, is left whole, its walks already balanced.
    1 (the unsplit grid, no dK/dV sums) for MHA and for a grid of no blocks."""
    blocks = -(-seqlen_k // block_n) * kv_heads * batch
    if group == 1 or blocks == 0 or blocks >= (GROUP_SPLIT_WHOLE_WAVES * sm_count if uneven else sm_count / 2):
        return 1
    target = GROUP_SPLIT_KEY_ROWS_PER_SM * sm_count / block_n
    splits = min((s for s in range(1, group + 1) if group % s == 0),
                 key=lambda s: abs(math.log(blocks * s / target)))
    if blocks >= GROUP_SPLIT_MOST_SMS * sm_count and sm_count < blocks * splits < GROUP_SPLIT_MIN_WAVES * sm_count:
        return 1
    if uneven and not group_split_pays(splits, group * -(-seqlen_q // block_m),
                                       kv_accum_floats(batch, kv_heads, seqlen_k, head_dim) * 4, sm_count):
        return 1
    return splits


def group_split_pays(splits: int, longest_walk: int, sum_bytes: int, sm_count: int) -> bool:
    """Whether splitting uneven walks `splits` ways gains more steps than the sums cost: the grid's end
    moves by half the longest walk's cut, longest_walk / 2 x (1 - 1 / splits); the sums' traffic,
    (splits + 2) x sum_bytes over the SMs, costs a step per GROUP_SPLIT_SUM_BYTES_PER_STEP."""
    gain = longest_walk / 2 * (1 - 1 / splits)
    cost = (splits + 2) * sum_bytes / sm_count / GROUP_SPLIT_SUM_BYTES_PER_STEP
    return gain > cost


def kv_accum_floats(batch: int, kv_heads: int, seqlen_k: int, head_dim: int) -> int:
    """fp32 elements of the group-split call's dK and dV sums: (batch, kv_heads, seqlen_k, head_dim)
    each, dK's then dV's, after the dQ accumulator in the same buffer."""
    return 2 * batch * kv_heads * seqlen_k * head_dim


def lanes_per_row(head_dim: int) -> int:
    """Threads of a preprocess or convert block per query row: head_dim / VECTOR, rounded up to a power
    of two (a row's threads are adjacent lanes that sum by XOR shuffles); those past head_dim / VECTOR
    (head_dim 96: 12 of 16) idle."""
    return 1 << (head_dim // VECTOR - 1).bit_length()


def rows_per_row_block(head_dim: int) -> int:
    """Query rows one preprocess or convert block covers: ROW_THREADS threads, lanes_per_row each."""
    return ROW_THREADS // lanes_per_row(head_dim)


def query_blocks(seqlen_q: int, block_m: int) -> int:
    """Query blocks per (batch, head): the dq_turns counters of one head."""
    return -(-seqlen_q // block_m)


def accum_rows(plan, seqlen_q: int) -> int:
    """Rows of the fp32 dQ accumulator per (batch, head): seqlen_q, rounded up to whole query blocks
    where the kind's main kernel adds whole blocks (the plan's accum_row_block)."""
    block = plan.accum_row_block
    return -(-seqlen_q // block) * block


def varlen_accum_rows(plan, total_q: int, sequences: int) -> int:
    """Rows of the fp32 dQ accumulator per head in a varlen call: total_q; or, where the kind adds
    whole query blocks, a run of blocks per sequence starting at block (its first row's block + its
    index), so that no two sequences share a block: (blocks of total_q + sequences) blocks. The
    deterministic turn counters are laid out the same way."""
    block = plan.accum_row_block
    return total_q if block == 1 else (-(-total_q // block) + sequences) * block


def row_grid(head_dim: int, batch: int, heads: int, rows: int) -> tuple[int, int, int]:
    """The grid of the preprocess and convert kernels over `rows` rows per (batch, head) (the
    accumulator's, which cover seqlen_q): (row blocks, heads, batch)."""
    return (-(-rows // rows_per_row_block(head_dim)), heads, batch)


# The largest page the paged kernels read (decode, and the varlen prefill through block_table; a power of two). Keys are 32-bit and a tile's rows are
# gathered one by one, so nothing in the kernel bounds it; this is the range the tests cover (FlashAttention's
# tests use pages of 1, 4, 128, 256 and 512 keys, vLLM 1 to 128 (16 by default), SGLang 1).
MAX_PAGE_SIZE = 512


def page_shift(page_size: int) -> int | None:
    """log2 of a page size the paged kernels read (a power of two from 1 to MAX_PAGE_SIZE), else
    None. A power of two divides by a shift and a mask, given at run time (page_shift, page_size - 1)."""
    if isinstance(page_size, bool) or not isinstance(page_size, int) or not 1 <= page_size <= MAX_PAGE_SIZE \
            or page_size & (page_size - 1):
        return None
    return page_size.bit_length() - 1


def page_box_rows(block_n: int) -> int:
    """The most rows a paged tile's TMA copy moves: the largest power of two that divides block_n (copies of
    one size tile it), at most 256 (a TMA box dimension's limit). A call's pages of fewer keys take copies of
    one page each (the kernel's box_shift). The plan's fragments and a call's tensor maps both take it."""
    return min(block_n & -block_n, 256)
