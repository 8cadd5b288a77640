"""fwd_wgmma: the Hopper (sm_90a) attention forward. TMA copies Q, K and V into 128-byte-swizzled,
1024-aligned tiles, completing on mbarriers; one thread issues every copy into a K/V ring: the first
thread of a producer warpgroup, or (homogeneous, `warps: {compute: N}`) the first thread of the last
consumer warpgroup between its GEMMs. Each consumer warpgroup owns 64 query rows and runs S = Q.K^T
with both operands from shared memory (wgmma SS) and O += P.V with P from registers and V MN-major
(wgmma RS), fp32 accumulators. K and V of a stage are handed back on separate mbarriers. setmaxnreg
moves registers from the producer to the consumers."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from pydantic import Field

from ...core.abi import blob
from ...core.forward import FORWARD_ABI, ForwardPlan, forward_functions, launch_min_blocks, Part, ELEMENT_TYPES
from ...core.kind import Kind
from ...core.space import Axis, SearchSpace, field_axis, with_base
from ...core.layout import (MBARRIER_BYTES, Barrier, Budget, Region, Swizzle, TileCopy, barrier_region,
                            check_budget, layout_regions, ring_stride)
from ...core.spec import ForwardSpec, Strict, XorSwizzle, refuse, rule_no_varlen, rule_threads
from ...core.tma import MAP_ALIGN, MAP_BYTES, SWIZZLE_128B_COLS, TensorMapSpec
from ...core.variants import MASKS
from ...targets import TARGETS

NAME = "fwd_wgmma"
TITLE = "wgmma + TMA attention forward (sm_90a)"
FRAGMENT = "wgmma_m64nNk16"
WARPGROUP = 4              # warps
ROWS_PER_WARPGROUP = 64    # the M of every wgmma
PANEL_BYTES = 128          # one 128-byte-swizzled row: 64 16-bit elements
TILE_ALIGN = 1024          # the 128-byte swizzle pattern repeats every 8 rows = 1024 B, on absolute addresses
MAX_N = 256                # wgmma N
ACCUMULATOR_MARGIN = 48    # registers a consumer thread needs beside its S and O accumulators (addresses, softmax)


class Registers(Strict):
    """Registers per thread of each role after setmaxnreg (multiples of 8, 24 to 256)."""

    producer: int = Field(ge=24, le=256, description="registers per producer thread (setmaxnreg.dec)")
    consumer: int = Field(ge=24, le=256, description="registers per consumer thread (setmaxnreg.inc)")


def rule_target_has_sm90a(s):
    if TARGETS[s.target].arch != "sm_90":
        return "target", (f"wgmma and setmaxnreg need an sm_90a GPU; target {s.target} is "
                          f"{TARGETS[s.target].arch}: use target h100 or h200, or a fragment the target runs")


def rule_head_dim_panels(s):
    if s.head_dim % SWIZZLE_128B_COLS or s.head_dim > MAX_N:
        return "head_dim", (f"must be a multiple of 64 (128-byte swizzled panels) and at most {MAX_N} (the N of "
                            f"P.V) for {s.mma} (got {s.head_dim}); use 64, 128, 192 or 256")


def rule_warpgroups(s):
    if s.compute_warps % WARPGROUP or not 1 <= s.compute_warps // WARPGROUP <= 3:
        key = "warps.consumer" if s.producer_warps else "warps.compute"
        return key, (f"{s.mma} computes in warpgroups of 4 warps: use 4, 8 or 12 (1 to 3 warpgroups, "
                     f"got {s.compute_warps})")
    if s.producer_warps not in (0, WARPGROUP):
        return "warps.producer", f"the producer is one warpgroup: use producer: 4 (got {s.producer_warps})"


def rule_block_m_rows(s):
    need = ROWS_PER_WARPGROUP * (s.compute_warps // WARPGROUP)
    if s.tile.block_m != need:
        return "tile.block_m", (f"each consumer warpgroup owns {ROWS_PER_WARPGROUP} query rows (one m64 wgmma), so "
                                f"block_m must be {need} for {s.compute_warps} compute warps (got {s.tile.block_m})")


def rule_block_n(s):
    if s.tile.block_n % 16 or s.tile.block_n > MAX_N:
        return "tile.block_n", (f"must be a multiple of 16 (k16 steps of P.V) and at most {MAX_N} (the N of Q.K^T) "
                                f"for {s.mma} (got {s.tile.block_n})")


def rule_swizzle_128b(s):
    sw = s.smem.swizzle
    if not (isinstance(sw, XorSwizzle) and sw.xor_bits == 3 and sw.row_shift == 0):
        return "smem.swizzle", ("TMA and wgmma read 128-byte swizzled tiles (16-byte chunk ^= row % 8): "
                                "set swizzle: {xor_bits: 3}")


rule_async_copies = refuse(
    "smem.async_copy", lambda s: not s.smem.async_copy,
    lambda s: "TMA copies are asynchronous: set smem.async_copy: true", "rule_async_copies")
rule_q_in_shared = refuse(
    "smem.q_in_registers", lambda s: s.smem.q_in_registers,
    lambda s: "Q.K^T reads Q from shared memory (wgmma SS): set q_in_registers: false", "rule_q_in_shared")
rule_ring = refuse(
    "smem.stages", lambda s: s.smem.stages < 2,
    lambda s: "the K/V ring needs at least 2 stages", "rule_ring")
rule_always_rescales = refuse(
    "softmax.rescale", lambda s: s.softmax.rescale != "always",
    lambda s: "rescale: on_max_change is not generated for wgmma; use always", "rule_always_rescales")


def rule_pingpong(s):
    if s.schedule.pingpong and not s.schedule.overlap:
        return "schedule.pingpong", "ping-pong is generated on the overlapped schedule: set schedule.overlap: true"
    if s.schedule.pingpong and not s.producer_warps:
        return "schedule.pingpong", ("ping-pong is generated with a producer warpgroup (the homogeneous issuer "
                                     "would wait for stages inside its turn): use warps: {producer: 4, consumer: 8}")
    if s.schedule.persistent and not s.producer_warps:
        return "schedule.persistent", ("a persistent block needs a producer warpgroup to load the next query "
                                       "block during the epilogue: use warps: {producer: 4, consumer: ...}")
    if s.schedule.pingpong and s.compute_warps != 2 * WARPGROUP:
        return "schedule.pingpong", (f"ping-pong alternates two consumer warpgroups: use warps.consumer: 8 "
                                     f"(got {s.compute_warps})")


def entry_cap(s) -> int:
    """Registers per thread at entry with one block per SM: the register file over the block's
    threads, in the units of 8 that ptxas and setmaxnreg count in."""
    threads = 32 * (s.compute_warps + s.producer_warps)
    return TARGETS[s.target].regs_per_sm // threads // 8 * 8


def consumer_need(s) -> int:
    """Registers a consumer thread needs: its S and O accumulators and ACCUMULATOR_MARGIN."""
    return s.tile.block_n // 2 + s.head_dim // 2 + ACCUMULATOR_MARGIN


def rule_registers(s):
    r = s.registers
    consumers = s.compute_warps // WARPGROUP
    need = consumer_need(s)
    if r is None:
        if need > entry_cap(s):
            return "registers", (f"a consumer thread needs about {need} registers (S {s.tile.block_n // 2} + O "
                                 f"{s.head_dim // 2} accumulators + {ACCUMULATOR_MARGIN}) but gets {entry_cap(s)} "
                                 f"at entry: set registers: {{producer: 24, consumer: ...}} to move the producer's "
                                 f"registers to the consumers")
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


class Schedule(Strict):
    """How a consumer warpgroup orders its GEMMs and softmax."""

    overlap: bool = Field(default=False, description=(
        "issue S = Q.K^T of tile t before O += P.V of tile t-1 and run the softmax of tile t while P.V "
        "runs; off: each GEMM is waited for before the next step"))
    pingpong: bool = Field(default=False, description=(
        "two consumer warpgroups take turns issuing their GEMMs (named barriers), so one runs its softmax "
        "while the other's GEMMs use the tensor cores; needs overlap and 2 consumer warpgroups"))
    split_kv: Optional[bool] = Field(default=None, description=(
        "K and V of a stage handed over on separate full/empty mbarriers, so K is refilled as soon as its "
        "S = Q.K^T is done; false: one pair per stage counts both (fewer arrivals per tile); unset: split "
        "when the schedule overlaps (it needs only two stages then)"))
    persistent: bool = Field(default=False, description=(
        "launch one block per SM that loops over every query block: the producer loads the next block's "
        "Q and K/V while the consumers finish the last one (its epilogue); needs a producer warpgroup"))


class WgmmaSpec(ForwardSpec):
    mma: Literal["wgmma_m64nNk16"] = Field(description="wgmma_m64nNk16: Hopper wgmma + TMA (sm_90a)")
    registers: Optional[Registers] = Field(
        default=None, description="registers per thread of each role after setmaxnreg; unset: no reallocation")
    schedule: Schedule = Schedule()
    epilogue: Literal["registers", "shared", "tma"] = Field(default="registers", description=(
        "how O leaves: registers = each thread stores its accumulator pairs (4-byte stores); shared = a "
        "consumer warpgroup writes its 64 normalised rows over its rows of the Q tile (128-byte swizzle) "
        "and stores them with 16-byte coalesced stores; tma = the same staging, then one TMA bulk tensor "
        "store per 64-column panel"))
    key_unit = 16
    key_unit_why = "k16 steps of P.V"
    rules = (rule_target_has_sm90a, rule_head_dim_panels, rule_warpgroups, rule_block_m_rows, rule_block_n,
             rule_swizzle_128b, rule_async_copies, rule_q_in_shared, rule_ring, rule_always_rescales, rule_pingpong, rule_registers, rule_threads,
             rule_no_varlen)

    def register_need(self):
        return (consumer_need(self), f"a consumer thread's S {self.tile.block_n // 2} and O {self.head_dim // 2} "
                                     f"accumulators + {ACCUMULATOR_MARGIN}")


@dataclass(frozen=True, kw_only=True)
class WgmmaFragments:
    consumer_warpgroups: int
    producer_warpgroups: int
    panels: int             # 64-column panels of head_dim
    s_regs: int             # fp32 accumulators of S per thread (block_n / 2)
    o_regs: int             # fp32 accumulators of O per thread (head_dim / 2)
    k_steps_qk: int         # k16 wgmma steps of Q.K^T (head_dim / 16)
    k_steps_pv: int         # k16 wgmma steps of P.V (block_n / 16)
    producer_registers: int  # after setmaxnreg (0: no reallocation)
    consumer_registers: int
    overlap: bool           # softmax of tile t runs while P.V of tile t-1 is in flight
    pingpong: bool          # the two consumer warpgroups take turns issuing GEMMs
    panel_cols: int         # elements in one 128-byte swizzled row (the TMA box width)
    panel_row_bytes: int    # bytes of one such row
    swizzle_atom_bytes: int  # 8 rows: the repeat of the 128-byte swizzle, every descriptor's stride byte offset
    k_major_lbo_bytes: int  # leading byte offset of K-major Q and K (unused by the hardware with this swizzle)
    k_step_bytes: int       # a k16 step inside a K-major panel (16 elements)
    k_steps_per_panel: int
    v_lbo_bytes: int        # MN-major V: bytes between its 64-column panels (block_n rows)
    v_step_bytes: int       # MN-major V: a k16 step = 16 key rows
    rows_per_warpgroup: int
    turn_threads: int       # threads counted by a ping-pong turn barrier (both consumer warpgroups)
    q_bytes: int            # TMA transaction bytes of the Q tile
    tile_bytes: int         # TMA transaction bytes of one K or V tile
    has_producer: bool      # false: homogeneous, a consumer thread also issues the copies
    split_kv: bool          # K and V of a stage handed over on separate mbarriers (the overlapped schedule)
    issuer_thread: int      # the thread that issues every TMA copy
    epilogue: str           # registers, shared or tma (spec.epilogue)


def swizzled_tile(name: str, rows: int, head_dim: int, ctype: str, per: str) -> Region:
    """A tile as TMA writes it with SWIZZLE_128B: [head_dim/64 panels][rows][64 elements], 128-byte rows."""
    panels = head_dim // SWIZZLE_128B_COLS
    return Region(name, panels * rows, SWIZZLE_128B_COLS, ctype, 2, PANEL_BYTES, swizzle="128B: chunk ^= row % 8",
                  per=f"{per}; {panels} panel(s) of {rows} rows x 64", align=TILE_ALIGN)


def barriers(stages: int, consumer_warps: int, tile_bytes: int, q_bytes: int, issuer: str,
             base: int, persistent: bool = False, split_kv: bool = True) -> tuple[Barrier, ...]:
    """Split: full_k, full_v, empty_k, empty_v per stage, so K of a stage is refilled as soon as the S
    GEMM that read it is done (the overlapped schedule needs it). Otherwise full and empty per stage,
    for K and V together. Then q_full (and q_empty when persistent)."""
    out, at = [], base
    copy = f"{issuer} (arrive.expect_tx {tile_bytes} B; TMA completes the bytes)"
    pairs = ((("full_k", 1, copy, "consumer threads"), ("full_v", 1, copy, "consumer threads"),
              ("empty_k", consumer_warps, "lane 0 of each consumer warp, once its S = Q.K^T of the stage completed",
               issuer),
              ("empty_v", consumer_warps, "lane 0 of each consumer warp, once its P.V of the stage completed", issuer))
             if split_kv else
             (("full", 2, f"{issuer}, once for K and once for V (arrive.expect_tx {tile_bytes} B each)",
               "consumer threads"),
              ("empty", consumer_warps, "lane 0 of each consumer warp, once its P.V of the stage completed", issuer)))
    for kind, arrivals, arrive, wait in pairs:
        for s in range(stages):
            out.append(Barrier(f"{kind}{s}", s, at, arrivals, arrive, wait))
            at += MBARRIER_BYTES
    out.append(Barrier("q_full", 0, at, 1, f"{issuer} (arrive.expect_tx {q_bytes} B)", "consumer threads"))
    if persistent:
        out.append(Barrier("q_empty", 0, at + MBARRIER_BYTES, consumer_warps,
                           "lane 0 of each consumer warp, once every GEMM of its query block is done", issuer))
    return tuple(out)


def epilogue_line(epilogue: str) -> str:
    """The schedule's last step: how a consumer warpgroup writes its 64 rows of O."""
    staging = ("  epilogue: each consumer warpgroup normalises O and writes its 64 rows over its rows of the Q tile "
               "(its last S GEMM has completed; 128-byte swizzle, 4-byte stores), then syncs its 128 threads on "
               "named barrier 3 + w; ")
    return {"registers": "  epilogue: each thread stores its normalised O pairs to global memory (4-byte stores)",
            "shared": staging + "its threads copy the rows out with 16-byte coalesced stores",
            "tma": staging + ("after fence.proxy.async its first thread issues one TMA store per 64-column panel "
                              "(rows past the sequence are dropped) and waits for the reads before the block exits")
            }[epilogue]


def plan(spec: WgmmaSpec, file: str | None = None) -> ForwardPlan:
    target = TARGETS[spec.target]
    ctype, ctype2, ptx_type = ELEMENT_TYPES[spec.dtype]
    d, bm, bn, stages = spec.head_dim, spec.tile.block_m, spec.tile.block_n, spec.smem.stages
    consumers, producers = spec.compute_warps // WARPGROUP, spec.producer_warps // WARPGROUP
    staged = spec.epilogue != "registers"
    tiles = [swizzled_tile("q", bm, d, ctype, "Q tile, loaded once" +
                           ("; each consumer warpgroup stages its rows of O over its rows of Q" if staged else ""))]
    for s in range(stages):
        tiles.append(swizzled_tile(f"k{s}", bn, d, ctype, f"K tile, stage {s}"))
        tiles.append(swizzled_tile(f"v{s}", bn, d, ctype, f"V tile, stage {s}"))
    persistent = spec.schedule.persistent
    split_kv = spec.schedule.overlap if spec.schedule.split_kv is None else spec.schedule.split_kv
    tiles.append(barrier_region("bars", (4 if split_kv else 2) * stages + 1 + persistent,
                                f"mbarriers {'full_k, full_v, empty_k, empty_v' if split_kv else 'full, empty'} "
                                f"[0..{stages}) each, q_full" + (", q_empty" if persistent else "")))
    regions = layout_regions(tiles)
    budget = Budget.of(target, spec.smem.opt_in)
    total = check_budget(regions, budget, file)
    threads = 32 * (spec.compute_warps + spec.producer_warps)
    q_bytes, tile_bytes = bm * d * 2, bn * d * 2
    has_producer = producers > 0
    issuer_thread = 32 * spec.compute_warps if has_producer else 32 * WARPGROUP * (consumers - 1)
    issuer = (f"the producer thread ({issuer_thread})" if has_producer else
              f"the issuer (consumer thread {issuer_thread})")
    regs = spec.registers
    maps = (TensorMapSpec("q", bm), TensorMapSpec("k", bn), TensorMapSpec("v", bn))
    if spec.epilogue == "tma":   # each consumer warpgroup stores its own 64 rows
        maps += (TensorMapSpec("o", ROWS_PER_WARPGROUP, store=True),)
    frag = WgmmaFragments(consumer_warpgroups=consumers, producer_warpgroups=producers,
                          panels=d // SWIZZLE_128B_COLS, s_regs=bn // 2, o_regs=d // 2, k_steps_qk=d // 16,
                          k_steps_pv=bn // 16, producer_registers=regs.producer if regs else 0,
                          consumer_registers=regs.consumer if regs else 0, overlap=spec.schedule.overlap,
                          pingpong=spec.schedule.pingpong, panel_cols=SWIZZLE_128B_COLS, panel_row_bytes=PANEL_BYTES,
                          swizzle_atom_bytes=TILE_ALIGN, k_major_lbo_bytes=16, k_step_bytes=16 * 2,
                          k_steps_per_panel=SWIZZLE_128B_COLS // 16, v_lbo_bytes=bn * PANEL_BYTES,
                          v_step_bytes=16 * PANEL_BYTES, rows_per_warpgroup=ROWS_PER_WARPGROUP,
                          turn_threads=2 * WARPGROUP * 32, q_bytes=q_bytes, tile_bytes=tile_bytes,
                          has_producer=has_producer, split_kv=split_kv, issuer_thread=issuer_thread,
                          epilogue=spec.epilogue)
    bars = barriers(stages, spec.compute_warps, tile_bytes, q_bytes, issuer,
                    next(r.offset for r in regions if r.name == "bars"), persistent, split_kv)
    functions = forward_functions(spec)
    # setmaxnreg needs a fixed register cap at entry: __launch_bounds__(threads, 1).
    min_blocks = 1 if regs else launch_min_blocks(spec, target, threads, file)
    consumer_role = (f"consumer warpgroups 0..{consumers - 1} (warps 0..{spec.compute_warps - 1}): 64 query rows each; "
                     f"S = Q.K^T (wgmma SS, N {bn}), online softmax, O += P.V (wgmma RS, N {d})"
                     + (f"; setmaxnreg.inc to {regs.consumer}" if regs else ""))
    if has_producer:
        roles = (consumer_role,
                 f"producer warpgroup {consumers} (warps {spec.compute_warps}..{spec.compute_warps + 3}): thread "
                 f"{issuer_thread} issues every TMA copy, the other threads exit"
                 + (f"; setmaxnreg.dec to {regs.producer}" if regs else ""))
        copies = (f"  producer: Q (expect_tx {q_bytes} B on q_full), then per tile: wait empty_k[s] (when t >= stages), "
                  f"expect_tx {tile_bytes} B on full_k[s], TMA K; the same for V on empty_v[s] and full_v[s]"
                  if split_kv else
                  f"  producer: Q (expect_tx {q_bytes} B on q_full), then per tile: wait empty[s] (when t >= stages), "
                  f"expect_tx {tile_bytes} B on full[s] and TMA K, the same again for V")
    else:
        roles = (consumer_role + f"; consumer thread {issuer_thread} (first of the last warpgroup, whose rows see "
                 "every tile) also issues every TMA copy",)
        copies = (f"  issuer: Q and the first {stages} tiles before its first GEMM; after its warp hands back K (or V) "
                  f"of tile t, it waits empty_k[s] (empty_v[s]) and copies tile t + {stages} into the stage"
                  if split_kv else
                  f"  issuer: Q and the first {stages} tiles before its first GEMM; after its warp hands back tile t, "
                  f"it waits empty[s] and copies K and V of tile t + {stages} into the stage")
    overlap = spec.schedule.overlap
    schedule = ("schedule, tile t in stage s = t % stages, phase t / stages (waiters test its parity):",
                copies,
                ("  consumer: wait q_full once; per tile t: wait full_k[s] and full_v[(t-1) % stages], issue S_t = Q.K_t^T "
                 "and O += P_(t-1).V_(t-1), wait for S_t only, arrive empty_k[s], softmax S_t while P.V runs, wait for "
                 "P.V, arrive empty_v[(t-1) % stages], rescale O"
                 if overlap else
                 "  consumer: wait q_full once; per tile: wait full[s], S = Q.K^T, wait, softmax, O += P.V, wait, "
                 "arrive empty[s]"),
                ("  ping-pong: consumer warpgroup w waits on named barrier 1 + w before issuing its GEMMs and "
                 "arrives on the other's after, so one warpgroup's softmax runs under the other's GEMMs"
                 if spec.schedule.pingpong else
                 "  a consumer warpgroup whose rows see no key of a tile (causal) waits full_k/full_v[s] and arrives "
                 "empty_k/empty_v[s] without computing"),
                ("  persistent: one block per SM takes query blocks i, i + grid, ...; ring positions and the "
                 "q_full/q_empty phases run on across them, and the producer waits q_empty before it loads the next "
                 + ("Q (the consumers arrive once the epilogue has read their staged rows of O out of the Q tile)"
                    if staged else
                    "Q (the consumers arrive once their last GEMM of a block is done, before its epilogue)")
                 if persistent else "  one query block per thread block"),
                epilogue_line(spec.epilogue),
                f"up to {stages} tiles in flight; thread 0 initialises the mbarriers (fence.mbarrier_init), "
                "one __syncthreads publishes them")
    return ForwardPlan(
        spec=spec, kind=KIND, title=TITLE, target=target, masks=tuple(spec.masks),
        mask_variants=tuple(MASKS[m] for m in spec.masks),
        parts=(Part("fwd", "kernel.cu.j2", f"{spec.name}.cu", functions),),
        abi=FORWARD_ABI.with_fields(tuple(blob(m.abi_field, MAP_BYTES, MAP_ALIGN, f"TMA tensor map of {m.tensor}, "
                                               "encoded by the runtime per call") for m in maps)),
        params_qualifier="__grid_constant__ ",
        ctype=ctype, ctype2=ctype2, ptx_type=ptx_type, head_dim=d, block_m=bm, block_n=bn,
        compute_warps=spec.compute_warps, producer_warps=spec.producer_warps, threads=threads,
        compute_threads=32 * spec.compute_warps, producer_threads=32 * spec.producer_warps,
        rows_per_warp=16, chunks_per_row=d * 2 // 16, swizzle=Swizzle("xor", PANEL_BYTES, 3, 0),
        regions=regions, smem_bytes=total, smem_budget=budget.bytes, smem_dynamic=total > target.smem_per_block,
        stages=stages, async_copy=True, q_in_registers=False, rescale="always",
        q_copy=TileCopy(bm, d * 2 // 16, 1), kv_copy=TileCopy(bn, d * 2 // 16, 1),
        barriers=bars, kv_stage_stride=ring_stride(regions, "k", "v"), min_blocks_per_sm=min_blocks,
        fragments=frag, bank_report=(), roles=roles, schedule=schedule, arch_suffix="a",
        copy_engine="TMA (cp.async.bulk.tensor, 128-byte swizzle) on mbarriers",
        tensor_maps=maps, persistent=persistent,
    )


def explain(plan) -> list[str]:
    f = plan.fragments
    lines = [f"warpgroups: {f.consumer_warpgroups} consumer(s) x 64 rows + {f.producer_warpgroups} producer; "
             f"S {f.s_regs} + O {f.o_regs} fp32 accumulator registers per consumer thread",
             f"wgmma per tile per consumer warpgroup: {f.k_steps_qk} x m64n{plan.block_n}k16 (Q.K^T, SS) + "
             f"{f.k_steps_pv} x m64n{plan.head_dim}k16 (P.V, RS, V MN-major)",
             f"TMA: Q {f.q_bytes} B once, K and V {f.tile_bytes} B each per stage, in {f.panels} 64-column panel(s) "
             f"each, issued by thread {f.issuer_thread} ({'producer' if f.has_producer else 'homogeneous: a consumer'}); "
             "tensor maps: " + "; ".join(m.describe() for m in plan.tensor_maps),
             f"descriptors: 128-byte swizzle, K-major Q and K (SBO {f.swizzle_atom_bytes} B, k16 step "
             f"+{f.k_step_bytes} B), MN-major V (LBO {f.v_lbo_bytes} B between 64-column panels, SBO "
             f"{f.swizzle_atom_bytes} B, k16 step +{f.v_step_bytes} B)",
             "registers: " + (f"setmaxnreg producer {f.producer_registers}, consumer {f.consumer_registers}"
                              if f.producer_registers else "no reallocation"),
             "online softmax: exp2 with the scale folded in; rescale always"
             + ("; overlapped with the previous tile's P.V" if f.overlap else "")
             + ("; consumer warpgroups ping-pong their GEMMs (named barriers 1, 2)" if f.pingpong else ""),
             f"epilogue: {f.epilogue}" + ({"registers": " (4-byte stores of the accumulators)",
                                           "shared": " (staged in the Q tile, 16-byte coalesced stores)",
                                           "tma": " (staged in the Q tile, TMA bulk tensor store)"}[f.epilogue]),
             ("grid: persistent, one block per SM looping over every query block" if plan.persistent else
              "grid: one block per query block"),
             "shared-memory banks: TMA writes and wgmma reads 128-byte-swizzled tiles (conflict-free by layout)"]
    return lines


# Sweep axes. block_m follows the consumer warpgroups (64 rows each), so they move together.
SWEEP_BLOCK_N = (64, 96, 128, 176, 192)
SWEEP_WARPGROUPS = tuple((p, c) for p in (1, 0) for c in (1, 2, 3))   # (producer warpgroups, consumer warpgroups)
SWEEP_STAGES = (2, 3, 4)
SWEEP_REGISTERS = (None, (24, 240), (32, 160))                       # (producer, consumer) after setmaxnreg
SWEEP_SCHEDULES = ("seq", "overlap", "pingpong")
SWEEP_EPILOGUES = ("registers", "tma")   # shared: measured no faster than tma on any cell (H200)
EPILOGUE_TAGS = {"registers": "", "shared": "es", "tma": "et"}


def _read_warpgroups(s) -> tuple[int, int]:
    return s.producer_warps // WARPGROUP, s.compute_warps // WARPGROUP


def _write_warpgroups(data: dict, v: tuple[int, int]) -> None:
    producers, consumers = v
    data["warps"] = ({"producer": WARPGROUP, "consumer": WARPGROUP * consumers} if producers
                     else {"compute": WARPGROUP * consumers})
    data.setdefault("tile", {})["block_m"] = ROWS_PER_WARPGROUP * consumers


def _write_registers(data: dict, v) -> None:
    if v is None:
        data.pop("registers", None)
    else:
        data["registers"] = {"producer": v[0], "consumer": v[1]}


def _read_schedule(s) -> str:
    return "pingpong" if s.schedule.pingpong else "overlap" if s.schedule.overlap else "seq"


def _write_schedule(data: dict, v: str) -> None:
    data["schedule"] = {"overlap": v != "seq", "pingpong": v == "pingpong"}


def sweep_space(base: WgmmaSpec) -> SearchSpace:
    """Tiles, roles (producer warpgroup or homogeneous, 1-3 consumer warpgroups), ring depth,
    register split, schedule and epilogue, around `base`; the spec rules prune what does not fit."""
    regs = (base.registers.producer, base.registers.consumer) if base.registers else None
    return SearchSpace((
        field_axis("block_n", "tile.block_n", with_base(SWEEP_BLOCK_N, base.tile.block_n), lambda s: s.tile.block_n,
                   lambda v: f"n{v}"),
        Axis("warpgroups", tuple(dict.fromkeys(SWEEP_WARPGROUPS + (_read_warpgroups(base),))), _read_warpgroups,
             _write_warpgroups, lambda v: f"c{v[1]}" + ("p" if v[0] else "h"),
             lambda v: f"p+{v[1]}" if v[0] else f"{v[1]}"),
        field_axis("stages", "smem.stages", with_base(SWEEP_STAGES, base.smem.stages), lambda s: s.smem.stages,
                   lambda v: f"s{v}"),
        Axis("registers", tuple(dict.fromkeys(SWEEP_REGISTERS + (regs,))),
             lambda s: (s.registers.producer, s.registers.consumer) if s.registers else None, _write_registers,
             lambda v: f"r{v[0]}x{v[1]}" if v else "", lambda v: f"{v[0]}/{v[1]}" if v else "-"),
        Axis("schedule", SWEEP_SCHEDULES, _read_schedule, _write_schedule,
             lambda v: {"seq": "", "overlap": "o", "pingpong": "pp"}[v]),
        field_axis("epilogue", "epilogue", with_base(SWEEP_EPILOGUES, base.epilogue), lambda s: s.epilogue,
                   lambda v: EPILOGUE_TAGS[v]),
    ))


KIND = Kind(NAME, TITLE, ("mma", FRAGMENT), WgmmaSpec, plan, explain, space=sweep_space)
