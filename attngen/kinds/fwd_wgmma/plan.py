"""The plan every wgmma forward kind builds: typed fragment numbers, the swizzled tiles and mbarriers,
TMA maps, explain."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ...core.abi import Abi
from ...core.fp8 import E4M3_MAX
from ...core.forward_plan import (ELEMENT_TYPES, FORWARD_ABI, ForwardPlan, Part, awaiting_twin_functions,
                                  forward_functions, launch_min_blocks, plan_abi, spec_variants)
from ...core.launch_rules import page_box_rows
from ...core.layout import (MBARRIER_BYTES, Barrier, Budget, Region, Swizzle, TileCopy, barrier_region, check_budget,
                            layout_regions, ring_stride)
from ...core.tensor_maps import TensorMapSpec, map_abi_fields
from ...core.varlen_plan import PAGED_VARLEN_ABI_FIELDS
from ...core.wgmma import PANEL_SWIZZLES, PanelSwizzle, swizzled_tile
from ...targets import TARGETS
from .spec import ROWS_PER_WARPGROUP, WARPGROUP, WgmmaForwardSpec, panel_swizzle, tile_dim, tile_dim_v


@dataclass(frozen=True, kw_only=True)
class WgmmaFragments:
    consumer_warpgroups: int
    producer_warpgroups: int
    tile_dim: int           # columns of the Q and K tiles: head_dim rounded up to whole panels
    tile_dim_v: int         # columns of the V tiles and of O: head_dim_v (or head_dim) in whole panels
    panels: int             # panels of tile_dim
    panels_v: int           # panels of tile_dim_v
    s_regs: int             # fp32 accumulators of S per thread (block_n / 2)
    o_regs: int             # fp32 accumulators of O per thread (tile_dim_v / 2)
    k_steps_qk: int         # k-steps of Q.K^T (tile_dim / k)
    k_steps_pv: int         # k-steps of P.V (block_n / k)
    k: int                  # the K of every wgmma: 32 bytes of elements (16 of 16-bit types, 32 of e4m3)
    mma_type: str           # the PTX type of its A and B operands (f16, bf16, e4m3)
    producer_registers: int  # after setmaxnreg (0: no reallocation)
    consumer_registers: int
    overlap: bool           # softmax of tile t runs while P.V of tile t-1 is in flight
    softmax_block: bool     # ... in a basic block of its own, so that ptxas keeps it ahead of P.V's wait
    q_steps_rebuilt: bool   # Q's k-step descriptors built from their addresses (else the warpgroup's + the offset)
    pingpong: bool          # the consumer warpgroups take turns issuing GEMMs (2 or 3 of them)
    panel_cols: int         # elements in one swizzled panel row (the TMA box width)
    panel_row_bytes: int    # bytes of one such row: 128, 64 or 32, the swizzle's span
    descriptor_mode: int    # the swizzle in bits 62-63 of a wgmma descriptor (1: 128B, 2: 64B, 3: 32B)
    swizzle_atom_bytes: int  # 8 panel rows: every descriptor's stride byte offset
    k_major_lbo_bytes: int  # leading byte offset of K-major Q and K (unused by the hardware with this swizzle)
    k_step_bytes: int       # a k-step inside a K-major panel (32 bytes)
    k_steps_per_panel: int
    v_lbo_bytes: int        # MN-major V: bytes between its panels (block_n rows)
    v_step_bytes: int       # MN-major V: a k16 step = 16 key rows
    vt: "TransposedV | None"  # e4m3: V comes transposed and is read K-major (None: V MN-major)
    k_even_odd: bool        # e4m3 k_rows even_odd: a K stage holds the tile's even keys, then its odd ones
    p_log2_offset: int      # P is kept 2^this larger (e4m3: inside its range; 0 otherwise)
    max_chains: int         # running maxima per row in the softmax's scan (spec.softmax.max_chains)
    fma_exp2: int           # of every 8 exponentials of a row, those on the FMA pipes (spec.softmax.fma_exp2)
    lazy_slack: float       # log2 units a tile's max may pass a row's kept max by (0: the max moves every tile)
    kept_max_first: bool    # P made at the rows' kept maxima, the tile's max scanned beside it (spec.softmax.kept_max_first)
    p_buffers: int          # register sets holding P for P.V (spec.schedule.p_buffers; 2: made while the last P.V runs)
    rows_per_warpgroup: int
    turn_threads: int       # threads counted by a ping-pong turn barrier (the waiting warpgroup and the passing one)
    turn_barrier: int       # the first named barrier of the ping-pong turns (one per consumer warpgroup)
    epilogue_barrier: int   # the first named barrier of the staged epilogue (one per consumer warpgroup)
    q_bytes: int            # TMA transaction bytes of the Q tile
    k_tile_bytes: int       # TMA transaction bytes of one K tile
    v_tile_bytes: int       # TMA transaction bytes of one V tile
    has_producer: bool      # false: homogeneous, a consumer thread also issues the copies
    separate_kv_barriers: bool  # K and V of a stage handed over on separate mbarriers (the overlapped schedule)
    issuer_thread: int      # the thread that issues every TMA copy
    epilogue: str           # registers, shared or tma (spec.epilogue)
    o_stage_offset: int     # byte offset of the tile a staged epilogue writes O to: the Q tile's, or O's own
    q_tiles: int           # Q tiles (schedule.q_tiles): a persistent block's i-th query block uses tile i % q_tiles
    q_tile_stride: int     # bytes from Q tile 0 to Q tile 1 (0: one tile)
    item_overlap: bool = False  # the next query block's first S issued before this block's epilogue (schedule.item_overlap)
    middle_pairs: bool = False  # the persistent walk may take two heads' middle ramp blocks as one unit (schedule.middle_pairs)
    longest_alone: bool = False  # an odd ramp's longest block a unit alone, the others in pairs (schedule.longest_alone)
    short_first: bool = False  # a persistent walk's unit takes its shorter query block first (schedule.short_first)
    snake: bool = False  # a persistent walk deals causal query blocks longest first in a snake (schedule.snake)
    snake_tail: bool = False  # ... or whole rounds of units first, the snake over the heads left (schedule.snake_tail)
    l2_hints: bool = False  # TMA copies with L2 eviction priorities (schedule.l2_hints)
    o_tile_in_turns: bool = False  # O's own tile holds one warpgroup's rows, the two taking it in turn (epilogue_tile)
    o_turn_barrier: int = 0  # o_tile_in_turns: named barrier o_turn_barrier + w: the tile is warpgroup w's
    key_halves: int = 1     # warpgroups per row group of 64 query rows, splitting the block's key tiles (schedule.key_halves)
    merge_barrier: int = 0  # key_halves 2: the first named barrier of the merge (one per row group)
    page_box_rows: int = 0  # paged: the most key rows one TMA copy of a page moves (0: not paged)
    page_copies: str = "first_lane"  # paged: who issues a tile's copies (spec.page_copies)

    @property
    def own_block(self) -> bool:
        """A step of the overlapped loop runs in a basic block of its own, ahead of the previous tile's P.V wait:
        the softmax (softmax_block) or P's making (two P buffers)."""
        return self.softmax_block or self.p_buffers == 2


@dataclass(frozen=True, kw_only=True)
class TransposedV:
    """The V^T tile of an e4m3 plan: tile_dim_v rows (V's head-dim columns) of block_n keys, in panels
    of one swizzled row of keys. wgmma reads it K-major, as Q.K^T reads K."""
    panel: PanelSwizzle     # the swizzle of its panels (row_bytes keys per row)
    panels: int             # panels of block_n keys
    panel_bytes: int        # bytes of one panel: tile_dim_v rows
    steps_per_panel: int    # k32 steps of P.V inside one panel

    @property
    def keys(self) -> int:
        return self.panel.row_bytes


def transposed_v(block_n: int, rows: int) -> TransposedV:
    """The widest panel swizzle whose rows tile block_n keys (bytes)."""
    panel = next(p for p in PANEL_SWIZZLES if block_n % p.row_bytes == 0)
    return TransposedV(panel=panel, panels=block_n // panel.row_bytes, panel_bytes=rows * panel.row_bytes,
                       steps_per_panel=panel.row_bytes // 32)


TURN_BARRIER = 1   # named barrier 1 + w: consumer warpgroup w's ping-pong turn (0 is __syncthreads)


def epilogue_barrier(consumers: int, pingpong: bool) -> int:
    """The first of the staged epilogue's named barriers (one per consumer warpgroup): after the
    ping-pong's turn barriers, 1 .. consumers, and at 3 wherever there are no more than two, as
    every plan before three-way turns had it."""
    return TURN_BARRIER + max(2, consumers if pingpong else 0)


def barriers(stages: int, consumer_warps: int, k_bytes: int, v_bytes: int, q_bytes: int, issuer: str,
             base: int, persistent: bool = False, separate_kv_barriers: bool = True,
             q_tiles: int = 1, warps_of: str = "each consumer warp") -> tuple[Barrier, ...]:
    """Split: full_k, full_v, empty_k, empty_v per stage, so K of a stage is refilled as soon as the S
    GEMM that read it is done (the overlapped schedule needs it). Otherwise full and empty per stage,
    for K and V together. Then q_full per Q tile (and q_empty per Q tile when persistent)."""
    out, at = [], base
    def copy(nbytes):
        return f"{issuer} (arrive.expect_tx {nbytes} B; TMA completes the bytes)"
    both = f"{k_bytes} B each" if k_bytes == v_bytes else f"{k_bytes} and {v_bytes} B"
    pairs = ((("full_k", 1, copy(k_bytes), "consumer threads"), ("full_v", 1, copy(v_bytes), "consumer threads"),
              ("empty_k", consumer_warps, f"lane 0 of {warps_of}, once its S = Q.K^T of the stage completed",
               issuer),
              ("empty_v", consumer_warps, f"lane 0 of {warps_of}, once its P.V of the stage completed", issuer))
             if separate_kv_barriers else
             (("full", 2, f"{issuer}, once for K and once for V (arrive.expect_tx {both})",
               "consumer threads"),
              ("empty", consumer_warps, f"lane 0 of {warps_of}, once its P.V of the stage completed", issuer)))
    for kind, arrivals, arrive, wait in pairs:
        for s in range(stages):
            out.append(Barrier(f"{kind}{s}", s, at, arrivals, arrive, wait))
            at += MBARRIER_BYTES
    def q_name(kind, q):
        return kind if q_tiles == 1 else f"{kind}{q}"
    for q in range(q_tiles):
        out.append(Barrier(q_name("q_full", q), q, at, 1, f"{issuer} (arrive.expect_tx {q_bytes} B)", "consumer threads"))
        at += MBARRIER_BYTES
    for q in range(q_tiles if persistent else 0):
        out.append(Barrier(q_name("q_empty", q), q, at, consumer_warps,
                           "lane 0 of each consumer warp, once every GEMM of its query block is done", issuer))
        at += MBARRIER_BYTES
    return tuple(out)


def epilogue_line(epilogue: str, own_tile: bool = False, barrier: int = 3, turn_barrier: int = 0) -> str:
    """The schedule's last step: how a consumer warpgroup writes its 64 rows of O (`barrier`: the
    first of the staged epilogue's named barriers; turn_barrier: O's own tile holds one warpgroup's rows, the
    first of the two named barriers that pass it)."""
    if turn_barrier:
        where = (f"into O's own tile of 64 rows in its turn (warpgroup 0 first; it waits on named barrier "
                 f"{turn_barrier} + w until the other warpgroup's rows were read out of it; swizzled like Q, 4-byte "
                 f"stores; Q went back before it)")
    elif own_tile:
        where = "into its rows of O's own tile (swizzled like Q, 4-byte stores; Q went back before it)"
    else:
        where = "over its rows of the Q tile (its last S GEMM has completed; swizzled like Q, 4-byte stores)"
    staging = (f"  epilogue: each consumer warpgroup normalises O and writes its 64 rows {where}, then syncs its 128 "
               f"threads on named barrier {barrier} + w; ")
    return {"registers": "  epilogue: each thread stores its normalised O pairs to global memory (4-byte stores)",
            "shared": staging + "its threads copy the rows out with 16-byte coalesced stores",
            "tma": staging + ("after fence.proxy.async its first thread issues one TMA store per panel "
                              "(rows past the sequence are dropped) and waits for the reads before the block exits")
            }[epilogue]


LAZY_SLACK_16BIT = 8.0   # a kept max lets 16-bit P reach 2^8: far inside fp16's and bf16's range, fp32 sums unharmed


def lazy_rescale_slack(spec: WgmmaForwardSpec, p_log2_offset: int) -> float:
    """softmax.lazy_rescale's slack: how many log2 units a tile's max may exceed a row's kept max before the row
    moves it (0 without the key). P is then at most 2^(p_log2_offset + slack): 16-bit P 2^8; e4m3 P, kept
    2^p_log2_offset larger already, what is left below its largest finite value, in eighths (0.75 at 8)."""
    if not spec.softmax.lazy_rescale:
        return 0.0
    if spec.dtype != "e4m3":
        return LAZY_SLACK_16BIT
    return math.floor((math.log2(E4M3_MAX) - p_log2_offset) * 8) / 8


# A paged plan's K and V maps address a page by its id (the pools' page stride is in the maps), so its Params
# carries none of the pools' strides; a plan that gathers paged tiles with cp.async reads the pools' pointers and
# strides instead (a page and a row within it: no batch stride).
PAGE_STRIDES = ("k_page_stride", "v_page_stride")


def unread_page_fields(paged: bool, gather: bool) -> tuple[str, ...]:
    """The page and pool fields a plan's kernels never read (see PAGE_STRIDES)."""
    if not paged:
        return ()
    return ("k_batch_stride", "v_batch_stride") if gather else PAGE_STRIDES


def plan_for(spec: WgmmaForwardSpec, file: str | None, *, kind, title: str, abi_base: Abi = FORWARD_ABI,
             vt: bool = False, p_log2_offset: int = 0, k_even_odd: bool = False) -> ForwardPlan:
    """The plan of a wgmma forward spec of `kind`; vt: V comes transposed (e4m3: the B operand of an
    8-bit wgmma is K-major), P is kept 2^p_log2_offset larger."""
    target = TARGETS[spec.target]
    ctype, ctype2, ptx_type = ELEMENT_TYPES[spec.out_dtype]
    in_ctype, _, mma_type = ELEMENT_TYPES[spec.dtype]
    eb = spec.elem_bytes
    k = 32 // eb
    d, bm, bn, stages = spec.head_dim, spec.tile.block_m, spec.tile.block_n, spec.smem.stages
    panel, td, tdv = panel_swizzle(spec), tile_dim(spec), tile_dim_v(spec)
    cols = panel.columns(eb)
    v_t = transposed_v(bn * eb, tdv) if vt else None
    consumers, producers = spec.compute_warps // WARPGROUP, spec.producer_warps // WARPGROUP
    staged = spec.epilogue != "registers"
    own_o = staged and spec.epilogue_tile != "q"
    o_in_turns = own_o and spec.epilogue_tile == "own_in_turns"
    q_tiles = spec.schedule.q_tiles
    over_q = "; each consumer warpgroup stages its rows of O over its rows of Q" if staged and not own_o else ""
    q_what = "Q tile, loaded once" if q_tiles == 1 else "Q tile 0: even query blocks of the block"
    tiles = [swizzled_tile("q", bm, td, panel, in_ctype, q_what + over_q, eb)]
    if q_tiles == 2:
        tiles.append(swizzled_tile("q1", bm, td, panel, in_ctype, "Q tile 1: odd query blocks, loaded while tile 0's "
                                                                  "block runs (and the other way round)", eb))
    if own_o:
        tiles.append(swizzled_tile("o", ROWS_PER_WARPGROUP if o_in_turns else bm, tdv, panel, ctype,
                                   "O staged for the epilogue (its own tile: Q is handed back before the epilogue)"
                                   + ("; one warpgroup's rows, the two warpgroups taking it in turn" if o_in_turns
                                      else "")))
    for s in range(stages):
        tiles.append(swizzled_tile(f"k{s}", bn, td, panel, in_ctype, f"K tile, stage {s}", eb))
        tiles.append(swizzled_tile(f"v{s}", tdv, bn, v_t.panel, in_ctype, f"V^T tile, stage {s}", eb) if v_t else
                     swizzled_tile(f"v{s}", bn, tdv, panel, in_ctype, f"V tile, stage {s}", eb))
    persistent = spec.schedule.persistent
    paged = bool(getattr(spec, "paged", False))
    gather = paged and getattr(spec, "page_copies", "") == "gather"
    separate_kv_barriers = (spec.schedule.overlap if spec.schedule.separate_kv_barriers is None
                            else spec.schedule.separate_kv_barriers)
    q_bars = "q_full" + (", q_empty" if persistent else "") + (f" [0..{q_tiles}) each" if q_tiles > 1 else "")
    halves = spec.schedule.key_halves
    merge_barrier = epilogue_barrier(consumers, spec.schedule.pingpong) + consumers   # after the epilogue's
    o_turn_barrier = merge_barrier if o_in_turns else 0   # key_halves (the merge) is never beside it
    if halves > 1:   # the second key half's O (fp32, in its threads' register order) and row maxima and sums
        row_groups = consumers // halves
        tiles.append(Region("merge", row_groups * (tdv // 2 + 4), WARPGROUP * 32, "float", 4, WARPGROUP * 32 * 4,
                            per=f"key_halves: each row group's second key half hands the first its {tdv // 2} O "
                                "accumulators, 2 row maxima and 2 row sums per thread, [register][thread]"))
    tiles.append(barrier_region("bars", (4 if separate_kv_barriers else 2) * stages + q_tiles * (1 + persistent),
                                f"mbarriers {'full_k, full_v, empty_k, empty_v' if separate_kv_barriers else 'full, empty'} "
                                f"[0..{stages}) each, " + q_bars))
    regions = layout_regions(tiles)
    offset = {r.name: r.offset for r in regions}
    budget = Budget.of(target, spec.smem.opt_in)
    total = check_budget(regions, budget, file)
    threads = 32 * (spec.compute_warps + spec.producer_warps)
    q_bytes, k_bytes, v_bytes = bm * td * eb, bn * td * eb, bn * tdv * eb   # a TMA box counts its zero-filled columns too
    has_producer = producers > 0
    issuer_thread = 32 * spec.compute_warps if has_producer else 32 * WARPGROUP * (consumers - 1)
    issuer = (f"the producer thread ({issuer_thread})" if has_producer else
              f"the issuer (consumer thread {issuer_thread})")
    regs = spec.registers
    maps = (TensorMapSpec("q", bm, cols, panel.tma_name),
            TensorMapSpec("k", bn, cols, panel.tma_name, row_stride=2 if k_even_odd else 1))
    maps += ((TensorMapSpec("v", tdv, v_t.keys // eb, v_t.panel.tma_name, transposed=True),) if v_t else
             (TensorMapSpec("v", bn, cols, panel.tma_name),))
    if spec.epilogue == "tma":   # each consumer warpgroup stores its own 64 rows
        maps += (TensorMapSpec("o", ROWS_PER_WARPGROUP, panel.cols, panel.tma_name, store=True),)
    frag = WgmmaFragments(consumer_warpgroups=consumers, producer_warpgroups=producers,
                          tile_dim=td, tile_dim_v=tdv, panels=td // cols, panels_v=tdv // cols,
                          s_regs=bn // 2, o_regs=tdv // 2, k_steps_qk=td // k,
                          k_steps_pv=bn // k, k=k, mma_type=mma_type, producer_registers=regs.producer if regs else 0,
                          consumer_registers=regs.consumer if regs else 0, overlap=spec.schedule.overlap,
                          softmax_block=spec.schedule.softmax_block,
                          q_steps_rebuilt=spec.schedule.q_descriptors == "rebuilt",
                          pingpong=spec.schedule.pingpong, panel_cols=cols, panel_row_bytes=panel.row_bytes,
                          descriptor_mode=panel.descriptor_mode, swizzle_atom_bytes=8 * panel.row_bytes,
                          k_major_lbo_bytes=16, k_step_bytes=32, k_steps_per_panel=panel.row_bytes // 32,
                          v_lbo_bytes=bn * panel.row_bytes, v_step_bytes=16 * panel.row_bytes, vt=v_t,
                          k_even_odd=k_even_odd,
                          p_log2_offset=p_log2_offset, max_chains=spec.softmax.max_chains,
                          fma_exp2=spec.softmax.fma_exp2, lazy_slack=lazy_rescale_slack(spec, p_log2_offset),
                          kept_max_first=spec.softmax.kept_max_first, p_buffers=spec.schedule.p_buffers,
                          rows_per_warpgroup=ROWS_PER_WARPGROUP,
                          turn_threads=2 * WARPGROUP * 32,
                          turn_barrier=TURN_BARRIER, epilogue_barrier=epilogue_barrier(consumers, spec.schedule.pingpong),
                          q_bytes=q_bytes, k_tile_bytes=k_bytes, v_tile_bytes=v_bytes,
                          has_producer=has_producer, separate_kv_barriers=separate_kv_barriers,
                          issuer_thread=issuer_thread, epilogue=spec.epilogue,
                          o_stage_offset=offset["o" if own_o else "q"],
                          q_tiles=q_tiles, q_tile_stride=offset["q1"] - offset["q"] if q_tiles > 1 else 0,
                          item_overlap=spec.schedule.item_overlap,
                          middle_pairs=spec.schedule.middle_pairs,
                          longest_alone=spec.schedule.longest_alone,
                          short_first=spec.schedule.short_first,
                          snake=spec.schedule.snake, snake_tail=spec.schedule.snake_tail,
                          l2_hints=spec.schedule.l2_hints,
                          o_tile_in_turns=o_in_turns, o_turn_barrier=o_turn_barrier,
                          key_halves=halves,
                          merge_barrier=merge_barrier,
                          page_box_rows=page_box_rows(bn) if paged else 0,
                          page_copies=getattr(spec, "page_copies", "first_lane"))
    bars = barriers(stages, spec.compute_warps // halves, k_bytes, v_bytes, q_bytes, issuer,
                    offset["bars"], persistent, separate_kv_barriers, q_tiles,
                    "each consumer warp of the stage's key half" if halves > 1 else "each consumer warp")
    functions = forward_functions(spec)
    # setmaxnreg needs a fixed register cap at entry: __launch_bounds__(threads, 1).
    min_blocks = 1 if regs else launch_min_blocks(spec, target, threads, file)
    consumer_role = (f"consumer warpgroups 0..{consumers - 1} (warps 0..{spec.compute_warps - 1}): 64 query rows each"
                     + (f" (warpgroups w and w + {consumers // halves} share rows: w takes the even key tiles, w + "
                        f"{consumers // halves} the odd ones and hands its O, row maxima and sums to w through region "
                        f"merge (named barrier {merge_barrier} + w); "
                        f"w merges them and writes the rows)" if halves > 1 else "")
                     + f"; S = Q.K^T (wgmma SS, N {bn}), online softmax, O += P.V (wgmma RS, N {tdv})"
                     + (f"; setmaxnreg.inc to {regs.consumer}" if regs else ""))
    if has_producer:
        roles = (consumer_role,
                 f"producer warpgroup {consumers} (warps {spec.compute_warps}..{spec.compute_warps + 3}): thread "
                 f"{issuer_thread} issues every TMA copy, the other threads exit"
                 + (f"; setmaxnreg.dec to {regs.producer}" if regs else ""))
        copies = (f"  producer: Q (expect_tx {q_bytes} B on q_full), then per tile: wait empty_k[s] (when t >= stages), "
                  f"expect_tx {k_bytes} B on full_k[s], TMA K; the same for V ({v_bytes} B) on empty_v[s] and full_v[s]"
                  if separate_kv_barriers else
                  f"  producer: Q (expect_tx {q_bytes} B on q_full), then per tile: wait empty[s] (when t >= stages), "
                  f"expect_tx {k_bytes} B on full[s] and TMA K, the same again for V ({v_bytes} B)")
    else:
        roles = (consumer_role + f"; consumer thread {issuer_thread} (first of the last warpgroup, whose rows see "
                 "every tile) also issues every TMA copy",)
        copies = (f"  issuer: Q and the first {stages} tiles before its first GEMM; after its warp hands back K (or V) "
                  f"of tile t, it waits empty_k[s] (empty_v[s]) and copies tile t + {stages} into the stage"
                  if separate_kv_barriers else
                  f"  issuer: Q and the first {stages} tiles before its first GEMM; after its warp hands back tile t, "
                  f"it waits empty[s] and copies K and V of tile t + {stages} into the stage")
    overlap = spec.schedule.overlap
    schedule = ("schedule, tile t in stage s = t % stages, phase t / stages (waiters test its parity):",
                copies,
                ("  consumer: wait q_full once; per tile t: wait full_k[s] and full_v[(t-1) % stages], issue S_t = Q.K_t^T "
                 "and O += P_(t-1).V_(t-1), wait for S_t only, arrive empty_k[s], softmax S_t while P.V runs, wait for "
                 "P.V, arrive empty_v[(t-1) % stages], rescale O"
                 if overlap else
                 "  consumer: wait q_full once; per tile" + (" of its key half (even or odd tiles)" if halves > 1 else "")
                 + ": wait full[s], S = Q.K^T, wait, softmax, O += P.V, wait, arrive empty[s]"),
                (f"  ping-pong: consumer warpgroup w waits on named barrier {TURN_BARRIER} + w before issuing its "
                 f"GEMMs and arrives on warpgroup (w + 1) % {consumers}'s after, so the others' softmax runs under "
                 "one warpgroup's GEMMs"
                 + ("; a warpgroup whose rows see no key of a tile (causal) hands its stage back and passes that "
                    "turn without GEMMs" if consumers > 2 else "")
                 if spec.schedule.pingpong else
                 "  a consumer warpgroup whose rows see no key of a tile (causal) waits full_k/full_v[s] and arrives "
                 "empty_k/empty_v[s] without computing"),
                ("  persistent: one block per SM takes query blocks i, i + grid, ... (with more query blocks than "
                 + ("SMs, causal: every head's longest block, then every head's next, dealt to the blocks forward in "
                    "one round and back in the next; a window, in units of about equal work: the k-th longest and "
                    "k-th shortest of the blocks whose first row sees key 0, each block after them alone); "
                    if spec.schedule.snake and not spec.schedule.middle_pairs else
                    "SMs, in units of about equal work: causal, a head's k-th longest and k-th shortest block, or "
                    "(where heads x batch is at most half the blocks and it gives the busiest block a tenth less work) "
                    "every head's longest block, then every head's next, dealt forward in one round and back in the "
                    "next" + ("; or whole rounds of units over the first heads, then that snake over the heads left"
                              if spec.schedule.snake_tail else "") + "; a window, the same pairs over the blocks whose first row sees key 0, each block after "
                    "them alone); "
                    if spec.schedule.snake else
                    "SMs, in units of about equal work: causal, a head's k-th longest and k-th shortest block; a "
                    "window, the same pairs over the blocks whose first row sees key 0, each block after them alone); ")
                 + "ring positions and the "
                 "q_full/q_empty phases run on across them, and the producer waits q_empty before it loads the next "
                 + ("Q (the consumers arrive once the epilogue has read their staged rows of O out of the Q tile)"
                    if staged and not own_o else
                    "Q (the consumers arrive once their last GEMM of a block is done, before its epilogue)")
                 + (f"; with {q_tiles} Q tiles, block i's Q goes into tile i % {q_tiles} once block i - {q_tiles} "
                    f"handed it back, so it loads while block i - 1 still runs" if q_tiles > 1 else "")
                 + ("; block i's rows of O are packed once its last P.V is done and written out beside block "
                    "i + 1's first S" if spec.schedule.item_overlap else "")
                 + ("; heads of a ramp of 3 or 5 blocks may go in twos, their middle blocks one unit after both "
                    "heads' other units" if spec.schedule.middle_pairs else "")
                 + ("; an odd ramp's longest block is a unit alone and the blocks before it pair up, so no middle "
                    "block is left for the end" + (" (where the walk counts no more work for the busiest block than "
                                                   "with middle pairs)" if spec.schedule.middle_pairs else "")
                    if spec.schedule.longest_alone else "")
                 + ("; a unit's shorter block first, then the longer, which reads the shorter's K/V tiles again "
                    "while they are in L2" if spec.schedule.short_first else "")
                 if persistent else "  one query block per thread block"),
                epilogue_line(spec.epilogue, own_o, epilogue_barrier(consumers, spec.schedule.pingpong), o_turn_barrier),
                f"up to {stages} tiles in flight; thread 0 initialises the mbarriers (fence.mbarrier_init), "
                "one __syncthreads publishes them")
    variants = spec_variants(spec)
    return ForwardPlan(
        spec=spec, kind=kind, title=title, target=target, **variants,
        parts=(Part("fwd", "kernel.cu.j2", f"{spec.name}.cu", functions,
                    awaiting_twins=awaiting_twin_functions(functions) if spec.schedule.awaiting_twins else ()),),
        abi=plan_abi(variants["mask_variants"], varlen=spec.varlen, reports_errors=False,
                     scores=variants["score_variants"],
                     through_maps=tuple(m.tensor for m in maps if not m.store and not (gather and m.tensor in ("k", "v"))),
                     base=abi_base).with_fields(map_abi_fields(maps) + (PAGED_VARLEN_ABI_FIELDS if paged else ()))
        .without(unread_page_fields(paged, gather)),
        params_qualifier="__grid_constant__ ",
        ctype=ctype, ctype2=ctype2, ptx_type=ptx_type, head_dim=d, block_m=bm, block_n=bn,
        compute_warps=spec.compute_warps, producer_warps=spec.producer_warps, threads=threads,
        compute_threads=32 * spec.compute_warps, producer_threads=32 * spec.producer_warps,
        rows_per_warp=16, chunks_per_row=d * eb // 16,
        swizzle=Swizzle("xor", panel.row_bytes, panel.xor_bits, panel.row_shift),
        regions=regions, smem_bytes=total, smem_budget=budget.bytes, smem_dynamic=total > target.smem_per_block,
        stages=stages, async_copy=True, q_in_registers=False, rescale="always",
        q_copy=TileCopy(bm, td * eb // 16, 1), kv_copy=TileCopy(bn, td * eb // 16, 1),
        barriers=bars, kv_stage_stride=ring_stride(regions, "k", "v"), min_blocks_per_sm=min_blocks,
        fragments=frag, bank_report=(), roles=roles, schedule=schedule, arch_suffix="a",
        copy_engine=f"TMA (cp.async.bulk.tensor, {panel.row_bytes}-byte swizzle) on mbarriers",
        tensor_maps=maps, persistent=persistent, head_dim_v=spec.v_dim if spec.v_dim != d else 0, paged=paged,
    )


def padding_lines(plan) -> list[str]:
    """What explain says about head dims padded to whole panels (TMA's zero fill)."""
    f, out = plan.fragments, []
    if f.tile_dim != plan.head_dim:
        out.append(f"head_dim {plan.head_dim} padded to {f.tile_dim} columns: TMA fills columns {plan.head_dim}.."
                   f"{f.tile_dim - 1} of Q and K with zeros (they add nothing to S)")
    if f.tile_dim_v != plan.v_dim:
        out.append(f"{'head_dim_v' if plan.v_dim != plan.head_dim else 'V'} {plan.v_dim} padded to {f.tile_dim_v} "
                   f"columns: TMA fills V's columns {plan.v_dim}..{f.tile_dim_v - 1} with zeros; those O columns "
                   "are not stored")
    return out


def varlen_lines(plan) -> list[str]:
    """What explain says about the varlen functions (none without them)."""
    if not plan.varlen:
        return []
    changes = [w for w, on in (("one query block per block (no persistent loop)", plan.persistent),
                               ("O leaves through shared memory, not a TMA store (whose rows would run into the "
                                "next sequence)", plan.fragments.epilogue == "tma")) if on]
    return ["varlen: the maps see each packed (total, heads, dim) tensor as one batch; a block's TMA copies start "
            "at its sequence's first rows (keys past its end are masked, query rows past it are not stored)"
            + ("; " + "; ".join(changes) if changes else "")] + (
        [f"paged varlen: with a block table, the K and V maps see the page pools (num_pages, page_size, heads, dim) "
         f"as pages x heads x page rows; the issuing warp reads a tile's page ids (a lane each) and "
         f"{'its first lane copies each page' if plan.fragments.page_copies == 'first_lane' else 'each lane copies its page'}'s rows, "
         f"min(page_size, {plan.fragments.page_box_rows}) rows a copy; the consumers zero "
         "the rows of a sequence's last tile past its keys (a pool's unused rows may hold anything)"
         if plan.fragments.page_copies != "gather" else
         "paged varlen: with a block table, the producer warpgroup's 128 threads copy K and V with cp.async, 16 bytes "
         "each, into the swizzled panels (rows past a sequence's keys zero-filled), each thread arriving on the "
         "stage's full mbarrier once its copies land (128 arrivals per operand on a paged call)"]
        if plan.paged else [])


def explain(plan) -> list[str]:
    f = plan.fragments
    lines = [f"warpgroups: {f.consumer_warpgroups} consumer(s) x 64 rows + {f.producer_warpgroups} producer; "
             f"S {f.s_regs} + O {f.o_regs} fp32 accumulator registers per consumer thread",
             f"wgmma per tile per consumer warpgroup: {f.k_steps_qk} x m64n{plan.block_n}k{f.k} (Q.K^T, SS) + "
             f"{f.k_steps_pv} x m64n{f.tile_dim_v}k{f.k} (P.V, RS, " + ("V^T K-major" if f.vt else "V MN-major") + ")"
             + (f", {f.mma_type} operands" if f.vt else ""),
             *([f"V and O: head_dim_v {plan.v_dim}, Q and K: head_dim {plan.head_dim} (the default scale is "
                f"1/sqrt({plan.head_dim}))"] if plan.v_dim != plan.head_dim else []),
             *padding_lines(plan),
             (f"TMA: Q {f.q_bytes} B once, K and V {f.k_tile_bytes} B each per stage, in {f.panels} "
              if f.k_tile_bytes == f.v_tile_bytes else
              f"TMA: Q {f.q_bytes} B once, K {f.k_tile_bytes} B and V {f.v_tile_bytes} B per stage, in {f.panels} "
              f"and {f.panels_v} ") +
             f"{f.panel_cols}-column panel(s) each, issued by thread {f.issuer_thread} ({'producer' if f.has_producer else 'homogeneous: a consumer'}); "
             "tensor maps: " + "; ".join(m.describe() for m in plan.tensor_maps),
             f"descriptors: {f.panel_row_bytes}-byte swizzle (mode {f.descriptor_mode}), K-major Q and K (SBO "
             f"{f.swizzle_atom_bytes} B, k{f.k} step +{f.k_step_bytes} B), " +
             (f"K-major V^T ({f.vt.panel.row_bytes}-byte swizzle, mode {f.vt.panel.descriptor_mode}; {f.vt.panels} "
              f"panel(s) of {f.vt.keys} keys, {f.vt.panel_bytes} B apart; SBO {8 * f.vt.panel.row_bytes} B, k{f.k} step "
              f"+32 B)" if f.vt else
              f"MN-major V (LBO {f.v_lbo_bytes} B between panels, SBO {f.swizzle_atom_bytes} B, k16 step "
              f"+{f.v_step_bytes} B)") +
             ("; each tile's built once, a k-step's that plus its offset" +
              (" (Q's rebuilt from each step's address)" if f.q_steps_rebuilt else "")),
             "registers: " + (f"setmaxnreg producer {f.producer_registers}, consumer {f.consumer_registers}"
                              if f.producer_registers else "no reallocation"),
             ("online softmax: exp2 with the scale and the q, k descales folded in; P = exp2(s - max + "
              f"{f.p_log2_offset}) rounded to {f.mma_type} (the row sums take the power out); output x v descale, "
              f"{plan.spec.out_dtype}; rescale always" if f.vt else "online softmax: exp2 with the scale folded in; rescale always")
             + (f"; a row's max scanned in {f.max_chains} chains" if f.max_chains > 1 else "")
             + (f"; {f.fma_exp2} of every 8 exponentials on the FMA pipes (a cubic)" if f.fma_exp2 else "")
             + (f"; a row keeps its max until a tile's passes it by {f.lazy_slack:g} (log2; P <= "
                f"2^{f.p_log2_offset + f.lazy_slack:g}), O rescaled only in a warp where a row moved"
                if f.lazy_slack else "")
             + ("; P made at the kept maxima first, the tile's max scanned beside it (the usual step again only in a "
                "warp where a row moved)" if f.kept_max_first else "")
             + ("; overlapped with the previous tile's P.V" if f.overlap else "")
             + ("; two P buffers: a tile's P made while the previous tile's P.V runs" if f.p_buffers == 2 else "")
             + (" (the softmax in a basic block of its own, ahead of that P.V's wait)" if f.softmax_block else "")
             + (f"; consumer warpgroups take turns issuing their GEMMs (named barriers 1-{f.consumer_warpgroups})"
                if f.pingpong else ""),
             f"epilogue: {f.epilogue}" + ({"registers": " (4-byte stores of the accumulators)",
                                           "shared": " (staged in the {tile}, 16-byte coalesced stores)",
                                           "tma": " (staged in the {tile}, TMA bulk tensor store)"}[f.epilogue]
                                          .format(tile="Q tile" if plan.region("q").offset == f.o_stage_offset
                                                  else "O tile of its own")),
             ("grid: persistent, one block per SM looping over every query block" if plan.persistent else
              "grid: one block per query block"),
             *varlen_lines(plan),
             f"shared-memory banks: TMA writes and wgmma reads {f.panel_row_bytes}-byte-swizzled tiles (conflict-free "
             "by layout)"]
    return lines

