"""decode_mma: attention for decode steps (a few new query tokens per sequence against a long KV
cache), built for memory bandwidth. A bundle of two kernels:

- split: block (split s, KV head, batch) streams its slice of the cache's keys through a cp.async
  ring. Its rows are the query heads that share the KV head times the new tokens (group rows), so
  each K/V byte is read once per KV head. The warps split every tile's keys (mma.sync m16n8k16, S, P
  and O in registers) and merge their softmax states through shared memory at the end. With one
  split the block writes O itself; otherwise a partial O and LSE in fp32.
- combine: one warp per output row merges the splits' partial outputs by their LSE.

Lengths come per sequence (`cache_seqlens`); causal is bottom-right (token t of Sq new tokens sees
the cache up to its own position). The number of splits comes from a wave-efficiency heuristic
over the SM count (`num_splits`), overridable per spec (`max_splits`) and per call."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from pydantic import Field

from ...core import banks
from ...core.decode_plan import (APPEND_FIELDS, DECODE_ABI_FIELDS, KV_SCALE_ABI_FIELDS, PAGE_FIELDS, STEP_ROW_FIELDS,
                                 DecodePlan, is_rows, merged_mask)
from ...core.forward_plan import FORWARD_ABI, Part, plan_abi, plan_forward
from ...core.kind import Kind
from ...core.launch_rules import (MAX_PAGE_SIZE, MAX_SPLITS, TWO_STAGE_CO_RESIDENT_MIN_TILES, merging_key,
                                  rows_key, split_rule_text)
from ...core.layout import CHUNK_BYTES, Occupancy, Region
from ...core.spec_keys import ForwardSpec, HomogeneousWarps, XorSwizzle, refuse, rule_head_dim_vector_loads
from ...core.variants import SCORES
from ...errors import SpecError

NAME = "decode_mma"
TITLE = "split-KV decode over group rows (mma.sync m16n8k16) + LSE combine"
SELECTOR = ("decode", "split_kv")
COMBINE_WARPS = 4           # output rows per combine block (one warp each)
# The Params fields the combine kernel reads: it launches with the split kernel's Params bytes.
COMBINE_READS = ("o", "lse", "o_batch_stride", "o_head_stride", "o_row_stride", "batch", "heads", "seqlen_q",
                 "o_accum", "lse_accum", "num_splits")
MAX_ACCUMULATORS = 160      # S + O accumulators and held Q fragments per thread the rules allow (255 registers in
                            # all; 224 at d128 x 32 rows spilled 172 B, 200 at d256 x 16 rows 64 B)



class DecodeSpec(ForwardSpec):
    decode: Literal["split_kv"] = Field(description=(
        "split_kv: split the cache's keys over blocks and merge the slices by LSE (picks the decode kind)"))
    mma: Literal["mma_m16n8k16"] = Field(default="mma_m16n8k16", description="the fragment of both GEMMs")
    paged: bool = Field(default=False, description=(
        "the kernel also reads paged KV caches through a block table of page ids, of any page size a call "
        f"brings (a power of two from 1 to {MAX_PAGE_SIZE}, a kernel parameter); false: contiguous caches only"))
    combine: Literal["kernel", "fused", "auto"] = Field(default="kernel", description=(
        "how the splits are merged: kernel = a second kernel, a warp per output row; fused = the last split "
        "block of each (sequence, KV head) to finish merges them (an atomic arrival count), no second launch; "
        "auto = two split functions, a plain one for unsplit calls and a merging one for split calls (one "
        "launch either way, and the unsplit call keeps the plain kernel's code)"))
    append: bool = Field(default=False, description=(
        "the kernel also takes a call's new tokens (FlashAttention's k=, v=, rotary_cos=, rotary_sin=, "
        "cache_batch_idx=, cache_leftpad=): the blocks whose keys hold them rotate them, write them into the cache "
        "and attend them from shared memory, in the same launch; q is rotated as it is loaded. false: no append "
        "fields in Params and no append code (the dispatch table routes calls with k and v to append cells only)"))
    max_splits: int = Field(default=MAX_SPLITS, ge=1, le=MAX_SPLITS, description=(
        "most key slices per (KV head, batch) the heuristic may choose; 1 turns splitting off"))
    merge_rows: Literal[1, 2] = Field(default=1, description=(
        "combine: auto or fused: the group rows each warp of the merging block merges at once. 1: one row after "
        "another; 2: two rows together (both rows' loads of a round in flight), measured faster where a KV head has "
        "8 or more query rows and 0.2-2.5 % slower where each warp has one (32/8 heads, one new token)"))
    slice_cost_from_tiles: int = Field(default=0, ge=0, description=(
        "combine: kernel: the split count is the slice cost's (as the merging cells', which always take it) "
        "where a call's cache has this many K/V tiles or more; below, and with 0, the wave rule. Measured per "
        "family: the slice cost's fewer, longer slices are faster for some builds and slower for others"))
    split_tiles: Literal["slices", "interleaved"] = Field(default="slices", description=(
        "which of a sequence's K/V tiles each split reads. slices: split s a contiguous run of tiles_per_split "
        "tiles; interleaved: tiles s, s + num_splits, s + 2 num_splits, ..., so that the grid's blocks read "
        "neighbouring tiles at any one time (the splits' partials merge by LSE in any order)"))
    kv_dtype: Optional[Literal["e4m3"]] = Field(default=None, description=(
        "e4m3: the K and V caches hold e4m3 (torch.float8_e4m3fn) with fp32 scales k_scale, v_scale (one per "
        "tensor or per KV head); queries and output stay in dtype. The kernel reads half the bytes and widens "
        "the tiles to dtype in registers; unset: the caches are in dtype"))
    kv_mma: Optional[Literal["fp16"]] = Field(default=None, description=(
        "with kv_dtype e4m3: the tensor cores' operand type. fp16: bf16 queries are converted once per block to "
        "fp16 (times a power of two that the block's largest |q| sets, which the scores take back; every bf16 value "
        "in fp16's range converts exactly), P is rounded to fp16, and the tiles widen by one cvt.rn.f16x2.e4m3x2 per "
        "byte pair as fp16 queries' do; the output stays in dtype. Unset: the queries' type (bf16: bit moves and an "
        "fma per byte pair). For fp16 queries the two are the same"))
    key_unit = 16
    key_unit_why = "k16 steps of P.V"
    masks_taken = ("none", "causal", "window", "expr")
    takes_scores = True
    takes_sinks = True      # unsplit rows add the sink where they end, split rows where the splits merge
    # h200_decode_d64 (64 accumulators and Q fragments, 128 threads): no spill at a cap of 168, 12 B at
    # 128; h200_decode_d96 (88): 4 B at 168; h200_decode_d128 (112): 32 B at 168 (sm_90, nvcc 13.0).
    register_margin = 96

    def register_need(self):
        if holds_q(self):
            return accumulators(self) + q_registers(self), "fp32 S and O accumulators and Q fragments"
        return accumulators(self), "fp32 S and O accumulators"


# The masks as a decode call applies them (bottom-right: new token t of Sq sits at key len - Sq + t).
DECODE_MASKS = {
    "none": "none: every key of the sequence (cache_seqlens) is visible",
    "causal": "causal: bottom-right, new token t of seqlen_q sees the keys up to position len - seqlen_q + t",
    "window": "window (left, right): keys len - seqlen_q + t - left .. len - seqlen_q + t + right, and the splits "
              "share the tiles from token 0's first visible key on (none before it is read)",
    "expr": "expr: the spec's mask expression, with q_idx the new token t",
}


def rule_homogeneous(s):
    if not isinstance(s.warps, HomogeneousWarps):
        return "warps", "the decode kernel's warps all load and compute: use warps: {compute: N}"


def rule_rows(s):
    if s.tile.block_m % 16 or s.tile.block_m > 64:
        return "tile.block_m", (f"group rows per block (query heads per KV head x new tokens) come in "
                                f"16-row fragments, at most 64 (got {s.tile.block_m}); use 16, 32, 48 or 64")


def rule_keys_per_warp(s):
    unit = 16 * s.compute_warps
    if s.tile.block_n % unit:
        return "tile.block_n", (f"each of the {s.compute_warps} warps takes an equal share of a tile's keys in k16 "
                                f"steps, so block_n must be a multiple of {unit} (got {s.tile.block_n})")


def rule_head_dim(s):
    if s.head_dim % 16:
        return "head_dim", f"must be a multiple of 16 (k16 steps of Q.K^T) for {NAME} (got {s.head_dim})"


def accumulators(s) -> int:
    """fp32 S and O accumulator registers per thread: every warp holds all block_m rows."""
    m_tiles = s.tile.block_m // 16
    return m_tiles * (s.tile.block_n // s.compute_warps // 8 + s.head_dim // 8) * 4


def q_registers(s) -> int:
    """Registers of the Q fragments, were they loaded once and held for the whole kernel."""
    return s.tile.block_m // 16 * s.head_dim // 16 * 4


def holds_q(s) -> bool:
    """Q fragments stay in registers when they fit beside the accumulators; otherwise (d256) each
    k-step reads them from the Q tile again (ldmatrix), which stays in shared memory anyway."""
    return accumulators(s) + q_registers(s) <= MAX_ACCUMULATORS


def row_mods_per_tile(s, score_variants) -> bool:
    """Whether the split kernel makes its rows' score modifiers (a slope, a cap, a row's new token) again at
    every tile rather than holding them across the key loop: where Q's fragments are not held (d256) and the
    kernel appends, the append's per-block fields stay live through the loop and held modifiers spilled
    (d256 ALiBi at 255 registers: 8-12 B with pages or a window, sm_90). Made per tile they cost a couple of
    L1-resident loads and integer steps per tile of a loop bound by memory."""
    return bool(score_variants) and s.append and not holds_q(s)


def rule_accumulators(s):
    n = accumulators(s)
    if n > MAX_ACCUMULATORS:
        return "tile.block_m", (f"{n} registers per thread hold S and O for {s.tile.block_m} rows, over the "
                                f"{MAX_ACCUMULATORS} that leave room for addresses and the softmax; use fewer rows "
                                f"per block (block_m), fewer keys per warp (block_n) or more warps")


def rule_swizzle(s):
    sw = s.smem.swizzle
    if not isinstance(sw, XorSwizzle):
        return "smem.swizzle", "ldmatrix reads need conflict-free rows: set swizzle: {xor_bits: 3}"


rule_ring = refuse("smem.stages", lambda s: s.smem.stages < 2 or not s.smem.async_copy,
                   lambda s: "the decode kernel streams K/V through a cp.async ring: set stages >= 2 and "
                             "async_copy: true", "rule_ring")
rule_decode_no_varlen = refuse("varlen", lambda s: s.varlen,
                               lambda s: "a decode call takes per-sequence cache lengths (cache_seqlens), not varlen "
                                         "sequences; set varlen: false", "rule_decode_no_varlen")
rule_decode_expressions_alone = refuse("scores", lambda s: s.variant is not None and bool(s.scores),
                                       lambda s: f"decode applies either built-in score modifiers or the spec's "
                                                 f"expressions, not both: write {s.scores} into variant.score "
                                                 f"(e.g. cap * tanh(score / cap)) and leave scores empty",
                                       "rule_decode_expressions_alone")
# An expression mask could hide the tiles of the new tokens from every block, and those tiles' blocks
# are the ones that write them into the cache.
rule_append_masks = refuse("masks", lambda s: s.append and "expr" in s.masks,
                           lambda s: "an append cell writes the new tokens from the blocks that attend their tiles, "
                                     "and an expression mask may skip those tiles: use masks none, causal or window",
                           "rule_append_masks")
rule_no_q_registers = refuse("smem.q_in_registers", lambda s: s.smem.q_in_registers,
                             lambda s: "the decode plan keeps Q fragments in registers wherever they fit beside "
                                       "the accumulators; leave q_in_registers unset", "rule_no_q_registers")

# The split kernel rescales O at every tile; on_max_change would be accepted and mean nothing.
rule_decode_always_rescales = refuse("softmax.rescale", lambda s: s.softmax.rescale != "always",
                                     lambda s: "the decode kernel rescales its output at every tile (on_max_change "
                                               "is not generated for decode: split_kv); set softmax.rescale: always",
                                     "rule_decode_always_rescales")


KV_E4M3_COLUMNS = 32   # e4m3 K/V tiles are read 32 columns (two 16-byte chunks) at a time


def rule_kv_e4m3_head_dim(s):
    if s.kv_dtype and s.head_dim % KV_E4M3_COLUMNS:
        return "head_dim", (f"an e4m3 KV cache is generated for head dims that are multiples of {KV_E4M3_COLUMNS} "
                            f"(its tiles are read {KV_E4M3_COLUMNS} columns at a time; got {s.head_dim}); leave "
                            "kv_dtype unset for this head dim")


# k_scale joins the softmax scale inside the kernel, so a score modifier (which reads the scaled score)
# would see the wrong one; none is generated with an e4m3 cache yet.
rule_kv_e4m3_no_append = refuse("kv_dtype", lambda s: bool(s.kv_dtype) and s.append,
                                lambda s: "an e4m3 KV cache is generated without append (the new tokens would need "
                                          "quantising to the cache's scales); drop append or kv_dtype",
                                "rule_kv_e4m3_no_append")
rule_kv_mma_needs_e4m3 = refuse("kv_mma", lambda s: s.kv_mma is not None and not s.kv_dtype,
                               lambda s: "kv_mma sets the tensor cores' operands for an e4m3 KV cache; set "
                                         "kv_dtype: e4m3 or drop kv_mma", "rule_kv_mma_needs_e4m3")
rule_kv_mma_holds_q = refuse("kv_mma", lambda s: s.kv_mma is not None and not holds_q(s),
                             lambda s: "kv_mma: fp16 converts Q's fragments once, in registers, and this plan reads "
                                       "Q from its tile at every k-step (too few registers); drop kv_mma",
                             "rule_kv_mma_holds_q")
rule_kv_e4m3_plain_scores = refuse("kv_dtype", lambda s: bool(s.kv_dtype) and (bool(s.scores) or s.variant is not None),
                                   lambda s: "an e4m3 KV cache is generated without score modifiers or expressions "
                                             "(k_scale joins the softmax scale in the kernel); drop scores/variant "
                                             "or kv_dtype", "rule_kv_e4m3_plain_scores")


DecodeSpec.rules = (rule_homogeneous, rule_head_dim_vector_loads, rule_head_dim, rule_rows, rule_keys_per_warp,
                    rule_accumulators, rule_swizzle, rule_ring, rule_no_q_registers,
                    rule_decode_no_varlen, rule_decode_expressions_alone, rule_decode_always_rescales,
                    rule_kv_e4m3_head_dim, rule_kv_e4m3_plain_scores, rule_append_masks,
                    rule_kv_e4m3_no_append, rule_kv_mma_needs_e4m3, rule_kv_mma_holds_q)


@dataclass(frozen=True, kw_only=True)
class DecodeFragments:
    m_tiles: int            # 16-row fragments: every warp holds all block_m group rows
    keys_per_warp: int      # keys of each tile one warp scores
    n_tiles: int            # 8-key accumulator tiles of S per warp
    d_tiles: int            # 8-column accumulator tiles of O
    k_steps_qk: int         # k16 steps of Q.K^T (head_dim / 16)
    k_steps_pv: int         # k16 steps of P.V (keys_per_warp / 16)
    q_regs: int             # Q fragments held for the whole kernel (0: read from the Q tile at every k-step)
    accumulators: int       # fp32 S + O registers per thread
    merge_pitch: int        # floats per row of a warp's O in the merge buffer (head_dim + 8: conflict-free float2)
    merge_bytes: int        # the merge buffer (warps x block_m rows), over the K/V ring after the last tile
    combine_warps: int      # output rows per combine block
    v_widened_ahead: bool   # e4m3 cache: a tile's V share is widened into registers right after the scores, not
                            # next to each P.V mma (whose conversions then chained on two registers)


# The fp32 accumulators and widened V registers a thread may hold together: ptxas (sm_90a) kept d128's 80 + 64
# without spills (212-219 registers, two blocks of 128 threads per SM) and spilled d256's 136 + 64 in bf16 (40 B).
V_AHEAD_MAX_HELD = 144


def fragments(spec: DecodeSpec, rows_per_warp: int, file) -> DecodeFragments:
    m_tiles = spec.tile.block_m // 16
    kpw = spec.tile.block_n // spec.compute_warps
    pitch = spec.head_dim + 8
    return DecodeFragments(m_tiles=m_tiles, keys_per_warp=kpw, n_tiles=kpw // 8, d_tiles=spec.head_dim // 8,
                           k_steps_qk=spec.head_dim // 16, k_steps_pv=kpw // 16,
                           q_regs=q_registers(spec) if holds_q(spec) else 0, accumulators=accumulators(spec),
                           merge_pitch=pitch, merge_bytes=spec.compute_warps * spec.tile.block_m * pitch * 4,
                           combine_warps=COMBINE_WARPS,
                           v_widened_ahead=spec.kv_dtype == "e4m3"
                           and accumulators(spec) + 2 * (spec.head_dim // 8) * (kpw // 16) <= V_AHEAD_MAX_HELD)


def unsplit_in_flight(spec: DecodeSpec) -> int:
    """K/V bytes one block keeps in flight (its ring's stages ahead of the one it computes), where
    one slice per (KV head, batch) streams as fast as two: measured on the H200 (docs/decode-h200/decode_split_grid.py,
    B8 GQA 32/8 d128, 16k keys) only for the contiguous-only build with a combine kernel (124.2 vs
    124.3 us unsplit vs 2 slices); the paged build (134.6 vs 124.9) and the fused one (131.0 vs
    124.0) stream slower unsplit, so for them the heuristic counts waves only (0)."""
    if spec.paged or spec.combine == "fused":
        return 0
    kv_bytes = 1 if spec.kv_dtype else spec.elem_bytes   # an e4m3 cache's tiles hold half the bytes
    return (spec.smem.stages - 1) * 2 * spec.tile.block_n * spec.head_dim * kv_bytes


def co_resident_blocks(spec: DecodeSpec, occupancy: Occupancy) -> int:
    """Blocks per SM the split rule may count on large grids and long caches: 2 for an e4m3 cell where
    two blocks fit, whose widening keeps one block per SM from streaming at full speed (H200, B8 32/8
    at 32k keys: 146 us in 4 slices, two blocks per SM, against 168 in 2); 1 for 16-bit caches, which one
    block per SM streams (counting two made d64 slower: num_splits_for)."""
    return max(1, min(2, occupancy.by_smem())) if spec.kv_dtype else 1


def co_resident_min_tiles(spec: DecodeSpec, co_resident: int) -> int:
    """The tiles from which a merging cell counts its co-resident blocks: TWO_STAGE_CO_RESIDENT_MIN_TILES for a
    2-stage ring, whose block keeps one tile in flight (the second block per SM is its second tile); 0 (the
    rule's CO_RESIDENT_MIN_TILES) otherwise."""
    if co_resident > 1 and spec.combine != "kernel" and spec.smem.stages == 2:
        return TWO_STAGE_CO_RESIDENT_MIN_TILES
    return 0


def bank_patterns(plan) -> list[banks.Pattern]:
    """Every thread copies K/V; Q, K and V are read with the mma.sync lane maps (load_q_fragment,
    score_step and accumulate_pv in split.cu.j2). An e4m3 cache's tiles are read by other maps (8-byte
    K loads, byte-pair ldmatrix.trans of V) over rows padded to an odd chunk count, conflict-free by
    construction (kv_pitch): no fp16 pattern describes them."""
    if plan.spec.kv_dtype:
        return []
    return banks.mma_sync_patterns(plan, plan.threads)


def kv_pitch(spec: DecodeSpec) -> int:
    """Bytes per row of an e4m3 K/V tile: head_dim, plus a 16-byte chunk when that makes the chunk count
    odd. Rows r..r+7 then start on 8 different 16-byte bank groups, so the V ldmatrix (8 rows, one chunk)
    and the K loads (8 rows, two chunks: each bank group twice, the least for 256 bytes) do not conflict."""
    chunks = spec.head_dim // CHUNK_BYTES
    return (chunks + (chunks % 2 == 0)) * CHUNK_BYTES


def kv_e4m3_tiles(spec: DecodeSpec, sw) -> list[Region]:
    """The Q tile in dtype (swizzled as the spec says), then each stage's K and V tile of e4m3 bytes."""
    from ...core.forward_plan import ELEMENT_TYPES
    d, bn, bm, pitch = spec.head_dim, spec.tile.block_n, spec.tile.block_m, kv_pitch(spec)
    regions = [Region("q", bm, d, ELEMENT_TYPES[spec.dtype][0], spec.elem_bytes, sw.pitch_bytes,
                      swizzle=sw.describe(), per="Q tile, loaded once")]
    pad = f"rows padded to {pitch} B"
    for s in range(spec.smem.stages):
        regions.append(Region(f"k{s}", bn, d, "e4m3", 1, pitch, swizzle=pad, per=f"e4m3 K tile, stage {s}"))
        regions.append(Region(f"v{s}", bn, d, "e4m3", 1, pitch, swizzle=pad, per=f"e4m3 V tile, stage {s}"))
    return regions


def stats_region(spec: DecodeSpec) -> list[Region]:
    rows = spec.compute_warps * spec.tile.block_m
    stats = [Region("stats", rows, 2, "float", 4, 8, per="each warp's row max and row sum, for the merge")]
    if not spec.paged:
        return stats
    # Where each key of a tile lies in the k and v pools, per ring stage: one thread works out a row's
    # page and row in it once, a tile ahead, and every thread copying that row reads it from here.
    return stats + [Region("rows", spec.smem.stages * spec.tile.block_n, 2, "long long", 8, 16, align=16,
                           per="each ring stage's keys: their rows' byte offsets in the k and v pools "
                               "(page x page stride + row in page x row stride)")]


def takes_step_rows(spec: DecodeSpec) -> bool:
    """The spec has a serving step's rows functions (DecodePlan.step_rows): a paged cache of the queries' own
    dtype, no append, mask none among its masks and no expression, which a step's decode rows are (one query
    at the end of its keys sees every key under a bottom-right causal mask)."""
    return spec.paged and not spec.append and not spec.kv_dtype and "none" in spec.masks and spec.variant is None


def function_names(spec: DecodeSpec) -> tuple[Part, ...]:
    """The split part (with combine: auto, a merging function per mask after the plain ones; then a serving
    step's rows functions of mask none), and the combine part unless the split kernel merges the splits itself
    (its rows function after the plain one)."""
    keys = list(spec.masks) + ([merging_key(m) for m in spec.masks] if spec.combine == "auto" else [])
    rows = takes_step_rows(spec)
    if rows:
        keys += [rows_key(key) for key in keys if merged_mask(key) == "none"]
    split = (Part("split", "split.cu.j2", f"{spec.name}_split.cu",
                  tuple((key, f"attngen_{spec.name}_split_{key}") for key in keys), awaits_predecessor=True),)
    if spec.combine != "kernel":
        return split
    combine = ("combine",) + ((rows_key("combine"),) if rows else ())
    return split + (Part("combine", "combine.cu.j2", f"{spec.name}_combine.cu",
                         tuple((key, f"attngen_{spec.name}_{key}") for key in combine), static_smem=0,
                         threads=32 * COMBINE_WARPS, reads=COMBINE_READS + (STEP_ROW_FIELDS if rows else ())
                         + combine_variant_reads(spec), awaits_predecessor=True),)


def combine_variant_reads(spec: DecodeSpec) -> tuple[str, ...]:
    """The Params fields of score modifiers whose valueless keys join every row's softmax (learned
    sinks): the combine adds them to each row's LSE over the splits, once."""
    return tuple(f.name for name in spec.scores if SCORES[name].extra_logit for f in SCORES[name].abi_fields)


def plan(spec: DecodeSpec, file: str | None = None):
    extra = {"tiles": kv_e4m3_tiles} if spec.kv_dtype else {}
    p = plan_forward(spec, kind=KIND, title=TITLE, file=file, fragments=fragments, extra_regions=stats_region,
                     bank_patterns=bank_patterns, **extra)
    if spec.merge_rows != 1 and spec.combine == "kernel":
        raise SpecError(f"merge_rows {spec.merge_rows} needs a split kernel that merges (combine: auto or fused); "
                        "with combine: kernel the combine kernel merges, a warp per row", file=file, key="merge_rows",
                        hint="set combine: auto, or leave merge_rows out")
    ring = p.stages * p.kv_stage_stride
    if p.fragments.merge_bytes > ring:
        raise SpecError(f"the warps' merge buffer ({p.fragments.merge_bytes} B) does not fit over the K/V ring "
                        f"({ring} B)", file=file, key="smem.stages", hint="use more stages or a larger block_n")
    roles = (f"{spec.compute_warps} warps: all copy each K/V tile (cp.async); warp w scores keys "
             f"[{p.fragments.keys_per_warp}w, {p.fragments.keys_per_warp}(w+1)) of the tile against all "
             f"{spec.tile.block_m} group rows and keeps its own softmax state and O",)
    schedule = ("split kernel, grid (num_splits, kv_heads x row_blocks, batch):",
                "  rows: group row r = g x seqlen_q + t is query head kv_head x group + g, new token t",
                ("  keys: split s takes tiles s, s + num_splits, s + 2 x num_splits, ... of its sequence"
                 if spec.split_tiles == "interleaved" else
                 "  keys: split s takes tiles [s x tiles_per_split, (s + 1) x tiles_per_split) of its sequence")
                + " (cache_seqlens[b] keys); an empty slice writes LSE -inf",
                f"  ring of {spec.smem.stages} stages: cp.async of tile i + {spec.smem.stages - 1} while tile i "
                "is computed; one __syncthreads per tile",
                "  end: the warps' (max, sum) through `stats`, their rescaled O through the ring; one split: "
                "O and LSE written, else fp32 partial O and LSE per split",
                (("fused combine" if spec.combine == "fused" else
                  "combine auto: unsplit calls run the plain function; split calls the merging one, where")
                 + ": each split block adds one to its group's counter after its partials are "
                 "visible (__threadfence); the block that sees num_splits - 1 merges the group's rows ("
                 + ("a warp's rows two at a time (merge_rows 2)" if spec.merge_rows == 2 else "a warp per row")
                 + ", partials read past L1) and resets the counter"
                 if spec.combine != "kernel" else
                 f"combine kernel, grid ceil(batch x heads x seqlen_q / {COMBINE_WARPS}): a warp per row "
                 "weighs each split by exp(lse_s - lse) and writes O and LSE"))
    block_text = (f"block: one key slice (split) of one KV head and sequence, for {spec.tile.block_m} group rows "
                  f"(query heads per KV head x new tokens) in {spec.tile.block_n}-key K/V tiles; grid (num_splits, "
                  f"kv_heads x row_blocks, batch)",
                  f"threads: {p.threads} = {spec.compute_warps} warps; every warp holds all {spec.tile.block_m} group "
                  f"rows and scores {p.fragments.keys_per_warp} keys of each tile",
                  "masks: " + "; ".join(DECODE_MASKS[m] for m in spec.masks))
    # The split kernel writes LSE rows contiguously and takes each sequence's causal offset from its
    # cache length, so neither the LSE strides nor the fields of masks without call arguments are
    # read; a window's bounds come from the call, counted from each new token's own position.
    unread = ("lse_batch_stride", "lse_head_stride") + tuple(
        f.name for m in p.mask_variants if not m.takes_window for f in m.abi_fields)
    x = p.expression_cuda
    if (x is not None and x.mask is not None and not x.mask_reads_head) or spec.split_tiles == "interleaved":
        unread += ("tiles_per_split",)   # the blocks share the span their classification finds, or take every
                                         # num_splits-th tile
    if not spec.paged:
        unread += PAGE_FIELDS   # contiguous caches only: no table, pool or page size
    if not takes_step_rows(spec):
        unread += STEP_ROW_FIELDS   # no rows functions: the struct of the kernels before they existed
    if not spec.append:
        unread += APPEND_FIELDS   # no new tokens: the struct and code of the kernels before append existed
    abi = plan_abi(p.mask_variants, varlen=False, reports_errors=True, unread=unread, scores=p.score_variants,
                   base=FORWARD_ABI.with_fields(DECODE_ABI_FIELDS + (KV_SCALE_ABI_FIELDS if spec.kv_dtype else ())))
    co_resident = co_resident_blocks(spec, p.occupancy)
    return DecodePlan.of(p, parts=function_names(spec), abi=abi,
                         block_text=block_text, rows_per_warp=spec.tile.block_m, roles=roles, schedule=schedule,
                         q_in_registers=holds_q(spec), max_splits=spec.max_splits, paged=spec.paged,
                         combine=spec.combine, append=spec.append, unsplit_in_flight=unsplit_in_flight(spec),
                         slice_cost_min_tiles=spec.slice_cost_from_tiles if spec.combine == "kernel" else 0,
                         merge_rows=spec.merge_rows, interleaved_splits=spec.split_tiles == "interleaved",
                         row_mods_per_tile=row_mods_per_tile(spec, p.score_variants),
                         co_resident_blocks=co_resident,
                         co_resident_min_tiles=co_resident_min_tiles(spec, co_resident),
                         kv_dtype=spec.kv_dtype or "", kv_mma=spec.kv_mma or "", kv_pitch_bytes=kv_pitch(spec) if spec.kv_dtype else 0,
                         step_rows=takes_step_rows(spec),
                         copy_engine="cp.async ring (16-byte chunks), every warp copies")


def explain(plan) -> list[str]:
    f = plan.fragments
    return [f"fragments per warp: {f.m_tiles} x m16 group rows; S {f.m_tiles}x{f.n_tiles} m16n8 tiles over "
            f"{f.keys_per_warp} keys, O {f.m_tiles}x{f.d_tiles} tiles, "
            + (f"Q {f.q_regs} registers" if f.q_regs else
               f"Q read from its tile at every k-step (held, its {q_registers(plan.spec)} registers would leave too "
               f"few beside {f.accumulators} accumulators)")
            + f"; {f.accumulators} fp32 accumulators per thread",
            f"mma.sync per tile per warp: {f.m_tiles * f.n_tiles * f.k_steps_qk} (Q.K^T) + "
            f"{f.m_tiles * f.d_tiles * f.k_steps_pv} (P.V)"
            + (f"; V's share widened into {2 * f.d_tiles * f.k_steps_pv} registers right after the scores"
               if f.v_widened_ahead else ""),
            f"merge: {f.merge_bytes} B of fp32 O over the K/V ring (row pitch {f.merge_pitch} floats)",
            f"splits: at most {plan.max_splits}; the runtime picks "
            + split_rule_text(plan.combine, plan.unsplit_in_flight, plan.co_resident_blocks, plan.slice_cost_min_tiles,
                              plan.co_resident_min_tiles),
            (f"paged KV: any page size from 1 to {MAX_PAGE_SIZE} keys (a power of two, page_size and page_shift "
             "in Params) through block_table; a tile's keys are gathered row by row (each row's page and row in "
             "it worked out a tile ahead into `rows`), or copied as one run where a page holds whole tiles; "
             "contiguous caches when the call passes no table"
             if plan.paged else "KV cache: contiguous only (paged: false)")] + (
            ["serving step rows: the `_rows` functions (split "
             + ", ".join(key for key, _ in plan.parts[0].functions if is_rows(key))
             + (", combine combine_rows" if plan.combine_part else "")
             + ") decode each sequence of exactly one query at its row query_rows[b] of a packed q and write its output "
             "at that row (the paged varlen kernel, told single_queries_apart, leaves it alone); every block of another "
             "sequence returns at once"] if plan.step_rows else []) + (
            [f"KV cache e4m3: K/V tiles of bytes (rows of {plan.kv_pitch_bytes} B), widened to "
             f"{'fp16' if plan.widens_to_fp16 else plan.spec.dtype} in "
             "registers (K: 8-byte loads per 32 columns, Q's columns read in the same order; V: ldmatrix.trans of "
             "byte pairs, two 8-column O tiles per chunk; "
             + ("cvt.rn.f16x2.e4m3x2 per byte pair); k_scale joins the softmax scale, v_scale the output"
                + ("; kv_mma fp16: the bf16 Q fragments become fp16 in registers, times 2^e (e from the block's "
                   "largest |q|, 2^-e joining the softmax scale), P is rounded to fp16, the output stays bf16"
                   if plan.converts_q else "")
                if plan.widens_to_fp16 else
                "bit moves and one fma per byte pair); k_scale x 2^8 joins the softmax scale, v_scale x 2^8 the output")
             ] if plan.kv_dtype else []) + (
            ["append: a call's new tokens (k_new, v_new; seqlen_new <= seqlen_q) go into keys cache_seqlens .. "
             "cache_seqlens + seqlen_new - 1 of their sequence; the split block whose tiles hold them rotates them "
             "(rotary_cos / rotary_sin), puts them into its K/V tile in place of the cache's rows and, in the first "
             "row block, writes them into the cache; q is rotated as it is loaded (at each token's position with "
             "a causal or window mask, else all at cache_seqlens); cache_batch_idx maps batch rows to cache rows, "
             "cache_leftpad hides a contiguous row's first keys"] if plan.append else []) + (
            ["score modifiers: each row's (its head's, its new token's) made again at every tile, not held across "
             "the key loop (row_mods_per_tile: Q not held, and the append's fields live through the loop)"]
            if plan.row_mods_per_tile else [])


KIND = Kind(NAME, TITLE, SELECTOR, DecodeSpec, plan, explain, calls="decode")
