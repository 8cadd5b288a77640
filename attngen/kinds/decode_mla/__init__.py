"""decode_mla: decode attention over one shared latent cache, as multi-head latent attention (DeepSeek
V2/V3 with the up-projections absorbed) decodes. Queries have head_dim columns (576: 512 latent + 64
rotary); each key is one cache row of head_dim columns, and its value is the same row's first
head_dim_v (512) columns. So the call's v_cache is k_cache[..., :head_dim_v] and a K/V tile is read
once. A bundle of two kernels:

- split: block (split s, KV head x row block, batch) takes block_m group rows (query heads per KV
  head x new tokens) against its slice of the sequence's keys, in block_n-key tiles through a
  cp.async ring. O (block_m x head_dim_v fp32) would not fit one warp's registers, so the warps
  split each tile twice: for S, warp w scores keys [w x keys_per_warp, ...) against every row; the
  tile's row maxima meet in shared memory and P goes to a shared tile; for O, warp w accumulates
  columns [w x cols_per_warp, ...) over all the tile's keys. With one split the block writes O
  itself; otherwise a partial O and LSE in fp32.
- combine: one warp per output row merges the splits by their LSE (templates/lib/split_combine.j2).

Two forms of the split kernel, by `mma`: mma_m16n8k16 (any sm_80+ target; blocks of 16 or 32 group rows,
warps each holding 16 rows) and wgmma_m64nNk16 (sm_90a; blocks of 64 group rows, one wgmma M, over two
warpgroups that read 128-byte-swizzled panels of Q, the cache tiles and P from shared memory: the form for
calls of many query heads per latent cache, DeepSeek's 128, whose mma.sync blocks were latency-bound with
the tensor pipe a fifth busy). The wgmma form divides a step two ways, by `warpgroups`: shared_tile (both
warpgroups score halves of one tile's keys and meet at block barriers) or seesaw (each scores alternate
whole tiles; the running maximum and P pass between them through shared memory, P in the tile's first
panel past V, and each copies its own tiles).

The call is the decode convention's (attngen.attention_with_kvcache, paged or contiguous, lengths per
sequence, causal bottom-right for several new tokens)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from pydantic import Field

from ...core.decode_plan import APPEND_FIELDS, DECODE_ABI_FIELDS, PAGE_FIELDS, STEP_ROW_FIELDS, DecodePlan
from ...core.forward_plan import ELEMENT_TYPES, FORWARD_ABI, Part, plan_abi, plan_forward
from ...core.kind import Kind
from ...core.launch_rules import MAX_PAGE_SIZE, MAX_SPLITS, WIDE_COMBINE, WIDE_COMBINE_MIN_SPLITS, split_rule_text
from ...core.layout import CHUNK_BYTES, Region
from ...core.spec_keys import ForwardSpec, HomogeneousWarps, XorSwizzle, refuse
from ...core.wgmma import (PANEL_SWIZZLES, ROWS_PER_WARPGROUP, WARPGROUP, rule_target_has_sm90a, swizzled_tile)

NAME = "decode_mla"
TITLE = "split-KV decode over one shared latent cache (V = K's first head_dim_v columns, MLA) + LSE combine"
SELECTOR = ("decode", "latent_split_kv")
COMBINE_WARPS = 4           # output rows per combine block (one warp each per column slice)
COMBINE_SLICE_COLUMNS = 128     # columns one combine warp merges: a row of 512 takes 4 warps (grid y), so a call
                                # of few rows (batch 1, 16 heads) and many splits is not merged by 16 warps alone
COMBINE_BATCH = 8               # splits a combine warp loads at a time (a round: one L2 latency)
# The wide combine (function combine_wide), for calls of many splits (launch_rules.WIDE_COMBINE_MIN_SPLITS): their
# few rows give the combine few warps, and each warp's rounds are its time. Half the columns per warp (twice the
# warps) and rounds of 32 splits. On calls of few splits and many rows the wide shape's registers (94 against
# 60) and twice the warps cost more than its rounds save (B8 128 heads, 4 splits: 5.6 -> 10.9 us on the H200).
WIDE_COMBINE_SLICE_COLUMNS = 64
WIDE_COMBINE_BATCH = 32
# The Params fields the combine kernel reads: it launches with the split kernel's Params bytes.
COMBINE_READS = ("o", "lse", "o_batch_stride", "o_head_stride", "o_row_stride", "batch", "heads", "seqlen_q",
                 "o_accum", "lse_accum", "num_splits")
MAX_HEAD_DIM = 1024
ROWS = 16                   # group rows of one m16 fragment: a warp's rows (a block takes block_m / ROWS groups)
LOAD_CHUNKS = 8             # 16-byte chunks of a row one copy step covers per thread group (128 bytes)
P_ROW_BYTES = 128           # the P tile's rows XOR their chunk with row & 7: whole groups of 8 chunks
# Registers each thread needs beside its O accumulators and S chains (addresses, the Q and K fragments
# of a k-step, the softmax), from ptxas: h200_mla_d576 holds 64 + 24 and used 212 (sm_90, nvcc 13.0).
REGISTER_MARGIN = 124
MMA_SYNC, WGMMA = "mma_m16n8k16", "wgmma_m64nNk16"
WGMMA_WARPGROUPS = 2        # the wgmma form's warpgroups: each scores half a tile's keys and holds half of O's columns
PANEL = PANEL_SWIZZLES[0]   # the wgmma form's tiles: 128-byte swizzled panels (64 columns of 16-bit elements)
# Registers each thread of the wgmma form needs beside its O and S accumulators (descriptors, the rows'
# limits and softmax state, the copies' sources), from ptxas.
WGMMA_REGISTER_MARGIN = 104
SEESAW_REGISTER_MARGIN = 64     # the seesaw schedule's, from ptxas likewise


class DecodeMlaSpec(ForwardSpec):
    decode: Literal["latent_split_kv"] = Field(description=(
        "latent_split_kv: split the cache's keys over blocks, V read from each key's own row (its first "
        "head_dim_v columns), and merge the slices by LSE (picks the latent-cache decode kind)"))
    mma: Literal["mma_m16n8k16", "wgmma_m64nNk16"] = Field(default=MMA_SYNC, description=(
        "the fragment of both GEMMs: mma_m16n8k16 (warps of 16 rows; any target), wgmma_m64nNk16 (sm_90a: "
        "blocks of 64 rows over two warpgroups reading swizzled panels, for calls of many query heads)"))
    head_dim: int = Field(ge=64, le=MAX_HEAD_DIM, description=(
        "columns of the queries and of each cache row (DeepSeek V2/V3: 576, 512 latent + 64 rotary)"))
    head_dim_v: Optional[int] = Field(default=None, ge=16, le=MAX_HEAD_DIM, description=(
        "V's and the output's columns: the first head_dim_v columns of each cache row (DeepSeek: 512); unset: "
        "head_dim"))
    paged: bool = Field(default=False, description=(
        "the kernel also reads paged caches through a block table of page ids, of any page size a call brings "
        f"(a power of two from 1 to {MAX_PAGE_SIZE}, a kernel parameter); false: contiguous caches only"))
    max_splits: int = Field(default=MAX_SPLITS, ge=1, le=MAX_SPLITS, description=(
        "most key slices per (KV head, batch) the heuristic may choose; 1 turns splitting off"))
    refill: Literal["before_scores", "during_scores"] = Field(default="before_scores", description=(
        "the wgmma form: where a tile's step issues the ring's next copy: before_scores (right after the step's "
        "barrier) or during_scores (once S's wgmmas are issued, while the tensor cores score)"))
    warpgroups: Literal["shared_tile", "seesaw"] = Field(default="shared_tile", description=(
        "the wgmma form: how the two warpgroups divide a step. shared_tile: both score halves of one tile's keys, "
        "their row maxima meet, then both take P.V of that tile (three block barriers a tile). seesaw: warpgroup 0 "
        "scores the even tiles and warpgroup 1 the odd ones, each whole; the running maximum passes from one to "
        "the other, each hands its P to the other through the tile's panel past V, and each warpgroup copies its "
        "own tiles, so one's softmax runs beside the other's wgmmas"))
    masks_taken = ("none", "causal")
    takes_head_dim_v = True
    key_unit = 16
    key_unit_why = "k16 steps of P.V"

    @property
    def on_wgmma(self) -> bool:
        return self.mma == WGMMA

    @property
    def seesaw(self) -> bool:
        return self.on_wgmma and self.warpgroups == "seesaw"

    @property
    def register_margin(self) -> int:
        if self.seesaw:
            return SEESAW_REGISTER_MARGIN
        return WGMMA_REGISTER_MARGIN if self.on_wgmma else REGISTER_MARGIN

    def register_need(self):
        if self.seesaw:
            return wgmma_o_cols(self) // 2 + wgmma_s_keys(self) // 2 + wgmma_s_keys(self) // 4, \
                "fp32 O accumulators of the warpgroup's columns, S of its tile and P's A fragments"
        if self.on_wgmma:
            return wgmma_o_cols(self) // 2 + wgmma_s_keys(self) // 2, \
                "fp32 O accumulators of the warpgroup's columns and S of its keys"
        return o_registers(self) + 8 * score_chains(self.head_dim // 16) * keys_per_warp(self) // 8, \
            "fp32 O accumulators of the warp's columns and S accumulator chains"


def wgmma_s_keys(s) -> int:
    """Keys of a tile one warpgroup of the wgmma form scores (S's N): half of each tile, or (seesaw) every key
    of its own tiles."""
    return s.tile.block_n if s.seesaw else s.tile.block_n // WGMMA_WARPGROUPS


def wgmma_o_cols(s) -> int:
    """O columns one warpgroup of the wgmma form accumulates (P.V's N)."""
    return s.v_dim // WGMMA_WARPGROUPS


def row_groups(s) -> int:
    """16-row fragments of group rows per block; each has warps / row_groups warps of its own, which share
    the block's cache tiles (a block of 32 rows reads each tile once for both). (At least 1: the rules
    refuse other block_m, and every rule is asked.)"""
    return max(1, s.tile.block_m // ROWS)


def key_warps(s) -> int:
    """Warps of one row group: they split a tile's keys for S and O's columns for P.V."""
    return max(1, s.compute_warps // row_groups(s))


def keys_per_warp(s) -> int:
    return s.tile.block_n // key_warps(s)


def cols_per_warp(s) -> int:
    return s.v_dim // key_warps(s)


def o_registers(s) -> int:
    """fp32 O registers per thread: 16 rows x the warp's columns over 32 lanes."""
    return ROWS * cols_per_warp(s) // 32


def score_chains(k_steps: int) -> int:
    """Accumulator sets a warp's S is summed in, over interleaved k-steps: consecutive mma.sync of a
    long Q.K^T (36 k-steps at 576) then do not wait on each other's results."""
    return next(c for c in (3, 2, 1) if k_steps % c == 0)


def rule_mla_homogeneous(s):
    if not isinstance(s.warps, HomogeneousWarps):
        return "warps", "the latent decode kernel's warps all load and compute: use warps: {compute: N}"


def rule_mla_rows(s):
    if s.on_wgmma:
        if s.tile.block_m != ROWS_PER_WARPGROUP or s.compute_warps != WGMMA_WARPGROUPS * WARPGROUP:
            return "tile.block_m", (f"the wgmma form takes {ROWS_PER_WARPGROUP} group rows per block (one wgmma M) over "
                                    f"{WGMMA_WARPGROUPS} warpgroups: use block_m: {ROWS_PER_WARPGROUP} and warps: "
                                    f"{{compute: {WGMMA_WARPGROUPS * WARPGROUP}}} (got block_m {s.tile.block_m}, "
                                    f"{s.compute_warps} warps)")
        return None
    if s.tile.block_m not in (ROWS, 2 * ROWS):
        return "tile.block_m", (f"a block takes one or two 16-row fragments of group rows (query heads per KV head x "
                                f"new tokens), each held by its own warps for S: use block_m: {ROWS} or {2 * ROWS} "
                                f"(got {s.tile.block_m})")
    if s.compute_warps % row_groups(s):
        return "warps.compute", (f"the {row_groups(s)} row groups of {s.tile.block_m} rows each take an equal share "
                                 f"of the warps: use a multiple of {row_groups(s)} (got {s.compute_warps})")


def rule_mla_keys_per_warp(s):
    if s.on_wgmma:
        keys = PANEL.columns(s.elem_bytes)
        if s.tile.block_n % keys or wgmma_s_keys(s) > 256:
            return "tile.block_n", (f"the wgmma form's P tile is whole swizzled panels of {keys} keys and each "
                                    f"warpgroup scores half the tile (at most 256 keys, a wgmma N): use a multiple "
                                    f"of {keys} up to 512 (got {s.tile.block_n})")
        if s.tile.block_n % (4 * s.compute_warps):
            return "tile.block_n", (f"a copy step of the {s.compute_warps} warps covers {4 * s.compute_warps} rows of "
                                    f"a tile, so block_n must be a multiple of it (got {s.tile.block_n})")
        return None
    unit = 16 * key_warps(s)
    p_keys = P_ROW_BYTES // s.elem_bytes
    if s.tile.block_n % p_keys:
        return "tile.block_n", (f"the P tile's rows are swizzled over 8 chunks of 16 bytes, so block_n must be a "
                                f"multiple of {p_keys} (got {s.tile.block_n})")
    if s.tile.block_n % unit:
        return "tile.block_n", (f"each of a row group's {key_warps(s)} warps scores an equal share of a tile's keys "
                                f"in 16-key steps, so block_n must be a multiple of {unit} (got {s.tile.block_n})")
    if s.tile.block_n % (4 * s.compute_warps):
        return "tile.block_n", (f"a copy step of the {s.compute_warps} warps covers {4 * s.compute_warps} rows of a "
                                f"tile, so block_n must be a multiple of it (got {s.tile.block_n})")


def rule_mla_v_columns(s):
    if s.on_wgmma:
        unit = WGMMA_WARPGROUPS * PANEL.columns(s.elem_bytes)
        if s.v_dim % unit or wgmma_o_cols(s) > 256:
            return "head_dim_v", (f"each of the wgmma form's {WGMMA_WARPGROUPS} warpgroups accumulates whole swizzled "
                                  f"panels of O's columns, at most 256 (a wgmma N): head_dim_v must be a multiple of "
                                  f"{unit} up to {WGMMA_WARPGROUPS * 256} (got {s.v_dim})")
    else:
        unit = 16 * key_warps(s)
        if s.v_dim % unit:
            return "head_dim_v", (f"each of a row group's {key_warps(s)} warps accumulates an equal share of O's "
                                  f"columns in 16-column steps, so head_dim_v must be a multiple of {unit} (got "
                                  f"{s.v_dim})")
    if s.v_dim > s.head_dim:
        return "head_dim_v", (f"V is the first head_dim_v columns of each cache row, so head_dim_v must be at most "
                              f"head_dim ({s.head_dim}; got {s.v_dim})")


def rule_mla_copy_steps(s):
    chunks = s.head_dim * s.elem_bytes // CHUNK_BYTES
    if chunks % LOAD_CHUNKS:
        return "head_dim", (f"a tile row is copied {LOAD_CHUNKS * CHUNK_BYTES} bytes per thread group at a time, so "
                            f"head_dim must be a multiple of {LOAD_CHUNKS * CHUNK_BYTES // s.elem_bytes} (got "
                            f"{s.head_dim})")
    # (block_n is a multiple of the 4 x warps rows a copy step covers: rule_mla_keys_per_warp)


def rule_mla_swizzle(s):
    sw = s.smem.swizzle
    if not isinstance(sw, XorSwizzle) or sw.xor_bits != 3 or sw.row_shift:
        return "smem.swizzle", "ldmatrix reads of 8 rows need them on 8 bank groups: set swizzle: {xor_bits: 3}"


rule_mla_ring = refuse("smem.stages", lambda s: s.smem.stages < 2 or not s.smem.async_copy,
                   lambda s: "the kernel streams the cache through a cp.async ring: set stages >= 2 and "
                             "async_copy: true", "rule_mla_ring")
rule_mla_no_varlen = refuse("varlen", lambda s: s.varlen,
                        lambda s: "a decode call takes per-sequence cache lengths (cache_seqlens), not varlen "
                                  "sequences; set varlen: false", "rule_mla_no_varlen")
rule_mla_no_q_registers = refuse("smem.q_in_registers", lambda s: s.smem.q_in_registers,
                             lambda s: "Q is read from its tile at every k-step (its fragments would not fit beside "
                                       "O); leave q_in_registers unset", "rule_mla_no_q_registers")
rule_mla_always_rescales = refuse("softmax.rescale", lambda s: s.softmax.rescale != "always",
                              lambda s: "the kernel rescales its output at every tile; set softmax.rescale: always",
                              "rule_mla_always_rescales")


def rule_mla_wgmma_target(s):
    if s.on_wgmma:
        return rule_target_has_sm90a(s)


def rule_mla_refill_on_wgmma(s):
    if s.refill != "before_scores" and not s.on_wgmma:
        return "refill", (f"refill: {s.refill} places the wgmma form's ring copies; the mma.sync form issues them at "
                          "the end of a tile's step: leave refill unset")


def rule_mla_seesaw(s):
    """The seesaw schedule: two warpgroups taking alternate tiles of a two-stage ring, P handed over in the
    tile's panel past V (the rotary columns, which only S reads): a 64-row block over 64-key tiles, V a
    whole number of panels and at least one panel of columns past it."""
    if s.warpgroups != "seesaw":
        return None
    if not s.on_wgmma:
        return "warpgroups", ("warpgroups: seesaw divides a step between the two warpgroups of the wgmma form: set "
                              "mma to the wgmma fragment, or leave warpgroups unset")
    panel_cols = PANEL.columns(s.elem_bytes)
    if s.tile.block_m != s.tile.block_n:
        return "tile.block_n", (f"warpgroups: seesaw hands P ({s.tile.block_m} rows x block_n keys) over in one "
                                f"panel of a cache tile ({s.tile.block_n} rows): set block_n: {s.tile.block_m}")
    if s.smem.stages != 2:
        return "smem.stages", "warpgroups: seesaw alternates two tiles, one per warpgroup: set stages: 2"
    if s.v_dim % panel_cols or s.head_dim - s.v_dim < panel_cols:
        return "head_dim_v", (f"warpgroups: seesaw writes P into the cache tile's first panel past V: head_dim_v must "
                              f"be a multiple of {panel_cols} with at least {panel_cols} columns of head_dim past it "
                              f"(got {s.v_dim} of {s.head_dim}); use warpgroups: shared_tile")
    if s.refill != "before_scores":
        return "refill", ("warpgroups: seesaw places its copies itself (each warpgroup refills its stage once the "
                          "other is done with it): leave refill unset")


DecodeMlaSpec.rules = (rule_mla_wgmma_target, rule_mla_refill_on_wgmma, rule_mla_seesaw, rule_mla_homogeneous, rule_mla_rows, rule_mla_keys_per_warp, rule_mla_v_columns, rule_mla_copy_steps, rule_mla_swizzle,
                       rule_mla_ring, rule_mla_no_varlen, rule_mla_no_q_registers, rule_mla_always_rescales)


@dataclass(frozen=True, kw_only=True)
class MlaFragments:
    row_groups: int         # 16-row fragments of group rows per block, each with its own warps
    key_warps: int          # warps of one row group
    keys_per_warp: int      # keys of each tile one warp scores
    s_tiles: int            # 8-key S tiles per warp
    score_chains: int       # accumulator sets of S over interleaved k-steps
    cols_per_warp: int      # O columns one warp accumulates
    o_tiles: int            # 8-column O tiles per warp
    k_steps_qk: int         # k16 steps of Q.K^T (head_dim / 16)
    k_steps_pv: int         # k16 steps of P.V (block_n / 16)
    copy_rows: int          # tile rows one copy step covers (threads / 8)
    copy_passes: int        # copy steps per tile (block_n / copy_rows): rows whose source a thread works out
    copy_chunks: int        # 16-byte chunks a thread copies per row (chunks per row / 8)
    p_pitch: int            # bytes per row of the P tile
    combine_warps: int      # output rows per combine block
    combine_shapes: tuple   # (function key, columns per warp, splits per round) of each combine function


@dataclass(frozen=True, kw_only=True)
class MlaWgmmaFragments:
    warpgroup_threads: int  # threads of one warpgroup
    s_keys: int             # keys of a tile one warpgroup scores: S's N
    s_regs: int             # its fp32 S accumulators per thread
    o_cols: int             # O columns one warpgroup accumulates: P.V's N
    o_regs: int             # its fp32 O accumulators per thread
    k_steps_qk: int         # k16 steps of Q.K^T (head_dim / 16)
    k_steps_pv: int         # k16 steps of P.V (block_n / 16)
    panel_row_bytes: int    # bytes of one swizzled panel row (the swizzle's span)
    swizzle_atom_bytes: int  # 8 panel rows: every descriptor's stride byte offset
    descriptor_mode: int    # the swizzle in bits 62-63 of a wgmma descriptor
    copy_rows: int          # tile rows one copy step covers (threads / 8)
    copy_passes: int        # copy steps per tile (block_n / copy_rows): rows whose source a thread works out
    copy_chunks: int        # 16-byte chunks a thread copies per row (chunks per row / 8)
    refill_during_scores: bool  # a step issues the ring's copy after S's wgmmas, not before them
    seesaw: bool            # warpgroups take alternate tiles (warpgroups: seesaw), each copying its own
    p_panel: int            # seesaw: the cache tile's panel P is handed over in (the first past V)
    combine_warps: int      # output rows per combine block
    combine_shapes: tuple   # (function key, columns per warp, splits per round) of each combine function


def wgmma_fragments(spec: DecodeMlaSpec) -> MlaWgmmaFragments:
    wg_threads = 32 * WARPGROUP
    threads = wg_threads if spec.seesaw else 32 * spec.compute_warps    # the threads that copy a tile
    chunks = spec.head_dim * spec.elem_bytes // CHUNK_BYTES
    return MlaWgmmaFragments(
        warpgroup_threads=wg_threads, s_keys=wgmma_s_keys(spec),
        s_regs=ROWS_PER_WARPGROUP * wgmma_s_keys(spec) // wg_threads, o_cols=wgmma_o_cols(spec),
        o_regs=ROWS_PER_WARPGROUP * wgmma_o_cols(spec) // wg_threads, k_steps_qk=spec.head_dim // 16,
        k_steps_pv=spec.tile.block_n // 16, panel_row_bytes=PANEL.row_bytes, swizzle_atom_bytes=8 * PANEL.row_bytes,
        descriptor_mode=PANEL.descriptor_mode, copy_rows=threads // LOAD_CHUNKS,
        copy_passes=spec.tile.block_n // (threads // LOAD_CHUNKS), copy_chunks=chunks // LOAD_CHUNKS,
        refill_during_scores=spec.refill == "during_scores", seesaw=spec.seesaw,
        p_panel=spec.v_dim // PANEL.columns(spec.elem_bytes), combine_warps=COMBINE_WARPS,
        combine_shapes=combine_shapes(spec))


def fragments(spec: DecodeMlaSpec, rows_per_warp: int, file) -> MlaFragments | MlaWgmmaFragments:
    if spec.on_wgmma:
        return wgmma_fragments(spec)
    kpw, threads = keys_per_warp(spec), 32 * spec.compute_warps
    chunks = spec.head_dim * spec.elem_bytes // CHUNK_BYTES
    return MlaFragments(row_groups=row_groups(spec), key_warps=key_warps(spec), keys_per_warp=kpw, s_tiles=kpw // 8, score_chains=score_chains(spec.head_dim // 16),
                        cols_per_warp=cols_per_warp(spec), o_tiles=cols_per_warp(spec) // 8,
                        k_steps_qk=spec.head_dim // 16, k_steps_pv=spec.tile.block_n // 16,
                        copy_rows=threads // LOAD_CHUNKS, copy_passes=spec.tile.block_n // (threads // LOAD_CHUNKS),
                        copy_chunks=chunks // LOAD_CHUNKS, p_pitch=spec.tile.block_n * spec.elem_bytes,
                        combine_warps=COMBINE_WARPS, combine_shapes=combine_shapes(spec))


def tiles(spec: DecodeMlaSpec, sw) -> list[Region]:
    """The Q tile, then each ring stage's cache tile: K, whose first head_dim_v columns are V (the wgmma form:
    in swizzled panels)."""
    ctype, eb = ELEMENT_TYPES[spec.dtype][0], spec.elem_bytes
    d, bn, bm, desc = spec.head_dim, spec.tile.block_n, spec.tile.block_m, sw.describe()
    if spec.on_wgmma:
        return [swizzled_tile("q", bm, d, PANEL, ctype, "Q tile, loaded once", eb)] + [
            swizzled_tile(f"kv{s}", bn, d, PANEL, ctype, f"cache tile (K; V its first {spec.v_dim} columns), stage {s}",
                          eb) for s in range(spec.smem.stages)]
    regions = [Region("q", bm, d, ctype, eb, sw.pitch_bytes, swizzle=desc, per="Q tile, loaded once")]
    for s in range(spec.smem.stages):
        regions.append(Region(f"kv{s}", bn, d, ctype, eb, sw.pitch_bytes, swizzle=desc,
                              per=f"cache tile (K; V its first {spec.v_dim} columns), stage {s}"))
    return regions


def shared_regions(spec: DecodeMlaSpec) -> list[Region]:
    """The P tile the warps hand from S to P.V, and each warp's row maxima and row sums."""
    ctype, eb, bn, warps = ELEMENT_TYPES[spec.dtype][0], spec.elem_bytes, spec.tile.block_n, spec.compute_warps
    if spec.seesaw:
        bm = spec.tile.block_m
        return [Region("row_max", WGMMA_WARPGROUPS, bm, "float", 4, bm * 4,
                       per="the running row maxima each warpgroup passes on (P itself goes into the cache tile's "
                           "first panel past V)"),
                Region("row_sum", WGMMA_WARPGROUPS, bm, "float", 4, bm * 4,
                       per="each warpgroup's row sums over its tiles, at the end")]
    if spec.on_wgmma:
        bm = spec.tile.block_m
        return [swizzled_tile("p", bm, bn, PANEL, ctype, "P of the tile (both warpgroups' keys), A of P.V", eb),
                Region("row_max", WGMMA_WARPGROUPS, bm, "float", 4, bm * 4,
                       per="each warpgroup's row maxima of the tile's scores"),
                Region("row_sum", WGMMA_WARPGROUPS, bm, "float", 4, bm * 4,
                       per="each warpgroup's row sums over its keys, at the end")]
    return [Region("p", spec.tile.block_m, bn, ctype, eb, bn * eb, swizzle="xor 3 (16-byte chunks)",
                   per="P of the tile (every warp's keys), read by its row group's warps for P.V"),
            Region("row_max", warps, ROWS, "float", 4, ROWS * 4, per="each warp's row maxima of the tile's scores"),
            Region("row_sum", warps, ROWS, "float", 4, ROWS * 4, per="each warp's row sums over its keys, at the end")]


def combine_slices(spec: DecodeMlaSpec, columns: int = COMBINE_SLICE_COLUMNS) -> int:
    """Warps that share an output row's columns in the combine kernel (grid y), `columns` each where they
    divide the row."""
    return max(1, spec.v_dim // columns) if spec.v_dim % columns == 0 else 1


def combine_shapes(spec: DecodeMlaSpec) -> tuple[tuple[str, int, int], ...]:
    """(function key, columns per warp, splits per round) of the combine part's two functions. A round's
    splits divide 32 (the template unrolls every round up to 32 x ceil(max_splits / 32) splits and reads each
    split's weight from lane slot s / 32 of those)."""
    assert 32 % COMBINE_BATCH == 0 and 32 % WIDE_COMBINE_BATCH == 0, "a round's splits must divide 32"
    return (("combine", spec.v_dim // combine_slices(spec), COMBINE_BATCH),
            (WIDE_COMBINE, spec.v_dim // combine_slices(spec, WIDE_COMBINE_SLICE_COLUMNS), WIDE_COMBINE_BATCH))


def function_names(spec: DecodeMlaSpec) -> tuple[Part, ...]:
    template = "split_seesaw.cu.j2" if spec.seesaw else "split_wgmma.cu.j2" if spec.on_wgmma else "split.cu.j2"
    split = Part("split", template, f"{spec.name}_split.cu",
                 tuple((mask, f"attngen_{spec.name}_split_{mask}") for mask in spec.masks), awaits_predecessor=True)
    combine = Part("combine", "combine.cu.j2", f"{spec.name}_combine.cu",
                   (("combine", f"attngen_{spec.name}_combine"), (WIDE_COMBINE, f"attngen_{spec.name}_{WIDE_COMBINE}")),
                   static_smem=0, threads=32 * COMBINE_WARPS, awaits_predecessor=True, reads=COMBINE_READS)
    return split, combine


def plan(spec: DecodeMlaSpec, file: str | None = None):
    p = plan_forward(spec, kind=KIND, title=TITLE, file=file, fragments=fragments, extra_regions=shared_regions,
                     tiles=tiles)
    f = p.fragments
    stride = p.region("kv1").offset - p.region("kv0").offset if spec.smem.stages > 1 else 0
    if spec.on_wgmma:
        roles, per_tile, threads_text, ring_text = wgmma_texts(spec, f)
    else:
        roles, per_tile, threads_text, ring_text = mma_sync_texts(spec, f)
    schedule = ("split kernel, grid (num_splits, kv_heads x row_blocks, batch):",
                "  rows: group row r = g x seqlen_q + t is query head kv_head x group + g, new token t",
                "  keys: split s takes tiles [s x tiles_per_split, (s + 1) x tiles_per_split) of its sequence "
                "(cache_seqlens[b] keys); an empty slice writes LSE -inf and a zero partial",
                ring_text, per_tile,
                "  end: the " + ("warpgroups'" if spec.on_wgmma else "warps'") + " row sums through `row_sum`; one "
                "split: O and LSE written, else fp32 partial O and LSE per split",
                f"combine kernel, grid (ceil(batch x heads x seqlen_q / {COMBINE_WARPS}), {combine_slices(spec)}): a "
                f"warp per row and slice of {spec.v_dim // combine_slices(spec)} columns weighs each split by "
                f"exp(lse_s - lse), loading {COMBINE_BATCH} splits at a time, and writes O (and the first slice LSE); "
                f"from {WIDE_COMBINE_MIN_SPLITS} splits {WIDE_COMBINE}, grid y "
                f"{combine_slices(spec, WIDE_COMBINE_SLICE_COLUMNS)}: slices of "
                f"{spec.v_dim // combine_slices(spec, WIDE_COMBINE_SLICE_COLUMNS)} columns, {WIDE_COMBINE_BATCH} "
                "splits at a time")
    block_text = (f"block: one key slice (split) of one KV head and sequence, for {spec.tile.block_m} group rows "
                  f"(query heads per KV head x new tokens) in {spec.tile.block_n}-key cache tiles; grid (num_splits, kv_heads x "
                  "row_blocks, batch)",
                  f"threads: {p.threads} = {spec.compute_warps} warps; " + threads_text,
                  "masks: none (every key of the sequence), causal (bottom-right: new token t of seqlen_q sees the "
                  "keys up to len - seqlen_q + t)")
    # V is read from K's tile and its pointer is checked to be K's by the call, never read here; the LSE rows
    # are contiguous; no append, no combine counters.
    # The causal offset is each sequence's own (its length), so the masks' fields are not read either.
    unread = ("v", "v_batch_stride", "v_head_stride", "v_row_stride", "lse_batch_stride", "lse_head_stride",
              "split_counters") + APPEND_FIELDS + STEP_ROW_FIELDS + tuple(f.name for m in p.mask_variants
                                                                          for f in m.abi_fields)
    if not spec.paged:
        unread += PAGE_FIELDS
    abi = plan_abi(p.mask_variants, varlen=False, reports_errors=True, unread=unread,
                   base=FORWARD_ABI.with_fields(DECODE_ABI_FIELDS))
    return DecodePlan.of(p, parts=function_names(spec), abi=abi, head_dim_v=spec.head_dim_v or 0,
                         kv_stage_stride=stride, block_text=block_text, rows_per_warp=ROWS, roles=roles,
                         schedule=schedule, max_splits=spec.max_splits, paged=spec.paged, combine="kernel",
                         v_in_k=True, combine_slices=combine_slices(spec),
                         combine_wide_slices=combine_slices(spec, WIDE_COMBINE_SLICE_COLUMNS), copy_engine="cp.async ring (16-byte chunks), every warp copies",
                         arch_suffix="a" if spec.on_wgmma else "",
                         pipeline_text=(("copies (the warpgroup whose stage it is): " if spec.seesaw else "copies: ") +
                                        f"thread i copies chunks i % 8 + 8j of rows i / 8 + {f.copy_rows}k "
                                        f"of each cache tile ({f.copy_passes} rows, {f.copy_chunks} chunks each): a "
                                        "warp covers 4 rows x 128 contiguous bytes per step, and each thread "
                                        "works out its rows' sources (page ids) once per tile, "
                                        + ("while the P.V wgmmas run, for both copy groups" if spec.seesaw else
                                           "as it issues the copy" if spec.on_wgmma else "a tile ahead")))


def wgmma_texts(spec: DecodeMlaSpec, f: MlaWgmmaFragments) -> tuple:
    """(roles, the per-tile schedule line, the threads line's rest, the ring line) of the wgmma form."""
    if f.seesaw:
        return seesaw_texts(spec, f)
    roles = (f"{spec.compute_warps} warps in {WGMMA_WARPGROUPS} warpgroups, all copying each cache tile (cp.async) "
             f"into 128-byte-swizzled panels; for S warpgroup w scores keys [{f.s_keys}w, {f.s_keys}(w+1)) of the tile "
             f"against all {spec.tile.block_m} group rows (m64n{f.s_keys}k16, Q and K from shared memory); for O it "
             f"accumulates columns [{f.o_cols}w, {f.o_cols}(w+1)) over every key of the tile (m64n{f.o_cols}k16, P "
             "and V from shared memory)",)
    per_tile = ("  per tile: S (warpgroup's keys), row maxima through `row_max`, P into the swizzled panel `p`, "
                "O += P V (warpgroup's columns); three __syncthreads")
    threads = f"each warpgroup scores {f.s_keys} keys of a tile and accumulates {f.o_cols} of O's {spec.v_dim} columns"
    when = "once S's wgmmas are issued (refill: during_scores)" if f.refill_during_scores else \
        "right after the step's barrier (refill: before_scores)"
    ring = (f"  ring of {spec.smem.stages} stages: the copy of tile i + {spec.smem.stages} is issued in tile i + 1's "
            f"step, every warp being done with tile i, {when}; its page ids are read then")
    return roles, per_tile, threads, ring


def seesaw_texts(spec: DecodeMlaSpec, f: MlaWgmmaFragments) -> tuple:
    """(roles, the per-step schedule line, the threads line's rest, the ring line) of the seesaw schedule."""
    roles = (f"{spec.compute_warps} warps in {WGMMA_WARPGROUPS} warpgroups; warpgroup w scores tile 2i + w of each "
             f"pair against all {spec.tile.block_m} group rows (m64n{f.s_keys}k16, Q and K from shared memory) and "
             f"accumulates O's columns [{f.o_cols}w, {f.o_cols}(w+1)) over both tiles (m64n{f.o_cols}k16: its own "
             "P from registers, the other's from shared memory); it copies its own tiles (cp.async)",)
    per_tile = ("  per pair of tiles: 0 scores A, takes the maximum m_A over the running one and passes it on; 1 scores "
                "B, takes m_B over m_A and passes it back; 0's P.V of A runs from registers while 1 writes P_B to B's "
                f"panel {f.p_panel}; 0 writes P_A rescaled to m_B into A's panel {f.p_panel}; each adds the other's P.V; "
                "named barriers, no block barrier")
    threads = (f"each warpgroup scores every {f.s_keys} keys of its tiles and accumulates {f.o_cols} of O's "
               f"{spec.v_dim} columns")
    ring = ("  ring of 2 stages, stage w warpgroup w's: it copies its next tile into it in two groups, the half of V "
            "only its own P.V reads once that is done, the rest once the other warpgroup's P.V is done with the "
            "stage (S's k-steps follow the groups); page ids are read once per tile, while the P.V wgmmas run")
    return roles, per_tile, threads, ring


def mma_sync_texts(spec: DecodeMlaSpec, f: MlaFragments) -> tuple:
    """(roles, the per-tile schedule line, the threads line's rest, the ring line) of the mma.sync form."""
    if f.row_groups == 1:
        roles = (f"{spec.compute_warps} warps, all copying each cache tile (cp.async); for S warp w scores keys "
                 f"[{f.keys_per_warp}w, {f.keys_per_warp}(w+1)) of the tile against all {ROWS} group rows; for O it "
                 f"accumulates columns [{f.cols_per_warp}w, {f.cols_per_warp}(w+1)) over every key of the tile",)
    else:
        kw = f.key_warps
        roles = (f"{spec.compute_warps} warps, all copying each cache tile (cp.async), in {f.row_groups} row groups of "
                 f"{kw} warps: warp w takes group rows [{ROWS}(w / {kw}), {ROWS}(w / {kw} + 1)); for S it scores keys "
                 f"[{f.keys_per_warp}(w % {kw}), {f.keys_per_warp}(w % {kw} + 1)) of the tile against those rows; for "
                 f"O it accumulates columns [{f.cols_per_warp}(w % {kw}), {f.cols_per_warp}(w % {kw} + 1)) over every "
                 "key of the tile",)
    per_tile = ("  per tile: S (warp's keys), row maxima through `row_max`, P into `p`, O += P V (warp's columns); "
                "four __syncthreads")
    threads = f"each scores {f.keys_per_warp} keys of a tile and accumulates {f.cols_per_warp} of O's {spec.v_dim} columns"
    ring = (f"  ring of {spec.smem.stages} stages: the copy of tile i + {spec.smem.stages} is issued once tile i "
            "is done, its page ids read a tile ahead")
    return roles, per_tile, threads, ring


def explain(plan) -> list[str]:
    f = plan.fragments
    if plan.spec.on_wgmma:
        fragment_lines = [
            f"fragments per warpgroup: S m64n{f.s_keys} ({f.s_regs} fp32 registers per thread), O m64n{f.o_cols} "
            f"({f.o_regs}); Q, K, P and V read from {f.panel_row_bytes}-byte-swizzled panels (descriptor mode "
            f"{f.descriptor_mode}, SBO {f.swizzle_atom_bytes} B; V MN-major)",
            f"wgmma per pair of tiles per warpgroup: {f.k_steps_qk} (Q.K^T of its tile, m64n{f.s_keys}k16) + "
            f"{2 * f.k_steps_pv} (P.V of both, m64n{f.o_cols}k16: its own P from registers, the other's from its "
            f"tile's panel {f.p_panel})" if f.seesaw else
            f"wgmma per tile per warpgroup: {f.k_steps_qk} (Q.K^T, m64n{f.s_keys}k16) + {f.k_steps_pv} (P.V, "
            f"m64n{f.o_cols}k16)"]
    else:
        fragment_lines = [
            f"fragments per warp: S {f.s_tiles} m16n8 tiles over {f.keys_per_warp} keys, summed in "
            f"{f.score_chains} accumulator chains over the {f.k_steps_qk} k-steps; O {f.o_tiles} m16n8 tiles "
            f"({f.cols_per_warp} columns); Q read from its tile at every k-step",
            f"mma.sync per tile per warp: {f.s_tiles * f.k_steps_qk} (Q.K^T) + {f.o_tiles * f.k_steps_pv} (P.V)"]
    return fragment_lines + [
            f"V: the first {plan.v_dim} columns of each cache row, read from the K tile (the call's v_cache must be "
            f"k_cache[..., :{plan.v_dim}])",
            f"splits: at most {plan.max_splits}; the runtime picks " + split_rule_text(plan.combine),
            (f"paged cache: any page size from 1 to {MAX_PAGE_SIZE} keys (a power of two, page_size and page_shift "
             "in Params) through block_table; contiguous caches when the call passes no table"
             if plan.paged else "cache: contiguous only (paged: false)")]


KIND = Kind(NAME, TITLE, SELECTOR, DecodeMlaSpec, plan, explain, calls="decode")
