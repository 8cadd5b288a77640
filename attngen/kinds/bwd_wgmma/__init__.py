"""bwd_wgmma: the attention backward on Hopper's warpgroup MMA (sm_90a). A bundle of three kernels over
one Params (attngen/core/backward_plan.py), as bwd_mma's:

- main: block (key block, KV head, batch), one warpgroup per 64 keys of the block, or (a block of 64
  keys, head_dim 256) warpgroups that share its 64 keys and split dK's and dV's columns. K and V of
  the block's keys sit in swizzled panels (cp.async); each warpgroup keeps dK and dV of its keys (of
  its columns) in wgmma accumulators. It walks the query blocks of 64 or 128 rows that see its keys (for every query head of its
  KV head), their Q and dO double-buffered (TMA from thread 0, an mbarrier per stage):
  S^T = K Q^T and dP^T = V dO^T (wgmma SS),
  P^T = exp2(m(S^T) scale log2 e - LSE log2 e) and dS^T = P^T (dP^T - delta) m' in registers (m the
  score modifiers, softcap and ALiBi; m' softcap's chain-rule factor),
  dV += P^T dO and dK += dS^T Q with P^T and dS^T as A fragments (wgmma RS, Q and dO MN-major).
  Warpgroups that share keys split the work by queries and columns: each makes S^T and dP^T of its
  share of the query block's columns (wgmma N block_m / W), stores its P^T and dS^T into the step's
  tiles, and after the block barrier computes dV and dK of its columns from both tiles (wgmma SS: A
  K-major from the tiles, Q and dO MN-major). No product is computed twice: the earlier form, every
  such warpgroup making the whole S^T and dP^T to keep P^T and dS^T in registers, did 7 of the 5
  products' tensor work a step at head_dim 256.
  dS^T goes to shared memory; warpgroup w computes its share of dQ = dS K over all the block's keys
  (both operands MN-major): with query blocks of 64 rows, columns [w d / W, (w + 1) d / W); with
  query blocks of 64 W rows, rows [64 w, 64 w + 64) at every column (each warpgroup then reads only
  its queries' dS^T). dQ is issued first and dV, dK behind it; each thread adds its dQ registers into
  the fp32 accumulator with red.global.add.f32 while dV and dK run, in register order: the
  accumulator keeps each 64-row block in that order, and the convert kernel reads it so. At head_dim
  64, and at 128 but for the full mask (dq_pair_masks), each pair of adjacent columns goes as one
  red.global.add.v2.f32 instead, in register-pair order, which the convert part's convert_pairs reads.
  Query blocks of another multiple of 16 rows (80 at head_dim 128, full masks: FlashAttention-3's tile
  there) are no m64 wgmma's M: warpgroup w computes dQ^T = K^T dS^T instead, its 64 head-dim columns as M
  and the query block as N, the dS^T tile in 32-byte panels (dq_transposed); its pairs are two adjacent
  queries of one column, and convert_pairs turns the accumulator's 8 x 8 runs round by warp shuffles.
- preprocess: delta = rowsum(dO * O), zeros in the accumulator (whole query blocks);
- convert: dQ = scale * accumulator.

A spec with `group_split: true` adds, per mask, a group-split main function for GQA/MQA calls: the
grid (key blocks, kv_heads x splits, batch) spreads each KV head's query heads over `splits` blocks,
each adding its dK and dV into fp32 sums after the dQ accumulator (red.global.add), and the convert
part's kv_convert writes dk and dv from them (the template's add_key_gradients says why sums).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from pydantic import Field

from ...core.backward_space import wgmma_backward_space
from ...core.backward_plan import ACCUM_FRAGMENT_ROWS, BACKWARD_ABI_FIELDS, BackwardPlan, backward_parts
from ...core.forward_plan import ELEMENT_TYPES, FORWARD_ABI, ForwardPlan, plan_abi, spec_variants, tensor_fields
from ...core.kind import Kind
from ...core.launch_rules import ROW_THREADS, dq_convert, lanes_per_row, rows_per_row_block
from ...core.layout import Barrier, Budget, Region, Swizzle, TileCopy, barrier_region, check_budget, layout_regions
from ...core.tensor_maps import TensorMapSpec, map_abi_fields
from ...core.spec_keys import (ForwardSpec, HomogeneousWarps, refuse, round_up, rule_backward_no_rescale,
                               rule_backward_varlen_no_expressions,
                               rule_head_dim_vector_loads)
from ...core.wgmma import (ROWS_PER_WARPGROUP, WARPGROUP, panel_swizzle, rule_swizzle_panels, rule_target_has_sm90a,
                           swizzled_tile, widest_panels)
from ...targets import TARGETS

NAME = "bwd_wgmma"
TITLE = "wgmma attention backward (sm_90a; dQ by red.global.add from registers)"
SELECTOR = ("backward", "wgmma_dq_red")
KEYS_PER_WARPGROUP = 64     # the M of S^T, dP^T, dK and dV
MAX_WARPGROUPS = 2          # dK and dV of 64 keys take head_dim fp32 registers per thread: two warpgroups
                            # of 128 threads get at most 255 each
MAX_HEAD_DIM = 256          # the N of dK's and dV's wgmma (one warpgroup holds every column)
QUERY_STAGES = 2            # Q and dO of the step computing and of the next, loading
REGISTER_MARGIN = 40        # registers a thread needs beside its accumulators and fragments (addresses, stats)
MAX_REGISTERS = 255         # a thread's most; 256 threads of one block use the whole register file


class WgmmaBackwardSpec(ForwardSpec):
    backward: Literal["wgmma_dq_red"] = Field(description=(
        "wgmma_dq_red: Hopper warpgroup MMA (mma: wgmma_m64nNk16) from swizzled shared memory; blocks over keys "
        "hold dK and dV and add dQ into an fp32 buffer from the wgmma accumulators (red.global.add) "
        "(picks the backward kind)"))
    mma: Literal["wgmma_m64nNk16"] = Field(default="wgmma_m64nNk16", description="the fragment of every GEMM")
    row_unit = ROWS_PER_WARPGROUP
    row_unit_what = "query rows (the M of dQ's wgmma)"
    key_unit = KEYS_PER_WARPGROUP
    key_unit_why = "64 keys per warpgroup"
    masks_taken = ("none", "causal", "window", "expr")
    takes_scores = True
    takes_head_dim_v: ClassVar[bool] = True   # V, O, dO and dV of their own head dim (DeepSeek MLA: 192 / 128)
    group_split: bool = Field(default=False, description=(
        "also emit a group-split main function per mask for GQA/MQA calls (kv_heads < heads): the blocks of "
        "a KV head's query heads are spread over the grid (key blocks, kv_heads x splits, batch), each adding "
        "its dK and dV into fp32 sums that a kv_convert kernel turns into dk and dv; the call picks the split "
        "count from the shape (1: the unsplit functions)"))

    def swizzled_row_chunks(self) -> int:
        panel = panel_swizzle(self)
        return panel.row_bytes // 16 if panel else super().swizzled_row_chunks()

    def register_need(self):
        return (register_need(self), f"a thread's dK, dV, S^T and dP^T accumulators, P^T and dS^T fragments + "
                                     f"{REGISTER_MARGIN}")


def register_need(s) -> int:
    """dK, dV, S^T and dP^T in flight at once (P^T and dS^T fragments replace S^T and dP^T)."""
    groups = column_groups(s)
    return (tile_dim(s) // groups + tile_dim_v(s) // groups) // 2 + 2 * (s_cols(s) // 2) + REGISTER_MARGIN


def s_cols(s) -> int:
    """Queries of S^T and dP^T a warpgroup computes: the query block, or where warpgroups share the block's
    keys, its share of the block's queries (each stores its P^T and dS^T for the others' dV and dK)."""
    return s.tile.block_m // column_groups(s)


def tile_dim(s) -> int:
    """Columns of the Q and K tiles (and of dQ's and dK's wgmma): head_dim rounded up to the k16 steps
    of S^T. The columns past head_dim hold zeros (TMA's fill for Q, cp.async's for K) and are never
    stored (head_dim 40: 48)."""
    return round_up(s.head_dim, 16)


def tile_dim_v(s) -> int:
    """Columns of the V and dO tiles (and of dV's wgmma): V's head dim rounded up as tile_dim."""
    return round_up(s.v_dim, 16)


def column_groups(s) -> int:
    """Warpgroups that share each 64 keys of the block, splitting dK's and dV's columns: all of them in a
    block of 64 keys (head_dim 256: dK and dV of 64 keys x 256 columns would take a thread 256
    registers), else 1 (a warpgroup per 64 keys)."""
    warpgroups = max(s.compute_warps // WARPGROUP, 1)
    return warpgroups if s.tile.block_n == KEYS_PER_WARPGROUP else 1


def dq_by_rows(s) -> bool:
    """Query blocks of 64 rows per warpgroup: each warpgroup computes dQ of its 64 rows (all columns),
    reading only its queries' dS^T; query blocks of 64: each computes a share of the columns."""
    return s.tile.block_m == ROWS_PER_WARPGROUP * max(s.compute_warps // WARPGROUP, 1) > ROWS_PER_WARPGROUP


def dq_transposed(s) -> bool:
    """Query blocks of another multiple of 16 rows (80 at head_dim 128: FlashAttention-3's tile for that
    case), which no m64 wgmma covers as dQ's M: each warpgroup computes dQ^T = K^T dS^T instead, its 64
    head-dim columns as M and the query block as N, reading every key's dS^T (a tile in 32-byte panels:
    80 queries are no whole 64-column panel). Its adds are pairs of adjacent queries of one column."""
    return s.tile.block_m not in (ROWS_PER_WARPGROUP, ROWS_PER_WARPGROUP * max(s.compute_warps // WARPGROUP, 1))


def dq_pair_masks(s) -> tuple[str, ...]:
    """The masks whose functions add each thread's dQ registers a pair of adjacent columns at a time (one
    red.global.add.v2.f32, the accumulator in register-pair order) rather than one float each: half the
    reduce instructions of a step. As measured on the H200 against one float per add
    (docs/performance/backward.md, "dQ added in pairs"):
    - head_dim 64: every mask (causal cells gained 1-7 %, full masks 0-3 %, deterministic mode unmoved);
    - head_dim 128: every mask but none (causal cells gained 2-7 %; full masks at 8192 keys lost 1.2-3.4 %,
      and with the full mask's walks staggered, one run, 1.1 % behind the staggered walk's one float per add);
    - 256 moved within 1.1 %, and the other head dims were not measured: one float per add."""
    if s.head_dim == 64 or dq_transposed(s):   # dQ^T: the convert reads 8 x 8 tiles, whole only in pair order
        return tuple(s.masks)
    if s.head_dim == 128:
        return tuple(m for m in s.masks if m != "none")
    return ()


def dq_order(s) -> str:
    """The dQ accumulator's order, as the explanations name it."""
    pairs = dq_pair_masks(s)
    if not pairs:
        return "register order"
    if set(pairs) == set(s.masks):
        return "register-pair order"
    return f"register-pair order ({', '.join(pairs)}; the other masks register order)"


def dq_red(s) -> str:
    """The reduce-add instruction a thread adds its dQ registers with."""
    pairs = dq_pair_masks(s)
    if not pairs:
        return "red.global.add.f32"
    return "red.global.add.v2.f32" if set(pairs) == set(s.masks) else "red.global.add.v2.f32 or .f32 by mask"


def rule_backward_warpgroups(s):
    if not isinstance(s.warps, HomogeneousWarps):
        return "warps", "the backward's warpgroups all copy and compute; use warps: {compute: 8}"
    if s.compute_warps % WARPGROUP or not 1 <= s.compute_warps // WARPGROUP <= MAX_WARPGROUPS:
        return "warps.compute", (f"one warpgroup (4 warps) per 64 keys, at most {MAX_WARPGROUPS}: use 4 or 8 "
                                 f"(got {s.compute_warps})")
    if s.tile.block_n not in (KEYS_PER_WARPGROUP * (s.compute_warps // WARPGROUP), KEYS_PER_WARPGROUP):
        return "tile.block_n", (f"must be 64 x warpgroups = {KEYS_PER_WARPGROUP * (s.compute_warps // WARPGROUP)} "
                                f"(each warpgroup owns 64 keys of the block) or {KEYS_PER_WARPGROUP} (the warpgroups "
                                f"share its keys, each holding its share of dK's and dV's columns) "
                                f"(got {s.tile.block_n})")
    by_rows = ROWS_PER_WARPGROUP * (s.compute_warps // WARPGROUP)
    if s.tile.block_m % 16 or not 16 <= s.tile.block_m <= by_rows:
        return "tile.block_m", (f"must be {ROWS_PER_WARPGROUP} (dQ of a query block split by columns, one m64 "
                                f"wgmma per warpgroup), {by_rows} (64 rows per warpgroup, dQ split by rows) or "
                                f"another multiple of 16 up to {by_rows} (dQ^T by head-dim columns) "
                                f"(got {s.tile.block_m})")


def rule_backward_head_dim(s):
    if s.head_dim > MAX_HEAD_DIM:
        return "head_dim", f"must be at most {MAX_HEAD_DIM} (the N of dK's and dV's wgmma) (got {s.head_dim})"
    panel = panel_swizzle(s)
    warpgroups = max(s.compute_warps // WARPGROUP, 1)
    if s.head_dim % 16:
        padded = tile_dim(s)
        if panel and padded % panel.cols:
            return "head_dim", (f"head_dim {s.head_dim} is padded to {padded} columns (the k16 steps of S^T), which "
                                f"must be whole {panel.cols}-column panels: use {widest_panels(padded).describe()}")
        if column_groups(s) > 1 or not (dq_by_rows(s) or warpgroups == 1):
            return "head_dim", (f"head_dim {s.head_dim} is padded to {padded} columns: each warpgroup's dQ must cover "
                                f"every column (query blocks of {ROWS_PER_WARPGROUP * warpgroups} rows, or one "
                                f"warpgroup) and hold dK and dV of all of them (blocks of "
                                f"{KEYS_PER_WARPGROUP * warpgroups} keys)")
        if s.head_dim_v not in (None, s.head_dim):
            return "head_dim_v", f"a padded head_dim ({s.head_dim}) takes V of its own head dim; remove head_dim_v"
    if s.head_dim_v not in (None, s.head_dim):
        if s.head_dim_v % 16 or s.head_dim_v > s.head_dim:
            return "head_dim_v", (f"must be a multiple of 16 (the k16 steps of dP^T) and at most head_dim "
                                  f"{s.head_dim} (the preprocess kernel's row lanes cover head_dim) "
                                  f"(got {s.head_dim_v})")
        if s.varlen:
            return "head_dim_v", "a V head dim of its own is generated for padded calls: remove varlen"
        groups = column_groups(s)
        if panel and (s.head_dim_v // groups) % panel.cols:
            return "smem.swizzle", (f"each of the {groups} warpgroup(s) holding dV holds {s.head_dim_v // groups} of its "
                                    f"columns, which must be whole {panel.cols}-column panels: use "
                                    f"{widest_panels(s.head_dim_v // groups).describe()}")
    if panel and s.head_dim % 16 == 0 and s.head_dim % panel.cols:
        return "smem.swizzle", (f"head_dim {s.head_dim} must be whole {panel.cols}-column panels: use "
                                f"{widest_panels(s.head_dim).describe()}")
    if panel and not dq_by_rows(s) and (tile_dim(s) // warpgroups) % panel.cols:
        return "smem.swizzle", (f"each of the {warpgroups} warpgroups computes {s.head_dim // warpgroups} columns of "
                                f"dQ, which must be whole {panel.cols}-column panels (wgmma reads MN-major operands "
                                f"by whole panels): use {widest_panels(s.head_dim // warpgroups).describe()} "
                                f"({widest_panels(s.head_dim // warpgroups).cols}-column panels)")
    groups = column_groups(s)
    if panel and (tile_dim(s) // groups) % panel.cols:
        return "smem.swizzle", (f"each of the {groups} warpgroups that share the block's keys holds "
                                f"{s.head_dim // groups} columns of dK and dV, which must be whole {panel.cols}-column "
                                "panels (their wgmma reads Q and dO MN-major by whole panels)")


rule_backward_dq_transposed = refuse(
    "tile.block_m", lambda s: dq_transposed(s) and (
        s.head_dim != ROWS_PER_WARPGROUP * (s.compute_warps // WARPGROUP) or s.v_dim != s.head_dim
        or column_groups(s) > 1 or s.varlen or set(s.masks) != {"none"}),
    lambda s: (f"query blocks of {s.tile.block_m} rows take dQ^T (each warpgroup's 64 head-dim columns as the M of "
               f"its wgmma): generated for head_dim 64 x warpgroups ({ROWS_PER_WARPGROUP * (s.compute_warps // WARPGROUP)}"
               f"), a warpgroup per 64 keys, mask none alone (the others spill), no head_dim_v and no varlen; "
               f"use block_m: {ROWS_PER_WARPGROUP}"),
    "rule_backward_dq_transposed")
rule_backward_copies = refuse(
    "smem", lambda s: not s.smem.async_copy or s.smem.stages != 1 or s.smem.q_in_registers,
    lambda s: "this backward copies K and V with cp.async and double-buffers Q and dO itself (TMA): set "
              "async_copy: true and leave stages and q_in_registers unset", "rule_backward_copies")
rule_backward_registers = refuse(
    "tile.block_m", lambda s: register_need(s) > MAX_REGISTERS,
    lambda s: (f"a thread would hold dK, dV, S^T and dP^T together: {register_need(s)} registers with the margin, "
               f"over {MAX_REGISTERS}; use block_m: {ROWS_PER_WARPGROUP} (query blocks of {s.tile.block_m} fit "
               f"head_dim {MAX_REGISTERS - REGISTER_MARGIN - s.tile.block_m} or less)"), "rule_backward_registers")
rule_backward_rows_plain = refuse(
    "tile.block_m", lambda s: dq_by_rows(s) and s.varlen,
    lambda s: f"varlen is generated for query blocks of {ROWS_PER_WARPGROUP} rows (with {s.tile.block_m} its varlen "
              f"functions spill at 255 registers): set tile.block_m: {ROWS_PER_WARPGROUP}", "rule_backward_rows_plain")
rule_backward_opt_in = refuse(
    "smem.opt_in", lambda s: not s.smem.opt_in,
    lambda s: "the K, V, Q, dO and dS^T panels take more than 48 KiB: set smem.opt_in: true",
    "rule_backward_opt_in")
# The main kernel's launch bounds say one block per SM (its threads take up to 255 registers each):
# a spec's own count would be accepted and never reach the kernel.
rule_backward_one_block = refuse(
    "min_blocks_per_sm", lambda s: s.min_blocks_per_sm is not None,
    lambda s: ("this backward runs one block per SM (its threads hold dK, dV, S^T and dP^T in up to "
               f"{MAX_REGISTERS} registers each); remove min_blocks_per_sm"), "rule_backward_one_block")

rule_backward_group_split = refuse(
    "group_split", lambda s: s.group_split and (s.head_dim % 16 or s.v_dim != s.head_dim or not s.padded),
    lambda s: ("group-split functions serve padded GQA/MQA calls, which a varlen: only spec has none of: remove "
               "group_split" if not s.padded else
               "group_split is generated for one head dim of whole k16 steps (no padding, no head_dim_v): remove it"),
    "rule_backward_group_split")

WgmmaBackwardSpec.rules = (rule_target_has_sm90a, rule_head_dim_vector_loads, rule_swizzle_panels,
                           rule_backward_warpgroups, rule_backward_dq_transposed, rule_backward_head_dim,
                           rule_backward_varlen_no_expressions,
                           rule_backward_copies, rule_backward_opt_in,
                           rule_backward_registers, rule_backward_rows_plain, rule_backward_one_block,
                           rule_backward_no_rescale, rule_backward_group_split)


@dataclass(frozen=True, kw_only=True)
class WgmmaBackwardFragments:
    warpgroups: int         # consumer warpgroups, 64 keys each (column_groups of them share each 64 keys)
    column_groups: int      # warpgroups sharing each 64 keys: warpgroup w holds dK and dV of its keys' columns
                            # [dkv_cols (w % column_groups), + dkv_cols)
    dkv_cols: int           # dK and dV columns per warpgroup (head_dim / column_groups; whole panels)
    s_cols: int             # queries of S^T and dP^T per warpgroup (block_m / column_groups)
    s_regs: int             # S^T (and dP^T) accumulators per thread: 64 keys x s_cols queries
    d_regs: int             # dK (and dV) accumulators per thread: 64 keys x dkv_cols
    dq_by_rows: bool        # each warpgroup computes dQ of its 64 query rows (else: of its columns)
    dq_cols: int            # dQ columns per warpgroup (whole panels); dQ^T: the query block (its N)
    dq_regs: int            # dQ accumulators per thread: 64 rows x dq_cols (dQ^T: 64 head-dim columns x queries)
    k_steps_d: int          # k16 steps over head_dim (S^T, dP^T)
    k_steps_m: int          # k16 steps over the query block (dK, dV)
    k_steps_n: int          # k16 steps over the key block (dQ)
    query_stage_bytes: int  # from stage 0's Q (dO) tile to stage 1's
    panel_cols: int         # elements of one swizzled panel row
    panel_row_bytes: int    # its bytes: the swizzle's span
    panel_row_shift: int    # rows sharing one XOR pattern: 2^shift
    descriptor_mode: int    # the swizzle in bits 62-63 of a wgmma descriptor
    row_block: int          # query rows per preprocess / convert block
    row_lanes: int          # ... threads per row (head_dim / 8 rounded up to a power of two)
    accum_row_block: int    # the accumulator holds whole query blocks of each head
    accum_fragment_rows: int  # ... each a run of blocks of this many rows (a warpgroup's m64) in register(-pair) order
    accum_fragment_cols: int  # ... dq_cols per warpgroup (head_dim where the tiles are padded past it)
    pair_masks: tuple[str, ...] = ()  # ... the masks whose functions add in register-pair order, a pair of
                                      # adjacent columns per 8-byte add (dq_pair_masks); the others register order
    tile_dim: int = 0       # columns of the Q and K tiles where head_dim is padded to the k16 steps (0: head_dim)
    head_dim_v: int = 0     # V's head dim where it differs (0: head_dim): V, dO and dV have these columns
    dkv_cols_v: int = 0     # ... dV's columns per warpgroup (head_dim_v / column_groups)
    d_regs_v: int = 0       # ... dV accumulators per thread: 64 keys x dkv_cols_v
    k_steps_dv: int = 0     # ... k16 steps over head_dim_v (dP^T)
    dq_staging: bool = False  # deterministic dQ waits in a region of its own (the stage's Q and dO tiles are smaller)
    group_split: bool = False  # group-split functions (GQA): dK and dV added into fp32 sums, kv_convert in the convert part
    dq_transposed: bool = False  # dQ^T = K^T dS^T: warpgroup w's head-dim columns [64w, 64w + 64) as M, the query block as N
    ds_panel_cols: int = 0  # ... the dS^T tile's panels (its query columns): elements of one panel row
    ds_panel_row_bytes: int = 0   # ... its bytes
    ds_panel_row_shift: int = 0   # ... rows sharing one XOR pattern: 2^shift
    ds_descriptor_mode: int = 0   # ... the swizzle in a wgmma descriptor


def fragments(spec: WgmmaBackwardSpec, query_stage_bytes: int) -> WgmmaBackwardFragments:
    d, bm, bn = spec.head_dim, spec.tile.block_m, spec.tile.block_n
    td, dv = tile_dim(spec), spec.v_dim
    panel = panel_swizzle(spec)
    w = spec.compute_warps // WARPGROUP
    by_rows = dq_by_rows(spec)
    transposed = dq_transposed(spec)
    dq_cols = td if by_rows else bm if transposed else td // w
    groups = column_groups(spec)
    own_v = dv != d
    ds_panel = widest_panels(bm) if transposed else panel
    return WgmmaBackwardFragments(
        warpgroups=w, column_groups=groups, dkv_cols=td // groups, s_cols=s_cols(spec), s_regs=s_cols(spec) // 2,
        d_regs=td // groups // 2,
        dq_by_rows=by_rows, dq_cols=dq_cols, dq_regs=dq_cols // 2,
        k_steps_d=td // 16, k_steps_m=bm // 16, k_steps_n=bn // 16, query_stage_bytes=query_stage_bytes,
        panel_cols=panel.cols, panel_row_bytes=panel.row_bytes, panel_row_shift=panel.row_shift,
        descriptor_mode=panel.descriptor_mode, row_block=rows_per_row_block(d), row_lanes=lanes_per_row(d),
        accum_row_block=bm,
        accum_fragment_rows=bm if transposed else ACCUM_FRAGMENT_ROWS,
        accum_fragment_cols=ROWS_PER_WARPGROUP if transposed else dq_cols if td == d else d,
        pair_masks=dq_pair_masks(spec),
        tile_dim=td if td != d else 0, head_dim_v=dv if own_v else 0,
        dkv_cols_v=dv // groups if own_v else 0, d_regs_v=dv // groups // 2 if own_v else 0,
        k_steps_dv=dv // 16 if own_v else 0, dq_staging=dq_staging(spec), group_split=spec.group_split,
        dq_transposed=transposed, ds_panel_cols=ds_panel.cols if transposed else 0,
        ds_panel_row_bytes=ds_panel.row_bytes if transposed else 0,
        ds_panel_row_shift=ds_panel.row_shift if transposed else 0,
        ds_descriptor_mode=ds_panel.descriptor_mode if transposed else 0)


def dq_share_bytes(s) -> int:
    """Deterministic mode's dQ of one warpgroup and step, fp32: 64 rows x its columns (the ones stored)."""
    w = s.compute_warps // WARPGROUP
    if dq_transposed(s):   # 64 head-dim columns x the query block
        return ROWS_PER_WARPGROUP * s.tile.block_m * 4
    cols = s.head_dim if dq_by_rows(s) or w == 1 else tile_dim(s) // w
    return ROWS_PER_WARPGROUP * cols * 4


def dq_staging(s) -> bool:
    """Deterministic mode stages every warpgroup's dQ in a region of its own where a step's Q and dO
    tiles hold less (V's head dim below Q's); else in them."""
    w = s.compute_warps // WARPGROUP
    stage = s.tile.block_m * (tile_dim(s) + tile_dim_v(s)) * s.elem_bytes
    return w * dq_share_bytes(s) > stage


def tensor_maps(spec: WgmmaBackwardSpec) -> tuple[TensorMapSpec, ...]:
    """Q and dO reach their tiles by TMA: one box per swizzled panel of a query block's rows."""
    panel = panel_swizzle(spec)
    return tuple(TensorMapSpec(t, spec.tile.block_m, panel.cols, panel.tma_name) for t in ("q", "dout"))


def regions(spec: WgmmaBackwardSpec) -> list[Region]:
    """Q and dO of QUERY_STAGES query blocks (TMA writes them), K and V of the block's keys (cp.async),
    dS^T of QUERY_STAGES steps (and P^T, where warpgroups share the keys; all swizzled panels), two
    steps' row statistics and the stages' mbarriers."""
    ctype = ELEMENT_TYPES[spec.dtype][0]
    panel = panel_swizzle(spec)
    d, dv, bm, bn = tile_dim(spec), tile_dim_v(spec), spec.tile.block_m, spec.tile.block_n
    stages = [swizzled_tile(f"{name}{s or ''}", bm, cols, panel, ctype, f"{what} tile of a query block (stage {s})")
              for s in range(QUERY_STAGES) for name, what, cols in (("q", "Q", d), ("do", "dO", dv))]
    staging = ([Region("dqs", ROWS_PER_WARPGROUP * (spec.compute_warps // WARPGROUP), dq_share_bytes(spec) // 4 //
                       ROWS_PER_WARPGROUP, "float", 4, dq_share_bytes(spec) // ROWS_PER_WARPGROUP,
                       per=f"deterministic mode: each warpgroup's dQ of the step, in {dq_order(spec)}, for one bulk "
                           "reduce-add (a step's Q and dO tiles hold less)")]
               if dq_staging(spec) else [])
    return [*stages,
            swizzled_tile("k0", bn, d, panel, ctype, "K tile of the block's keys, loaded once"),
            swizzled_tile("v0", bn, dv, panel, ctype, "V tile of the block's keys, loaded once"),
            *(swizzled_tile(f"ds{s or ''}", bn, bm, widest_panels(bm) if dq_transposed(spec) else panel, ctype,
                            f"dS^T of the block's keys x the query block, for "
                            f"{'dQ' if column_groups(spec) == 1 else 'dQ and dK'} (stage {s}: a warpgroup may write "
                            f"the next step's while the other's dQ still reads this one)") for s in range(QUERY_STAGES)),
            *(swizzled_tile(f"p{s or ''}", bn, bm, panel, ctype, f"P^T of the block's keys x the query block, for "
                            f"dV (stage {s}: each column group stores its queries' share)")
              for s in range(QUERY_STAGES) if column_groups(spec) > 1),
            Region("stats", 2, 2 * bm, "float", 4, 2 * bm * 4, per="per stage: the query block's LSE x log2(e) "
                   "(+inf: a row that adds nothing), then its rowsum(dO * O)"),
            barrier_region("bars", QUERY_STAGES, "per stage: its Q and dO tiles have landed (TMA transactions)"),
            *staging]


def plan(spec: WgmmaBackwardSpec, file: str | None = None) -> BackwardPlan:
    target = TARGETS[spec.target]
    ctype, ctype2, ptx_type = ELEMENT_TYPES[spec.dtype]
    d, bm, bn = spec.head_dim, spec.tile.block_m, spec.tile.block_n
    panel = panel_swizzle(spec)
    laid = layout_regions(regions(spec))
    budget = Budget.of(target, spec.smem.opt_in)
    total = check_budget(laid, budget, file)
    offsets = {r.name: r.offset for r in laid}
    stage_bytes = offsets["q1"] - offsets["q"]
    assert all(offsets[f"{n}{s}"] - offsets[f"{n}{s - 1 or ''}"] == stage_bytes for n in ("q", "do")
               for s in range(1, QUERY_STAGES))
    f = fragments(spec, stage_bytes)
    w = f.warpgroups
    variants = spec_variants(spec)
    maps = tensor_maps(spec)
    abi = plan_abi(variants["mask_variants"], varlen=spec.varlen, reports_errors=False, scores=variants["score_variants"],
                   base=FORWARD_ABI.with_fields(BACKWARD_ABI_FIELDS)).with_fields(map_abi_fields(maps))
    bars = tuple(Barrier(f"qfull{s}", s, offsets["bars"] + 8 * s, 1, "thread 0 (arrive.expect_tx with the Q and dO "
                         "bytes), then the TMA transactions", "all threads (before their first wgmma of the step)")
                 for s in range(QUERY_STAGES))
    threads = 32 * spec.compute_warps
    padded = (f"; head_dim {d} padded to {f.tile_dim} columns in the Q and K tiles (TMA and cp.async fill zeros; "
              "dQ, dK and dV of the columns past head_dim are not stored)" if f.tile_dim else "")
    own_v = (f"; V, dO and dV of head_dim_v {f.head_dim_v} (dP^T over its k16 steps, dV of {f.dkv_cols_v} columns per "
             "warpgroup)" if f.head_dim_v else "")
    dq_share = ("dQ's rows [64w, 64w + 64) of the query block" if f.dq_by_rows else
                "dQ^T's rows [64w, 64w + 64) (dQ's head-dim columns)" if f.dq_transposed else
                f"dQ's columns [{f.dq_cols}w, {f.dq_cols}w + {f.dq_cols})")
    dq_issue = (f"dQ[64w:64w + 64, :] = dS K (wgmma SS, MN-major, N {f.dq_cols}; dS of the warpgroup's queries only)"
                if f.dq_by_rows else
                f"dQ^T[64w:64w + 64, :] = K^T dS^T (wgmma SS, MN-major, N {f.dq_cols}: K's columns of the warpgroup, "
                f"the dS^T tile in {f.ds_panel_row_bytes}-byte panels)" if f.dq_transposed else
                f"dQ[:, {f.dq_cols}w:] = dS K (wgmma SS, MN-major, N {f.dq_cols})")
    owns = ("warpgroup w owns keys [64w, 64w + 64) of the block (dK, dV, S^T, dP^T in wgmma accumulators)"
            if f.column_groups == 1 else
            f"the warpgroups share the block's 64 keys: warpgroup w computes S^T and dP^T of queries "
            f"[{f.s_cols}w, {f.s_cols}w + {f.s_cols}) of the query block (wgmma accumulators) and stores its P^T and "
            f"dS^T, and holds dK and dV of columns [{f.dkv_cols}w, {f.dkv_cols}w + {f.dkv_cols})")
    step_tiles = ("dS^T to the step's own dS^T tile" if f.column_groups == 1 else
                  "dS^T and P^T to the step's own tiles")
    roles = (f"{w} warpgroup(s): all copy K and V (cp.async), thread 0 issues the Q and dO copies (TMA); {owns} and "
             f"{dq_share}{padded}{own_v}",)
    schedule = ("main kernel, grid (key blocks, kv_heads, batch), 1 block per SM:",
                "  thread 0 initialises the 2 stages' mbarriers (fence.mbarrier_init); load K, V of the block's keys "
                "(cp.async into swizzled panels, rows past seqlen_k zero); thread 0 issues the first query block's Q "
                "and dO (TMA, one box per panel, on its stage's mbarrier); the first 2 block_m threads store its LSE "
                "and delta; wait for K, V (cp.async, fence.proxy.async); __syncthreads",
                f"  for each query head of the KV head, each query block of {bm} rows that sees a key of the block "
                "(a cursor of query head and first row, moved on one block per step):",
                "    each of the first 2 block_m threads loads its LSE or delta of the next step (a register); every "
                "thread waits for this step's Q, dO (the stage's mbarrier); a varlen sequence's last query block: its "
                "rows past the sequence become zeros (stores, fence.proxy.async, __syncthreads)",
                f"    issue S^T = K Q^T and dP^T = V dO^T (wgmma SS, N {f.s_cols}); wait S^T: P^T = exp2(m(S^T) scale_log2 - "
                "LSE log2 e) (m: the score modifiers; masked: 0); wait dP^T: dS^T = P^T (dP^T - delta) x m' "
                "(softcap's m' = 1 - tanh^2 is not held across the wait: P^T and dS^T are made in one pass after it)",
                f"    {step_tiles} (swizzled; a tile per stage, since the other warpgroup may "
                "still read the last step's); the next step's LSE and delta to its stage's buffer; fence.proxy.async; "
                "__syncthreads, the step's one block barrier (no barrier at the top of a step); thread 0 issues the "
                "next query block's Q, dO into the other stage (TMA: every wgmma of the last step, which read it, is "
                "complete)",
                f"    issue {dq_issue}, then dV += P^T dO, dK += dS^T Q behind it "
                + ("(wgmma RS, N head_dim)" if f.column_groups == 1 else
                   f"(wgmma SS from the P^T and dS^T tiles, N {f.dkv_cols})") + "; wait for dQ",
                f"    each thread adds its dQ registers into the accumulator ({dq_red(spec)}, {dq_order(spec)}) while "
                "dV and dK run; wait for them",
                "    (deterministic instead: " + ("dV and dK issued before the __syncthreads, dQ after it"
                                                   if f.column_groups == 1 else "all three issued after the __syncthreads")
                + ", wait for all three; "
                f"__syncthreads; dQ staged in {dq_order(spec)} in this step's Q and dO tiles; "
                "fence.proxy.async; thread 0 waits for the block's turn at this query block; __syncthreads; each "
                "warpgroup's first thread issues one bulk reduce-add of its share, waits for it, __threadfence; "
                "__syncthreads; thread 0 passes the turn)",
                "  __syncthreads; each warp packs dK x scale and dV of its 16 keys into its rows of the K and V "
                "tiles, then writes them out in 16-byte stores of whole rows (rows < seqlen_k)" if f.column_groups == 1
                else "  __syncthreads; each warp packs dK x scale and dV of its 16 keys and its columns into the K and "
                "V tiles, then writes them out in 16-byte stores (rows < seqlen_k)",
                *(("varlen functions: a block per (key block, KV head, sequence), Params narrowed to the sequence; "
                   "each sequence's accumulator blocks start at block (its first row's block + its index), so no "
                   "query block spans two sequences (the convert kernel finds a row's sequence by bisection)",)
                  if spec.varlen else ()),
                *(("group-split functions (GQA/MQA calls, not deterministic): grid (key blocks, kv_heads x splits, "
                   "batch); block y walks the query heads [y % splits x group / splits, + group / splits) of KV head "
                   "y / splits and adds its dK and dV into fp32 sums (red.global.add; the sums, (batch, kv_heads, "
                   "seqlen_k, head_dim) each, follow the dQ accumulator, zeroed by the call); kv_convert: dk = scale x "
                   "sum, dv = sum, grid (ceil(seqlen_k / rows), kv_heads, batch)",) if spec.group_split else ()),
                f"preprocess, {' / '.join(dict.fromkeys(dq_convert(mask, f.pair_masks) for mask in spec.masks))}: grid (ceil(rows / "
                f"{f.row_block}), heads, batch), {ROW_THREADS} threads, "
                f"head_dim / 8 threads per row (rows: seqlen_q rounded up to {bm} for the preprocess's zeros)")
    block_text = (f"block: {bn} keys of one KV head; the query blocks of {bm} rows that see them, for every query "
                  "head of the KV head",
                  f"threads: {threads} = {w} warpgroup(s) of 64 keys" if f.column_groups == 1 else
                  f"threads: {threads} = {w} warpgroups sharing 64 keys, {f.dkv_cols} columns of dK and dV each",
                  "masks: " + ", ".join(spec.masks))
    forward = ForwardPlan(
        spec=spec, kind=KIND, title=TITLE, target=target, **variants, parts=(), abi=abi,
        head_dim_v=spec.v_dim if spec.v_dim != d else 0,
        ctype=ctype, ctype2=ctype2, ptx_type=ptx_type, head_dim=d, block_m=bm, block_n=bn,
        compute_warps=spec.compute_warps, producer_warps=0, threads=threads, compute_threads=threads,
        producer_threads=0, rows_per_warp=16, chunks_per_row=d * 2 // 16,
        swizzle=Swizzle("xor", panel.row_bytes, panel.xor_bits, panel.row_shift), regions=laid, smem_bytes=total,
        smem_budget=budget.bytes, smem_dynamic=total > target.smem_per_block, stages=1, async_copy=True,
        q_in_registers=False, rescale="always", q_copy=TileCopy(bm, d * 2 // 16, 1),
        kv_copy=TileCopy(bn, d * 2 // 16, threads), barriers=bars, kv_stage_stride=0, min_blocks_per_sm=1,
        fragments=f, arch_suffix="a", tensor_maps=maps, params_qualifier="__grid_constant__ ")
    main_unread = tensor_fields("q") + tensor_fields("dout")   # the main kernel reads Q and dO through the maps
    return BackwardPlan.of(forward, parts=backward_parts(spec, abi, accum_blocks=True, main_unread=main_unread,
                                                         group_split=spec.group_split, pair_masks=f.pair_masks),
                           roles=roles, schedule=schedule, block_text=block_text,
                           copy_engine=f"K, V: cp.async (16-byte chunks, every thread); Q, dO: TMA "
                                       f"(cp.async.bulk.tensor, one thread); {panel.row_bytes}-byte-swizzled panels",
                           pipeline_text="copies: K and V of the block's keys once (cp.async, every thread); Q and dO "
                                         "of each query block in 2 stages by TMA (thread 0), the next block's issued "
                                         "at this one's block barrier (after its dS^T is written)")


def explain(plan) -> list[str]:
    f = plan.fragments
    shared = f.column_groups > 1   # warpgroups share the keys: P^T and dS^T pass through their tiles
    dv_cols = f.dkv_cols_v or f.dkv_cols
    return [f"accumulators per thread: dK, dV {f.d_regs} each, S^T, dP^T {f.s_regs} each, dQ {f.dq_regs}; "
            + (f"P^T and dS^T stored to their tiles ({f.s_cols // 16} k16 steps each)" if shared else
               f"P^T and dS^T as {f.s_cols // 16} A fragments each"),
            f"wgmma per query block per warpgroup: {f.k_steps_d} x m64n{f.s_cols}k16 (S^T, SS) + {f.k_steps_d} "
            f"(dP^T, SS) + {f.k_steps_m} x m64n{dv_cols}k16 (dV, {'SS from the P^T tile' if shared else 'RS'}) + "
            f"{f.k_steps_m}{'' if dv_cols == f.dkv_cols else f' x m64n{f.dkv_cols}k16'} "
            f"(dK, {'SS from the dS^T tile' if shared else 'RS'}) + "
            f"{f.k_steps_n} x m64n{f.dq_cols}k16 (dQ, SS, MN-major)",
            f"descriptors: {f.panel_row_bytes}-byte swizzle (mode {f.descriptor_mode}); K-major K, V, Q, dO for "
            f"S^T and dP^T; {'K-major P^T and dS^T tiles with ' if shared else ''}MN-major Q, dO (dK, dV), "
            f"dS^T and K (dQ), panels {f.panel_cols} columns wide",
            f"dQ: each warpgroup adds {64 if f.dq_by_rows or f.dq_transposed else plan.block_m} x {f.dq_cols} fp32 "
            f"per query block{' (dQ^T: head-dim columns x queries; a pair is two adjacent queries)' if f.dq_transposed else ''}, "
            + " or ".join(([f"{f.dq_regs // 2} red.global.add.v2.f32 per thread, a pair of adjacent "
                            f"{'queries' if f.dq_transposed else 'columns'} each (a warp's covers 256 contiguous bytes)"]
                           if f.pair_masks else [])
                          + ([f"{f.dq_regs} red.global.add.f32 per thread (a warp's covers 128 contiguous bytes)"]
                             if set(f.pair_masks) != set(plan.spec.masks) else []))
            + f"; the accumulator keeps each {f.accum_fragment_rows}-row block in {dq_order(plan.spec)}"
            + (" by head-dim column (dQ^T)" if f.dq_transposed else "") + " (the convert kernel reads it so). "
            "Not bitwise repeatable: key blocks add "
            "in any order; the *_deterministic functions add one key block at a time, the last first (turn counters in "
            "dq_turns), each warpgroup's share staged in the step's Q and dO tiles and added with one "
            "cp.reduce.async.bulk",
            "tensor maps: " + "; ".join(m.describe() for m in plan.tensor_maps)]


KIND = Kind(NAME, TITLE, SELECTOR, WgmmaBackwardSpec, plan, explain, calls="backward",
            space=wgmma_backward_space)
