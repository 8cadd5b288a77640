"""The spec model every wgmma forward kind builds on, and its rules: warpgroups, swizzled panels,
the register split, schedules. A kind adds its fragment (the `mma` key) and its element types."""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from ...core.spec_keys import ForwardSpec, Strict, refuse, round_up, rule_head_dim_vector_loads, rule_threads
from ...core.wgmma import (ROWS_PER_WARPGROUP, WARPGROUP, panel_swizzle, rule_swizzle_panels,  # noqa: F401 (plan and space
                           rule_target_has_sm90a)                                              # take the first two from here)
from ...targets import TARGETS


FRAGMENT = "wgmma_m64nNk16"   # the `mma` value that picks the kind (k32 steps on e4m3)
MAX_N = 256                # wgmma N
# Registers a consumer thread needs beside its S and O accumulators (addresses, softmax), by schedule.
# Measured as the most accumulators that compile without spills at a consumer cap of 160 (three
# consumer warpgroups, sm_90a, nvcc 13.0), d64: sequential block_n 176 none, 192 24 B; overlapped
# (S of the next tile beside P of this one) block_n 128 none, 144 96 B.
ACCUMULATOR_MARGIN = 40
OVERLAP_MARGIN = 64


class Registers(Strict):
    """Registers per thread of each role after setmaxnreg (multiples of 8, 24 to 256)."""

    producer: int = Field(ge=24, le=256, description="registers per producer thread (setmaxnreg.dec)")
    consumer: int = Field(ge=24, le=256, description="registers per consumer thread (setmaxnreg.inc)")


def tile_dim(s) -> int:
    """Columns of the Q, K and V tiles: head_dim rounded up to whole panels (TMA fills the columns
    past head_dim with zeros, which add nothing to S and give O columns that are never stored).
    Every panel width divides 256, so the tiles stay within MAX_N wherever head_dim does."""
    return round_up(s.head_dim, panel_swizzle(s).columns(s.elem_bytes))


def tile_dim_v(s) -> int:
    """Columns of the V tiles and of O: head_dim_v (or head_dim) rounded up to whole panels."""
    return round_up(s.v_dim, panel_swizzle(s).columns(s.elem_bytes))


def rule_warpgroups(s):
    halves = s.schedule.key_halves
    if s.compute_warps % WARPGROUP or not 1 <= s.compute_warps // WARPGROUP // halves <= 3 or \
            s.compute_warps // WARPGROUP % halves:
        key = "warps.consumer" if s.producer_warps else "warps.compute"
        if halves > 1:
            return key, (f"with schedule.key_halves: {halves} each of 1 to 3 row groups of 64 query rows is {halves} "
                         f"warpgroups of 4 warps: use {4 * halves} or {8 * halves} (got {s.compute_warps})")
        return key, (f"{s.mma} computes in warpgroups of 4 warps: use 4, 8 or 12 (1 to 3 warpgroups, "
                     f"got {s.compute_warps})")
    if s.producer_warps not in (0, WARPGROUP):
        return "warps.producer", f"the producer is one warpgroup: use producer: 4 (got {s.producer_warps})"


def rule_block_m_rows(s):
    halves = s.schedule.key_halves
    need = ROWS_PER_WARPGROUP * (s.compute_warps // WARPGROUP) // halves
    if s.tile.block_m != need:
        shared = f" ({halves} warpgroups per row group, schedule.key_halves)" if halves > 1 else ""
        return "tile.block_m", (f"each consumer warpgroup owns {ROWS_PER_WARPGROUP} query rows (one m64 wgmma){shared}, so "
                                f"block_m must be {need} for {s.compute_warps} compute warps (got {s.tile.block_m})")


def rule_block_n(s):
    if s.tile.block_n % 16 or s.tile.block_n > MAX_N:
        return "tile.block_n", (f"must be a multiple of 16 (k16 steps of P.V) and at most {MAX_N} (the N of Q.K^T) "
                                f"for {s.mma} (got {s.tile.block_n})")


def rule_staged_output_fits_q(s):
    if s.epilogue != "registers" and s.epilogue_tile == "q" and panel_swizzle(s) and tile_dim_v(s) > tile_dim(s):
        return "epilogue", (f"the {s.epilogue} epilogue stages O in the Q tile, {tile_dim(s)} columns wide, but O has "
                            f"{tile_dim_v(s)} (head_dim_v {s.v_dim}): use epilogue: registers")


def rule_q_tiles(s):
    if s.schedule.q_tiles > 1 and not s.schedule.persistent:
        return "schedule.q_tiles", ("a second Q tile holds the next query block of a persistent block; without "
                                    "schedule.persistent: true each block has one: use q_tiles: 1")


def rule_item_overlap(s):
    if not s.schedule.item_overlap:
        return None
    missing = [key for key, ok in (("schedule.persistent: true", s.schedule.persistent),
                                   ("schedule.overlap: true", s.schedule.overlap),
                                   ("schedule.q_tiles: 2", s.schedule.q_tiles == 2),
                                   ("epilogue: tma (or shared)", s.epilogue != "registers")) if not ok]
    if missing:
        return "schedule.item_overlap", ("a block's rows of O are written out from a staging tile while the next query "
                                         "block's first S = Q.K^T (from the other Q tile of a persistent block, on the "
                                         "overlapped schedule) runs; set " + " and ".join(missing)
                                         + ", or item_overlap: false")


def rule_middle_pairs(s):
    if s.schedule.middle_pairs and not s.schedule.persistent:
        return "schedule.middle_pairs", ("two heads' middle query blocks share a unit of a persistent block's walk; "
                                         "set schedule.persistent: true, or middle_pairs: false")


def rule_short_first(s):
    if s.schedule.short_first and not s.schedule.persistent:
        return "schedule.short_first", ("the order of a unit's two query blocks in a persistent block's walk; "
                                         "set schedule.persistent: true, or short_first: false")


def rule_longest_alone(s):
    if s.schedule.longest_alone and not s.schedule.persistent:
        return "schedule.longest_alone", ("how a persistent block's walk splits an odd ramp into units; "
                                          "set schedule.persistent: true, or longest_alone: false")


def rule_snake(s):
    if not s.schedule.snake:
        return None
    if not s.schedule.persistent:
        return "schedule.snake", ("how a persistent block's walk deals out the query blocks; "
                                  "set schedule.persistent: true, or snake: false")
    units = [key for key in ("longest_alone", "short_first") if getattr(s.schedule, key)]
    if units and not s.schedule.middle_pairs:
        return "schedule.snake", (f"the snake alone deals single query blocks, so there are no units for "
                                  f"{', '.join(units)} to shape; set middle_pairs: true (the walk then chooses per "
                                  f"call between the snake and the units), {units[0]}: false, or snake: false")


def rule_snake_tail(s):
    if s.schedule.snake_tail and not (s.schedule.snake and s.schedule.middle_pairs and s.schedule.longest_alone):
        return "schedule.snake_tail", ("whole rounds of units, then the snake over the heads left: a choice of the "
                                       "walk between units and the snake; set schedule.snake, middle_pairs and "
                                       "longest_alone: true, or snake_tail: false")


def rule_key_halves(s):
    if s.schedule.key_halves == 1:
        return None
    missing = [key for key, ok in (("warps.producer: 4", s.producer_warps),
                                   ("schedule.overlap: false", not s.schedule.overlap),
                                   ("schedule.persistent: false", not s.schedule.persistent),
                                   ("varlen: false", s.varlen is False),
                                   ("softmax.kept_max_first: false", not s.softmax.kept_max_first),
                                   ("softmax.lazy_rescale: false", not s.softmax.lazy_rescale),
                                   ("masks without window (none, causal)", set(s.masks) <= {"none", "causal"}),
                                   ("no scores", not s.scores),
                                   # a stage's tiles must all fall to one half: its empty barrier counts that half's warps
                                   (f"smem.stages a multiple of {s.schedule.key_halves}",
                                    s.smem.stages % s.schedule.key_halves == 0)) if not ok]
    if s.dtype == "e4m3" or getattr(s, "paged", False):
        missing.append("16-bit, unpaged inputs")
    if missing:
        return "schedule.key_halves", ("a query block's key tiles split between two warpgroups of each row group, "
                                       "merged by their row maxima and sums before the epilogue, is generated for "
                                       "the sequential schedule of a non-persistent, producer-fed 16-bit block: set "
                                       + " and ".join(missing) + ", or key_halves: 1")


def rule_persistent_needs_padded_calls(s):
    # A varlen block computes one query block (kernel.cu.j2: kLoop = kPersistent && !kVarlen), so without
    # padded functions the key would change nothing but the description.
    if s.schedule.persistent and s.varlen == "only":
        return "schedule.persistent", ("a persistent block loops over the query blocks of padded calls, and a "
                                       "`varlen: only` cell has none (its varlen blocks take one query block "
                                       "each): remove schedule.persistent (with q_tiles and epilogue_tile), or "
                                       "set varlen: true")


def rule_awaiting_twins_need_padded_calls(s):
    # A varlen call's work is not known on the host, so varlen functions get no twin
    # (core.forward_plan.awaiting_twin_functions): on a `varlen: only` cell the key would change nothing.
    if s.schedule.awaiting_twins and s.varlen == "only":
        return "schedule.awaiting_twins", ("awaiting twins are made for the padded calls' entry points, and a "
                                           "`varlen: only` cell has none: remove schedule.awaiting_twins, or set "
                                           "varlen: true")


def rule_epilogue_tile(s):
    if s.epilogue_tile != "q" and s.epilogue == "registers":
        return "epilogue_tile", "the registers epilogue stages nothing: use epilogue: shared or tma, or epilogue_tile: q"
    if s.epilogue_tile != "q" and not s.schedule.persistent:
        return "epilogue_tile", ("an own O tile lets a persistent block's producer load the next Q during the epilogue; "
                                 "without schedule.persistent: true nothing reuses Q: use epilogue_tile: q")
    if s.epilogue_tile == "own_in_turns":
        # The turns are a pair of named barriers between exactly two warpgroups that stage every item's rows.
        if s.compute_warps // WARPGROUP != 2 or s.schedule.key_halves > 1 or s.schedule.item_overlap or \
                s.epilogue != "tma":
            return "epilogue_tile", ("own_in_turns passes one warpgroup's tile between two consumer warpgroups that "
                                     "each store their own rows of every item by TMA: use epilogue: tma and warps: {producer: 4, "
                                     "consumer: 8} without schedule.key_halves or schedule.item_overlap, or "
                                     "epilogue_tile: own")


rule_async_copies = refuse(
    "smem.async_copy", lambda s: not s.smem.async_copy,
    lambda s: "TMA copies are asynchronous: set smem.async_copy: true", "rule_async_copies")
rule_q_in_shared = refuse(
    "smem.q_in_registers", lambda s: s.smem.q_in_registers,
    lambda s: "Q.K^T reads Q from shared memory (wgmma SS): set q_in_registers: false", "rule_q_in_shared")
rule_ring = refuse(
    "smem.stages", lambda s: s.smem.stages < 2,
    lambda s: "the K/V ring needs at least 2 stages", "rule_ring")
rule_max_chains = refuse(
    "softmax.max_chains", lambda s: s.softmax.max_chains != 1 and (s.tile.block_n % 32 or s.tile.block_n < 128),
    lambda s: (f"four chains need a row of at least 32 scores per thread, a multiple of 8 (block_n / 4); block_n "
               f"{s.tile.block_n} gives {s.tile.block_n // 4}: use block_n 128, 160, 192, ... or max_chains: 1"),
    "rule_max_chains")
rule_always_rescales = refuse(
    "softmax.rescale", lambda s: s.softmax.rescale != "always",
    lambda s: "rescale: on_max_change is not generated for wgmma; use always", "rule_always_rescales")


rule_softmax_block = refuse(
    "schedule.softmax_block", lambda s: s.schedule.softmax_block and not s.schedule.overlap,
    lambda s: ("the softmax's own block keeps it ahead of the wait for the previous tile's P.V, which only the "
               "overlapped schedule has: set schedule.overlap: true"),
    "rule_softmax_block")
rule_p_buffers = refuse(
    "schedule.p_buffers", lambda s: s.schedule.p_buffers == 2 and (not s.schedule.overlap or s.schedule.softmax_block),
    lambda s: ("a second P buffer is written while the previous tile's P.V reads the first, which only the overlapped "
               "schedule has: set schedule.overlap: true, or p_buffers: 1" if not s.schedule.overlap else
               "with two P buffers the softmax and P's fragments already run in a basic block of their own ahead of the "
               "previous tile's P.V: drop schedule.softmax_block"),
    "rule_p_buffers")
rule_kept_max_first = refuse(
    "softmax.kept_max_first", lambda s: s.softmax.kept_max_first and s.schedule.softmax_block,
    lambda s: ("P at the kept max is written into P.V's A registers as it is made, so it comes after the wait for "
               "the previous tile's P.V, where schedule.softmax_block puts the softmax ahead of it: remove one of "
               "the two"),
    "rule_kept_max_first")


def rule_pingpong(s):
    if s.schedule.pingpong and not s.schedule.overlap:
        return "schedule.pingpong", "ping-pong is generated on the overlapped schedule: set schedule.overlap: true"
    if s.schedule.pingpong and not s.producer_warps:
        return "schedule.pingpong", ("ping-pong is generated with a producer warpgroup (the homogeneous issuer "
                                     "would wait for stages inside its turn): use warps: {producer: 4, consumer: 8} "
                                     "(or 12)")
    if s.schedule.persistent and not s.producer_warps:
        return "schedule.persistent", ("a persistent block needs a producer warpgroup to load the next query "
                                       "block during the epilogue: use warps: {producer: 4, consumer: ...}")
    if s.schedule.pingpong and s.compute_warps not in (2 * WARPGROUP, 3 * WARPGROUP):
        return "schedule.pingpong", (f"ping-pong passes turns between two or three consumer warpgroups: use "
                                     f"warps.consumer: 8 or 12 (got {s.compute_warps})")


def entry_cap(s) -> int:
    """Registers per thread at entry with one block per SM: the register file over the block's
    threads, in the units of 8 that ptxas and setmaxnreg count in."""
    threads = 32 * (s.compute_warps + s.producer_warps)
    return TARGETS[s.target].regs_per_sm // threads // 8 * 8


def accumulator_margin(s) -> int:
    return OVERLAP_MARGIN if s.schedule.overlap else ACCUMULATOR_MARGIN


def consumer_need(s) -> int:
    """Registers a consumer thread needs: its S and O accumulators and the schedule's margin."""
    return s.tile.block_n // 2 + tile_dim_v(s) // 2 + accumulator_margin(s)


def need_text(s) -> str:
    return (f"S {s.tile.block_n // 2} + O {tile_dim_v(s) // 2} accumulators + {accumulator_margin(s)} "
            f"({'overlapped' if s.schedule.overlap else 'sequential'} schedule)")


def rule_registers(s):
    r = s.registers
    consumers = s.compute_warps // WARPGROUP
    need = consumer_need(s)
    if r is None:
        if need > entry_cap(s):
            return "registers", (f"a consumer thread needs about {need} registers ({need_text(s)}) but gets "
                                 f"{entry_cap(s)} at entry; {consumer_fix(s, entry_cap(s))}")
        return None
    if s.producer_warps == 0:
        return "registers", "setmaxnreg moves registers between roles: it needs a producer warpgroup"
    if consumers == 1:
        return "registers", ("with one consumer warpgroup the entry cap already gives it all it can take; leave "
                             "registers unset")
    if s.min_blocks_per_sm is not None:
        return "min_blocks_per_sm", ("setmaxnreg needs one block per SM (its register pool is the block's); "
                                     "leave min_blocks_per_sm unset")
    for role in ("producer", "consumer"):
        n = getattr(r, role)
        if n % 8:
            return f"registers.{role}", f"setmaxnreg takes a multiple of 8 (got {n}); try {n // 8 * 8}"
    cap = entry_cap(s)
    pool = cap * (consumers + 1)
    used = r.producer + consumers * r.consumer
    if used > pool:
        return "registers", (f"{r.producer} + {consumers} x {r.consumer} = {used} registers per warpgroup lane exceed "
                             f"the pool of {pool} ({consumers + 1} warpgroups x {cap}, the cap at entry for "
                             f"{32 * (s.compute_warps + s.producer_warps)} threads); lower registers.consumer to "
                             f"{(pool - r.producer) // consumers // 8 * 8}")
    if r.producer > cap or r.consumer < cap:
        return "registers", (f"the producer gives registers to the consumers: producer ({r.producer}) at most and "
                             f"consumer ({r.consumer}) at least the entry cap of {cap}")
    return consumer_short(s, r.consumer)


def most_consumer_registers(s) -> int:
    """The most registers setmaxnreg can give a consumer thread (the producer keeping 24); 0 where it
    cannot move any (no producer warpgroup, or one consumer warpgroup, which the entry cap serves)."""
    consumers = s.compute_warps // WARPGROUP
    if not s.producer_warps or consumers == 1:
        return 0
    return min(256, (entry_cap(s) * (consumers + 1) - 24) // consumers // 8 * 8)


def consumer_fix(s, consumer: int) -> str:
    """A value that fits: more consumer registers where setmaxnreg has them, else the widest tile
    that fits the registers a consumer can get."""
    need = consumer_need(s)
    most = most_consumer_registers(s)
    if most >= need:
        return (f"set registers: {{producer: 24, consumer: {round_up(need, 8)}}} to move the producer's registers "
                f"to the consumers (the pool allows up to {most})")
    fit_n = (max(consumer, most) - tile_dim_v(s) // 2 - accumulator_margin(s)) * 2 // s.key_unit * s.key_unit
    if fit_n >= s.key_unit:
        return f"use tile.block_n <= {fit_n}" + (" and registers: {producer: 24, consumer: %d}" % most
                                                  if most > consumer else "")
    return "use a smaller head_dim_v or fewer consumer warpgroups (O's accumulators alone leave no room)"


def consumer_short(s, consumer: int):
    """The set split's consumer registers hold what a consumer thread needs, or ptxas spills and
    serializes the wgmma (C7512): the same need as without registers set."""
    need = consumer_need(s)
    if consumer >= need:
        return None
    return "registers.consumer", (f"{consumer} registers per consumer thread, but it needs about {need} "
                                  f"({need_text(s)}), or ptxas spills and serializes the wgmma; "
                                  f"{consumer_fix(s, consumer)}")


class Schedule(Strict):
    """How a consumer warpgroup orders its GEMMs and softmax."""

    overlap: bool = Field(default=False, description=(
        "issue S = Q.K^T of tile t before O += P.V of tile t-1 and run the softmax of tile t while P.V "
        "runs; off: each GEMM is waited for before the next step"))
    softmax_block: bool = Field(default=False, description=(
        "give the softmax of tile t a basic block of its own, ahead of the wait for P.V of tile t-1 (a branch "
        "on the grid's width, which is never 0 and which ptxas cannot fold): otherwise ptxas schedules that wait "
        "(WARPGROUP.DEPBAR) at the top of the softmax's last block, and most of the softmax runs after P.V is "
        "done; needs overlap. It paid with one consumer warpgroup and cost with two or three (H200)"))
    q_descriptors: Literal["advanced", "rebuilt"] = Field(default="advanced", description=(
        "how a k-step's descriptor of Q is made: advanced, the warpgroup's Q descriptor plus the step's offset "
        "(as K's and V's are); rebuilt, each step's built from its address. The same values: only the code ptxas "
        "schedules differs. Rebuilt paid in the three-warpgroup e4m3 d64 cell (full masks 1.00-1.02x the cell "
        "before, advanced 0.98-1.00x; H200)"))
    pingpong: bool = Field(default=False, description=(
        "the consumer warpgroups take turns issuing their GEMMs (named barriers), so the others run their "
        "softmax while one's GEMMs use the tensor cores; needs overlap and 2 or 3 consumer warpgroups "
        "(three: two softmaxes under each warpgroup's GEMMs, where the softmax is the longer, as at d64)"))
    separate_kv_barriers: Optional[bool] = Field(default=None, description=(
        "K and V of a stage handed over on separate full/empty mbarriers, so K is refilled as soon as its "
        "S = Q.K^T is done; false: one pair per stage counts both (fewer arrivals per tile); unset: separate "
        "when the schedule overlaps (it needs only two stages then)"))
    p_buffers: Literal[1, 2] = Field(default=1, description=(
        "registers that hold P as P.V's A operand: 2 lets a warpgroup make tile t's P (with softmax.kept_max_first "
        "at its rows' kept maxima, else by the usual step) while P.V of tile t-1 still reads the other buffer, and "
        "wait for that P.V only afterwards, before O's rescale; needs overlap, not softmax_block (the two-buffer "
        "tile gives the softmax its own block itself). 1: tile t's P waits for that P.V"))
    persistent: bool = Field(default=False, description=(
        "launch one block per SM that loops over every query block: the producer loads the next block's "
        "Q and K/V while the consumers finish the last one (its epilogue); needs a producer warpgroup"))
    q_tiles: Literal[1, 2] = Field(default=1, description=(
        "Q tiles in shared memory: 2 lets a persistent block's producer load the next query block's Q "
        "while this one's K/V tiles still run (it waits for the Q tile used two query blocks before), "
        "rather than once this one's GEMMs are done; needs persistent"))
    item_overlap: bool = Field(default=False, description=(
        "a persistent block's consumers write a query block's rows of O out (staged, stored, the tile handed back) "
        "once the next query block's first S = Q.K^T (from the other Q tile) is issued, beside that GEMM, rather than "
        "ahead of it; the rows are finished and packed as soon as the last P.V is done. Needs persistent, overlap, "
        "q_tiles: 2 and a staged epilogue (tma or shared)"))
    middle_pairs: bool = Field(default=False, description=(
        "a persistent block's walk of causal and window calls may take heads in twos where a head's ramp is 3 or 5 "
        "query blocks: the first head's units, the second's, then one unit of the two heads' middle blocks, which "
        "then read K/V tiles that are still in L2; otherwise each middle block comes alone at the end, after every "
        "other head's tiles. The walk pairs them where the busiest block's work grows by at most 3 / (5 x ramp) "
        "(16x16x384x128 causal on an H100: 55.0 -> 44.9 us). Needs persistent"))
    short_first: bool = Field(default=False, description=(
        "a persistent block takes a unit's shorter query block first, then the longer one (which reads the same "
        "head's K/V tiles from the first again, a few tiles later, while they are still in L2); otherwise the longer "
        "first, whose shorter partner reads those tiles again only after the longer one's whole walk. Pays where "
        "what every SM streams through L2 during that walk evicts the tiles, as with d256's large K/V tiles (16x16x512 "
        "causal on an H100: 117.5 -> 108.5 us); at d128 and d192 it was slower. Needs persistent"))
    longest_alone: bool = Field(default=False, description=(
        "where a causal (or a window's) ramp of query blocks is odd, its longest block is a unit of a persistent "
        "block's walk alone and the blocks before it pair up, so every unit costs about the longest block and no "
        "middle block is left for the end of the walk, where it reads its head's K/V from memory again; otherwise "
        "pairs and a middle block. With middle_pairs the walk chooses per call: lone longest blocks where that gives "
        "the busiest block no more work (strictly less where middle_pairs would pair two heads' middle blocks), "
        "middle_pairs' walk otherwise (8x16x640x256 causal on an H100: 90.6 -> 77.7 us; 16x16x640 keeps its "
        "paired middles). Needs persistent"))
    snake: bool = Field(default=False, description=(
        "a persistent block's walk of causal calls deals the query blocks out one at a time, longest first (every "
        "head's last block, then every head's block before it, ...), to the resident blocks in a snake: forward in "
        "even rounds, backward in odd ones, so the blocks' loads come out about equal at any grid (3x16x768: 8 "
        "query blocks' work for the busiest block against the units' 14). A head's blocks then run far apart in "
        "time, so its K/V tiles are shared only by the resident blocks that hold the head at once. With "
        "middle_pairs the walk chooses per call: the snake where at least two resident blocks hold each head at "
        "once (heads x batch at most half the resident blocks) and the snake gives the busiest block a tenth less "
        "work than the units; the units otherwise (3x16x768x128 causal on an H100: 36.5 -> 26.5 us; more than 66 "
        "heads x batch on 132 SMs keep the units: the snake at 8x16 was 0.58-1.01x). "
        "Needs persistent; longest_alone and short_first only beside middle_pairs"))
    snake_tail: bool = Field(default=False, description=(
        "with snake beside middle_pairs and longest_alone: the walk may also take whole rounds of units (a head's "
        "longest block alone on an odd ramp, the others in pairs) over the first heads, then the snake over the "
        "heads left, where those are at most half the resident blocks, so grids of more heads x batch than that "
        "even out their last round too (6x16x768 on 132 SMs: the busiest block's work 21 query blocks with the "
        "units, 16 with one round of units over 44 heads and the snake over the other 52, against a mean of 15.3). Taken "
        "where it gives the busiest block a tenth less work than the units. Trial"))
    l2_hints: bool = Field(default=False, description=(
        "the TMA copies carry L2 eviction priorities: Q's loads and O's stores evict_first (each read or written "
        "once), K's and V's loads evict_last (a head's tiles are read again by each of its query blocks); paged K/V, "
        "V^T and even/odd K rows copy without a hint"))
    key_halves: Literal[1, 2] = Field(default=1, description=(
        "warpgroups per row group of 64 query rows: 2 splits a query block's key tiles between two warpgroups "
        "(even tiles and odd tiles), each with its own row maxima, sums and O, merged through shared memory before "
        "the epilogue; so a block of 128 rows runs four chains of GEMM and softmax, for grids of about one block per "
        "SM, where two chains leave the tensor cores idle. Needs a producer warpgroup and the sequential schedule "
        "(four consumer warpgroups get about 112 registers each); not persistent"))
    awaiting_twins: bool = Field(default=False, description=(
        "compile each entry point of a mask (not varlen) a second time, as a programmatic dependent: its first "
        "statement waits for the kernel ahead of it on the stream, so its blocks may be placed before that kernel "
        "ends. On sm_90 and up the runtime launches the twin for short calls (core.launch_rules."
        "launches_awaiting_twin: the hidden launch is worth 1-2 us there) and the usual entry point for long ones; "
        "the usual entry point's code stays as it was, instruction for instruction (the wait would move its main "
        "loops within their instruction-cache lines, which cost long calls up to 1 %)"))


class WgmmaForwardSpec(ForwardSpec):
    registers: Optional[Registers] = Field(
        default=None, description="registers per thread of each role after setmaxnreg; unset: no reallocation")
    schedule: Schedule = Schedule()
    epilogue_tile: Literal["q", "own", "own_in_turns"] = Field(default="q", description=(
        "where a staged epilogue (shared, tma) writes O: q = over the Q tile (no more shared memory; a "
        "persistent block's producer loads the next Q only once O was read out of it); own = a tile of its "
        "own (block_m x head_dim_v more shared memory; Q is handed back as soon as the block's GEMMs are done, "
        "so the next Q loads during the epilogue); own_in_turns = a tile of one warpgroup's 64 rows x head_dim_v, "
        "which the two consumer warpgroups take in turn (Q handed back as with own, for half the shared memory: "
        "where the whole tile does not fit, as at head_dim 192 and 256); own and own_in_turns need "
        "schedule.persistent"))
    epilogue: Literal["registers", "shared", "tma"] = Field(default="registers", description=(
        "how O leaves: registers = each thread stores its accumulator pairs (4-byte stores); shared = a "
        "consumer warpgroup writes its 64 normalised rows over its rows of the Q tile (swizzled like Q) "
        "and stores them with 16-byte coalesced stores; tma = the same staging, then one TMA bulk tensor "
        "store per panel"))
    key_unit = 16
    key_unit_why = "k16 steps of P.V"
    takes_head_dim_v = True
    masks_taken = ("none", "causal", "window", "expr")
    takes_scores = True
    takes_sinks = True
    takes_max_chains = True
    takes_fma_exp2 = True
    takes_lazy_rescale = True
    takes_kept_max_first = True
    rules = (rule_target_has_sm90a, rule_head_dim_vector_loads, rule_swizzle_panels, rule_staged_output_fits_q,
             rule_epilogue_tile, rule_q_tiles, rule_item_overlap, rule_middle_pairs, rule_short_first, rule_longest_alone, rule_snake, rule_snake_tail, rule_key_halves, rule_persistent_needs_padded_calls, rule_awaiting_twins_need_padded_calls,
             rule_warpgroups, rule_block_m_rows, rule_block_n, rule_async_copies, rule_q_in_shared, rule_ring, rule_always_rescales, rule_max_chains, rule_softmax_block, rule_kept_max_first, rule_p_buffers, rule_pingpong, rule_registers, rule_threads)

    def swizzled_row_chunks(self) -> int:
        panel = panel_swizzle(self)
        return panel.row_bytes // 16 if panel else super().swizzled_row_chunks()

    def register_need(self):
        return consumer_need(self), f"a consumer thread's {need_text(self)}"
