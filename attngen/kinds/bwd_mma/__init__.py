"""bwd_mma: the attention backward on mma.sync m16n8k16 (FlashAttention-2's structure). A bundle of
three kernels over one Params (attngen/core/backward_plan.py):

- main: block (key block, KV head, batch) holds its block_n keys' K and V tiles in shared memory
  and dK, dV in registers: warp w owns keys [16w, 16w + 16) (warp_keys 32: two warps share each 32
  keys, and take the two halves of each query block, warp_split queries, or of dK and dV's columns,
  warp_split columns, P^T and dS^T shared through shared memory). It walks the query blocks that see its
  keys (for every query head of its KV head): loads Q and dO, recomputes S^T = K Q^T and
  P^T = exp2(S^T scale log2 e - LSE log2 e), dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - delta),
  dK += dS^T Q; dS^T goes through shared memory so that each warp adds dS K for its query rows into
  the fp32 dQ accumulator (red.global.add), in register order: the accumulator keeps each 64-row block
  as the m16n8 accumulators of its four 16-row fragments hold it (the layout the convert kernel reads
  for bwd_wgmma too), so that a warp's add covers 128 contiguous bytes. dK, dV are written in the
  element type at the end.
- preprocess: delta = rowsum(dO * O), and zeros in the accumulator (whole query blocks);
- convert: dQ = scale * accumulator.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from pydantic import Field

from ...core.backward_space import mma_backward_space
from ...core.backward_plan import ACCUM_FRAGMENT_ROWS, BACKWARD_ABI_FIELDS, BackwardPlan, backward_parts
from ...core.forward_plan import FORWARD_ABI, plan_abi, plan_forward
from ...core.kind import Kind
from ...core.launch_rules import ROW_THREADS, lanes_per_row, rows_per_row_block
from ...core.layout import Budget, Region, check_budget, layout_regions
from ...core.spec_keys import (ForwardSpec, HomogeneousWarps, refuse, rule_backward_no_rescale,
                               rule_backward_varlen_no_expressions, rule_backward_varlen_plain,
                               rule_head_dim_fragments, rule_head_dim_vector_loads, rule_pad_16_bytes, rule_pad_bytes,
                               rule_threads)

NAME = "bwd_mma"
TITLE = "mma.sync m16n8k16 attention backward (dQ by fp32 atomics)"
SELECTOR = ("backward", "dq_atomic")
SLOPE_PAIRS_FROM = 128      # head dims whose dK and dV leave no registers for fp32 chain-rule factors (d128
                            # softcap spills on sm_89 with them); below, fp32 factors are 2 % faster (H200)
QUERY_CHUNKS = (32, 64)     # queries whose S^T and dP^T a warp holds at once (chunk / 2 fp32 registers each)
HEAD_DIMS = (32, 64, 128)   # dK and dV of 16 keys take head_dim fp32 registers per thread; the row kernels
                            # give each row head_dim / 8 lanes of one warp (a power of two)
WARP_KEYS = (16, 32)        # keys whose dK and dV a warp holds (warp_keys)
MAX_DK_DV_REGISTERS = 128   # fp32 dK + dV registers per thread (warp_keys x head_dim / 16, halved by warp_split
                            # columns) that leave room for S^T, dP^T and their fragments: d64 at 32 keys per
                            # warp, d128 at 16 (or 32 keys and half the columns)
MAX_ACCUMULATORS = 192      # fp32 dK + dV + S^T + dP^T registers per thread: 32 keys per warp with 64-query
                            # chunks (256) spilled in every function, both splits (sm_90)


class BackwardSpec(ForwardSpec):
    backward: Literal["dq_atomic"] = Field(description=(
        "dq_atomic: blocks over keys hold dK and dV, and add dQ into an fp32 buffer with atomics (picks the "
        "backward kind)"))
    mma: Literal["mma_m16n8k16"] = Field(default="mma_m16n8k16", description="the fragment of every GEMM")
    query_stages: int = Field(default=1, ge=1, le=2, description=(
        "Q and dO tiles in shared memory: 2 loads the next query block's while the block computes this one"))
    query_chunk: Literal[QUERY_CHUNKS] = Field(default=32, description=(
        "queries of the query block whose S^T and dP^T each warp holds in registers at once: 64 gives each "
        "ldmatrix of K and V twice the mma work and more independent mma, for 32 more registers per thread"))
    warp_keys: Literal[WARP_KEYS] = Field(default=16, description=(
        "keys whose dK and dV each warp holds in registers (block_n = 16 x warps.compute either way). 32: two "
        "warps share each 32 keys, split as warp_split says, and each ldmatrix of Q and dO feeds twice the mma; "
        "dK and dV then take 32 x head_dim / 16 fp32 registers (halved by warp_split columns), so head_dim "
        "<= 64 unless warp_split is columns; query_chunk 32"))
    warp_split: Literal["queries", "columns"] = Field(default="queries", description=(
        "with warp_keys 32, how the two warps that hold the same 32 keys share the work. queries: each takes "
        "half of every query block and holds every column of dK and dV (summed at the end). columns: each "
        "holds half the columns of dK and dV (so d128 fits) over every query, and scores half of each pair of "
        "chunks; the two hand each other P^T and dS^T through shared memory (a P^T tile beside dS^T's)"))
    row_unit = 16
    row_unit_what = "16-row fragments of dQ"
    key_unit = 16
    key_unit_why = "16 keys per warp"
    masks_taken = ("none", "causal", "window", "expr")
    takes_scores = True
    # l4_bwd_d64 (96 accumulators, 128 threads): no spill at a cap of 168, 52 B at 128 (sm_89, nvcc 13.0).
    register_margin = 64

    def register_need(self):
        f = fragments(self, 16, None)
        return f.accumulators, "fp32 dK, dV, S^T and dP^T accumulators"


def rule_backward_homogeneous(s: BackwardSpec):
    if not isinstance(s.warps, HomogeneousWarps):
        return "warps", "the backward kernel's warps all copy and compute; use warps: {compute: N}"


def rule_backward_keys_per_warp(s: BackwardSpec):
    if s.tile.block_n != 16 * s.compute_warps:
        return "tile.block_n", (f"must be 16 x warps.compute = {16 * s.compute_warps}: each warp owns 16 keys of the "
                                f"block (got {s.tile.block_n})")


def rule_backward_head_dim(s: BackwardSpec):
    if s.head_dim not in HEAD_DIMS:
        return "head_dim", (f"the backward kernels are generated for head_dim {', '.join(map(str, HEAD_DIMS))} "
                            f"(got {s.head_dim})")
    if s.head_dim_v not in (None, s.head_dim):
        return "head_dim_v", f"the backward kernels take V of q's head dim; remove head_dim_v (got {s.head_dim_v})"


MAX_WARPS = 8   # 16 keys each; more warps leave ptxas fewer registers per thread than dK, dV, S^T and dP^T take


def rule_backward_warps(s: BackwardSpec):
    if s.compute_warps > MAX_WARPS:
        return "warps.compute", (f"at most {MAX_WARPS} (block_n {16 * MAX_WARPS}): {s.compute_warps} warps of "
                                 f"{32 * s.compute_warps} threads leave each fewer registers than its accumulators")
    if not s.smem.async_copy:
        return "smem.async_copy", "the backward kernel copies its tiles with cp.async; set smem.async_copy: true"


def query_groups(s: BackwardSpec) -> int:
    """Groups of warps that split each query block between them: every warp owns warp_keys keys and the
    block has 16 x warps of them (warp_split queries)."""
    return s.warp_keys // 16 if s.warp_split == "queries" else 1


def column_groups(s: BackwardSpec) -> int:
    """Groups of warps that split dK and dV's columns between them (warp_split columns)."""
    return s.warp_keys // 16 if s.warp_split == "columns" else 1


def rule_backward_query_chunks(s: BackwardSpec):
    groups, pair = query_groups(s), s.warp_keys // 16
    if s.tile.block_m % (pair * s.query_chunk):
        each = (f"each of the {groups} warp groups' {s.tile.block_m // groups} queries goes in chunks" if groups > 1 else
                "the two warps of each 32 keys score the query block in pairs of chunks" if pair > 1 else
                "the query block goes in chunks")
        return "tile.block_m", (f"must be a multiple of {pair * s.query_chunk}: {each} of {s.query_chunk} queries "
                                f"(query_chunk; got {s.tile.block_m})")


def rule_backward_warp_keys(s: BackwardSpec):
    if s.warp_split == "columns" and s.warp_keys == 16:
        return "warp_split", "columns splits dK and dV between the two warps of 32 keys: set warp_keys: 32"
    held = s.warp_keys * s.head_dim // 16 // column_groups(s)
    if held > MAX_DK_DV_REGISTERS:
        return "warp_keys", (f"{s.warp_keys} keys per warp hold dK and dV in {held} fp32 registers per thread at "
                             f"head_dim {s.head_dim}, beside S^T and dP^T; at most {MAX_DK_DV_REGISTERS}: use "
                             f"warp_keys 16, or warp_split: columns")
    accumulators = s.warp_keys * (s.head_dim // column_groups(s) + s.query_chunk) // 16
    if accumulators > MAX_ACCUMULATORS:
        return "query_chunk", (f"{s.warp_keys} keys per warp with {s.query_chunk}-query chunks hold {accumulators} fp32 "
                               f"accumulators per thread (dK, dV, S^T, dP^T); at most {MAX_ACCUMULATORS}: use "
                               f"query_chunk 32")
    if s.warp_keys > 16 and s.compute_warps % 2:
        return "warps.compute", (f"must be even: warp_keys {s.warp_keys} gives each {s.warp_keys} keys two warps "
                                 f"(got {s.compute_warps})")


def rule_backward_dq_blocks(s: BackwardSpec):
    if s.tile.block_m % ACCUM_FRAGMENT_ROWS:
        return "tile.block_m", (f"must be a multiple of {ACCUM_FRAGMENT_ROWS}: the dQ accumulator is laid out in blocks of "
                                f"{ACCUM_FRAGMENT_ROWS} rows in register order (got {s.tile.block_m})")


def dq_warp_grid(block_m: int, warps: int) -> tuple[int, int]:
    """(row groups, column groups) of the warps in the dQ step: as many row groups of 16-row fragments
    as the query block has (at most one per warp), the rest of the warps split the head dim."""
    rows = min(warps, block_m // 16)
    return rows, warps // rows


def rule_backward_dq_grid(s: BackwardSpec):
    rows, cols = dq_warp_grid(s.tile.block_m, s.compute_warps)
    if s.compute_warps % rows or (s.tile.block_m // 16) % rows or (s.head_dim // 16) % cols:
        return "warps.compute", (f"{s.compute_warps} warps do not split dQ of {s.tile.block_m} queries x head_dim "
                                 f"{s.head_dim} into whole 16-row fragments and 16-column pairs; use a number of warps "
                                 f"that divides {s.tile.block_m // 16} (the query block's fragments) or a multiple of it")


rule_backward_one_stage = refuse(
    "smem.stages", lambda s: s.smem.stages != 1 or s.smem.q_in_registers,
    lambda s: "the backward kernel loads one query block at a time into shared memory; set smem.stages: 1 and "
              "leave q_in_registers unset", "rule_backward_one_stage")

BackwardSpec.rules = (rule_backward_homogeneous, rule_head_dim_vector_loads, rule_head_dim_fragments, rule_backward_head_dim,
                      rule_backward_warps, rule_backward_keys_per_warp, rule_backward_warp_keys, rule_backward_query_chunks, rule_backward_dq_blocks, rule_backward_dq_grid, rule_backward_varlen_no_expressions, rule_backward_varlen_plain,
                      rule_backward_one_stage, rule_pad_bytes, rule_pad_16_bytes, rule_threads, rule_backward_no_rescale)


@dataclass(frozen=True, kw_only=True)
class BackwardFragments:
    chunk_tiles: int        # 8-query accumulator tiles of S^T and dP^T per warp: the query block goes in
                            # chunks of query_chunk queries
    d_tiles: int            # 8-column accumulator tiles of dK and dV (head_dim / 8)
    k_steps_d: int          # k16 steps over head_dim (S^T, dP^T)
    chunks: int             # chunks of the query block per warp (its group's share)
    k_steps_n: int          # k16 steps over the key block (dQ)
    dq_row_warps: int       # warps over the query block's rows in the dQ step (dq_warp_grid)
    dq_m_tiles: int         # 16-row fragments of dQ each warp adds
    dq_d_pairs: int         # ... and 16-column pairs of the head dim
    query_stages: int       # Q and dO tiles in flight
    query_stage_bytes: int = 0   # from stage 0's Q (dO) tile to stage 1's (set once the regions are laid out)
    ds_pitch: int           # bytes per row of the dS^T tile (block_m elements + 16: conflict-free ldmatrix)
    accumulators: int       # fp32 dK + dV + S^T + dP^T registers per thread
    warp_key_tiles: int     # 16-key fragments of dK and dV (and of S^T, dP^T) per warp
    query_groups: int       # warp groups that split each query block (warp_split queries: 2): group g takes its
                            # g-th share of the queries, and the groups sum dK and dV at the end
    group_scratch_bytes: int = 0   # shared memory the groups sum dK and dV through (Q and dO tiles, which follow
                                   # each other; set once the regions are laid out)
    column_groups: int      # warp groups that split dK and dV's columns (warp_split columns): group g holds
                            # its g-th share of them, and scores the g-th chunk of each pair of chunks
    warp_d_tiles: int       # 8-column accumulator tiles of dK and dV per warp (d_tiles / column_groups)
    row_block: int          # query rows per preprocess / convert block
    row_lanes: int          # ... threads per row (head_dim / 8 rounded up to a power of two)
    slope_pairs: bool       # softcap's chain-rule factors held as fp16 pairs (SLOPE_PAIRS_FROM)
    accum_row_block: int    # the dQ accumulator holds whole query blocks of each head
    accum_fragment_rows: int  # ... each a run of blocks of this many rows in register order
    accum_fragment_cols: int  # ... all head_dim columns in one run
    pair_masks: tuple[str, ...] = ()  # none in register-pair order: sm_80/89 have no 8-byte f32 reduce-add
    dq_transposed: bool = False  # dQ is never added as dQ^T here (the convert part's transposed runs are bwd_wgmma's)


def fragments(spec: BackwardSpec, rows_per_warp: int, file) -> BackwardFragments:
    bm, d = spec.tile.block_m, spec.head_dim
    rows, cols = dq_warp_grid(bm, spec.compute_warps)
    chunk, tiles, halves = spec.query_chunk, spec.warp_keys // 16, column_groups(spec)
    return BackwardFragments(chunk_tiles=chunk // 8, d_tiles=d // 8, k_steps_d=d // 16, chunks=bm // chunk // tiles,
                             k_steps_n=spec.tile.block_n // 16, dq_row_warps=rows, dq_m_tiles=bm // 16 // rows,
                             dq_d_pairs=d // 16 // cols, query_stages=spec.query_stages,
                             ds_pitch=bm * spec.elem_bytes + 16, accumulators=tiles * (d // halves + chunk),
                             warp_key_tiles=tiles, query_groups=query_groups(spec), column_groups=halves,
                             warp_d_tiles=d // 8 // halves,
                             row_block=rows_per_row_block(d), row_lanes=lanes_per_row(d), slope_pairs=d >= SLOPE_PAIRS_FROM,
                             accum_row_block=bm, accum_fragment_rows=ACCUM_FRAGMENT_ROWS,
                             accum_fragment_cols=d)


def backward_regions(spec: BackwardSpec) -> list[Region]:
    """dO beside the Q tile (same swizzle; with two query stages a second Q and dO after them), the
    dS^T tile, and the query block's LSE and delta."""
    from ...core.forward_plan import ELEMENT_TYPES, tile_swizzle
    ctype = ELEMENT_TYPES[spec.dtype][0]
    sw = tile_swizzle(spec)
    bm, bn = spec.tile.block_m, spec.tile.block_n
    f = fragments(spec, 16, None)

    def tile(name, per):
        return Region(name, bm, spec.head_dim, ctype, 2, sw.pitch_bytes, swizzle=sw.describe(), per=per)
    second = [tile("q1", "Q tile of the next query block (stage 1)"), tile("do1", "dO tile of the next query block")]
    pt = [Region("pt", bn, bm, ctype, 2, f.ds_pitch, swizzle="rows padded by 16 B",
                 per="P^T of the block's keys x the query block, for dV (each warp of a pair scores half)")]
    return [tile("do", "dO tile of the query block"), *(second if spec.query_stages == 2 else []),
            Region("ds", bn, bm, ctype, 2, f.ds_pitch, swizzle="rows padded by 16 B",
                   per="dS^T of the block's keys x the query block, for dQ" + (" and dK" if f.column_groups > 1 else "")),
            *(pt if f.column_groups > 1 else []),
            Region("lse", 1, bm, "float", 4, bm * 4, per="the query block's LSE x log2(e) (+inf: a row that adds nothing)"),
            Region("delta", 1, bm, "float", 4, bm * 4, per="the query block's rowsum(dO * O)")]


REGION_ORDER = ("q", "do", "q1", "do1", "k0", "v0", "ds", "pt", "lse", "delta")
REGION_TEXT = {"q": "Q tile of the query block (stage 0)", "k0": "K tile of the block's keys, loaded once",
               "v0": "V tile of the block's keys, loaded once"}


def plan(spec: BackwardSpec, file: str | None = None):
    p = plan_forward(spec, kind=KIND, title=TITLE, file=file, fragments=fragments, extra_regions=backward_regions)
    # Stage s's Q and dO tiles sit query_stage_bytes after stage 0's: Q, dO, then the next stage's.
    by_name = {r.name: replace(r, per=REGION_TEXT.get(r.name, r.per)) for r in p.regions}
    regions = layout_regions([by_name[n] for n in REGION_ORDER if n in by_name])
    smem = check_budget(regions, Budget.of(p.target, spec.smem.opt_in), file)
    offsets = {r.name: r.offset for r in regions}
    stage_bytes = offsets["q1"] - offsets["q"] if "q1" in offsets else 0
    assert not stage_bytes or offsets["do1"] - offsets["do"] == stage_bytes
    # The groups sum dK and dV through the Q and dO tiles (every stage), from Q's offset to K's.
    scratch = offsets["k0"] - offsets["q"] if p.fragments.query_groups > 1 else 0
    abi = plan_abi(p.mask_variants, varlen=spec.varlen, reports_errors=False, scores=p.score_variants,
                   base=FORWARD_ABI.with_fields(BACKWARD_ABI_FIELDS))
    w = spec.compute_warps
    f = p.fragments
    kw = spec.warp_keys
    half = w // 2
    owns = (f"warp w owns keys [{kw}(w % {half}), + {kw}) of the block (dK, dV, S^T, dP^T) for the queries of its "
            f"group w / {half}: the 2 groups take half of each query block each" if f.query_groups > 1 else
            f"warp w owns keys [{kw}(w % {half}), + {kw}) of the block and columns [{8 * f.warp_d_tiles}(w / {half}), "
            f"+ {8 * f.warp_d_tiles}) of their dK and dV; it scores (S^T, dP^T) chunk w / {half} of each pair of "
            f"chunks, its partner w +- {half} the other" if f.column_groups > 1 else
            "warp w owns keys [16w, 16w + 16) of the block (dK, dV, S^T, dP^T)")
    roles = (f"{w} warps: all copy; {owns}, and in the "
             f"dQ step {16 * f.dq_m_tiles} query rows x {16 * f.dq_d_pairs} columns ({f.dq_row_warps} x "
             f"{w // f.dq_row_warps} warps)",)
    schedule = ("main kernel, grid (key blocks, kv_heads, batch" + (" or sequences" if spec.varlen else "") + "):",
                *(("  (varlen: the block narrows Params to its sequence, longest first; past its last key it returns)",)
                  if spec.varlen else ()),
                "  load K, V of the block's keys and the first query block's Q, dO (cp.async, rows past the ends "
                "zero), LSE x log2 e and delta",
                "  for each query head of the KV head, each query block that sees a key of the block:",
                ("    issue the next query block's Q, dO (cp.async, the other stage); wait for this one's; __syncthreads"
                 if spec.query_stages == 2 else "    wait for this query block's Q, dO; __syncthreads"),
                *(("    S^T = K Q^T, P^T = exp2(m(S^T) scale_log2 - LSE log2 e) (m: the score modifiers; masked: 0); "
                   "dV += P^T dO",
                   "    dP^T = V dO^T, dS^T = P^T (dP^T - delta) m'; dK += dS^T Q; dS^T to shared")
                  if f.column_groups == 1 else
                  ("    per pair of chunks: each warp scores its chunk: S^T = K Q^T, P^T = exp2(m(S^T) scale_log2 - LSE "
                   "log2 e) to shared (m: the score modifiers; masked: 0), dP^T = V dO^T, dS^T = P^T (dP^T - delta) m' "
                   "to shared",
                   "      the pair's barrier (bar.sync, 64 threads); dV += P^T dO and dK += dS^T Q over both chunks, "
                   "its columns (A fragments from the P^T and dS^T tiles)")),
                "    (deterministic: thread 0 waits for the block's turn at this query block); __syncthreads",
                ("    " if spec.query_stages == 2 else "    issue the next query block's Q, dO (cp.async, the same stage); ")
                + "load its LSE x log2 e and delta (registers)",
                "    dQ accumulator += dS K (red.global.add, its rows, in register order: 128 contiguous bytes per warp "
                "add); the next LSE and delta to shared (deterministic: __syncthreads, then pass the turn)",
                ("  __syncthreads; the groups sum dK and dV through the Q and dO tiles (group 0 adds the others' "
                 "fp32 accumulators, lane by lane, dV then dK); group 0 packs dK x scale and dV of its keys into the "
                 "K and V tiles; __syncthreads; each warp writes 16 rows out in 16-byte stores of whole rows "
                 "(rows < seqlen_k)" if f.query_groups > 1 else
                 "  __syncthreads; each warp packs dK x scale and dV of its keys and columns into the K and V tiles; "
                 "__syncthreads; each warp writes 16 rows out in 16-byte stores of whole rows (rows < seqlen_k)"
                 if f.column_groups > 1 else
                 "  __syncthreads; each warp packs dK x scale and dV of its 16 keys into its rows of the K and V "
                 "tiles, then writes them out in 16-byte stores of whole rows (rows < seqlen_k)"),
                f"preprocess, convert: grid (ceil(seqlen_q / {p.fragments.row_block}), heads, batch), {ROW_THREADS} "
                f"threads, head_dim / 8 threads per row" + ("; varlen: (ceil(total_q / "
                                                            f"{p.fragments.row_block}), heads, 1)" if spec.varlen else ""))
    block_text = (f"block: {spec.tile.block_n} keys of one KV head and sequence; the query blocks of "
                  f"{spec.tile.block_m} rows that see them, for every query head of the KV head",
                  f"threads: {p.threads} = {f.query_groups} groups of {half} warps of {kw} keys" if f.query_groups > 1 else
                  f"threads: {p.threads} = {w} warps of {kw} keys and half the head dim" if f.column_groups > 1 else
                  f"threads: {p.threads} = {w} warps of 16 keys",
                  "masks: " + ", ".join(spec.masks))
    return BackwardPlan.of(p, parts=backward_parts(spec, abi, accum_blocks=True), abi=abi, regions=regions,
                   smem_bytes=smem, smem_dynamic=smem > p.target.smem_per_block,
                   fragments=replace(p.fragments, query_stage_bytes=stage_bytes, group_scratch_bytes=scratch), roles=roles, schedule=schedule,
                   block_text=block_text, copy_engine="cp.async (16-byte chunks), every warp copies",
                   pipeline_text=(f"copies (cp.async, 16-byte chunks, every warp): K and V of the block's keys once; Q "
                                  f"and dO of each query block in {spec.query_stages} stage(s), "
                                  + ("the next block's issued before this one is computed"
                                     if spec.query_stages == 2 else "the next block's issued while this one's dQ is "
                                                                    "added (dQ reads only dS^T and K)")))


def explain(plan) -> list[str]:
    f = plan.fragments
    steps = f.chunk_tiles // 2 * f.chunks   # k16 steps over the queries a warp scores
    added = steps * f.column_groups          # ... and over those it adds dV and dK for (the pair's, split by columns)
    t = f.warp_key_tiles
    share = (f"of its group's {plan.block_m // f.query_groups} queries" if f.query_groups > 1 else
             "per query block, one of each pair" if f.column_groups > 1 else "per query block")
    return [f"fragments per warp: {16 * t} keys; S^T and dP^T {t * f.chunk_tiles} m16n8 tiles each over a chunk of "
            f"{8 * f.chunk_tiles} queries ({f.chunks} chunks {share}), dK and dV {t * f.warp_d_tiles} tiles each; "
            f"{f.accumulators} fp32 accumulators per thread",
            f"mma.sync per query block per warp: {t * f.chunk_tiles * f.chunks * f.k_steps_d} (S^T) + "
            f"{t * f.warp_d_tiles * added} (dV) + {t * f.chunk_tiles * f.chunks * f.k_steps_d} (dP^T) + "
            f"{t * f.warp_d_tiles * added} (dK) + "
            f"{f.dq_m_tiles * f.d_tiles * f.k_steps_n} (dQ)",
            f"dQ: fp32 atomic adds of {plan.block_m} x {plan.head_dim} per query block and key block into an "
            "accumulator in register order (each warp's add covers 128 contiguous bytes) "
            "(not bitwise repeatable: the adds land in any order); the *_deterministic functions add them one "
            "key block at a time, the last first (turn counters in dq_turns), so dQ repeats bit for bit"]


KIND = Kind(NAME, TITLE, SELECTOR, BackwardSpec, plan, explain, calls="backward",
            space=mma_backward_space)
