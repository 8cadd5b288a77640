"""dtype e4m3 of fwd_mma: the attention forward of the mma.sync class on 8-bit operands (Ada, sm_89,
and later): mma.sync m16n8k32 with e4m3 operands for Q.K^T and P.V, fp32 accumulators, a fp16 or bf16
output. Its kernel is fwd_mma's (templates/fwd_mma/kernel.cu.j2, the e4m3 pieces in e4m3.j2).

Two layouts make P.V work without a shuffle or an in-kernel transpose:
- V comes transposed, (batch, kv_heads, head_dim, seqlen_k) with keys contiguous: the B operand of
  an 8-bit mma.sync is K-major, and ldmatrix cannot transpose bytes;
- the K tile stores its rows in the order P's registers need: an accumulator of S holds keys
  2t, 2t+1 of each 8-key tile, the A fragment of P.V four consecutive keys 4t..4t+3, so the copy puts
  key 4b + 2c + e of every 16 in row 8c + 2b + e and the m16n8 accumulators come out as A fragments.
Descale factors of q, k and v (FlashAttention-3's convention, fp32 (batch, kv_heads)) multiply the
scores and the output; P is kept 2^8 times larger inside the e4m3 range (row sums alike)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from pydantic import Field

from ...core import banks
from ...core.fp8 import KEY_STEP, P_LOG2_OFFSET, E4m3Types, rule_fp8_calls, rule_fp8_target, rule_head_dim_k32
from ...core.layout import CHUNK_BYTES, Region, Swizzle
from ...core.spec_keys import ForwardSpec, PadSwizzle, rule_block_m_split, rule_block_n, rule_threads

FRAGMENT = "mma_m16n8k16"   # the kind's selector; on e4m3 its steps are k32


class MmaFp8Spec(E4m3Types, ForwardSpec):
    mma: Literal[FRAGMENT] = Field(description="mma_m16n8k16: mma.sync, S/P/O in registers; on e4m3 its k32 steps")
    row_unit = 16
    row_unit_what = "16-row fragments"
    key_unit = KEY_STEP
    key_unit_why = "whole k32 steps of the P.V product"
    masks_taken: ClassVar[tuple[str, ...]] = ("none", "causal")
    takes_scores: ClassVar[bool] = False
    # l4_mma_d64_fp8 (64 accumulators, 256 threads): no spill at a cap of 128 (127 used), 108 B at 80;
    # l4_mma_d128_fp8 (96): 48 B at 128 (sm_89, nvcc 13.0).
    register_margin: ClassVar[int] = 64

    def register_need(self):
        f = fragments(self, self.tile.block_m // self.compute_warps, None)
        return f.est_regs, "fp32 S and O accumulators" + (" and Q fragments" if f.q_regs else "")


def rule_fp8_pipeline(s: MmaFp8Spec):
    chunks = s.head_dim // 16
    if (32 * s.compute_warps) % chunks:
        return "head_dim", (f"a copy step covers whole rows: {chunks} chunks of 16 bytes per row must divide the "
                            f"{32 * s.compute_warps} threads (head_dim 32, 64, 128 or 256)")
    if s.producer_warps:
        return "warps", "e4m3 kernels have homogeneous warps; write warps: {compute: N}"
    if not s.smem.async_copy or s.smem.stages < 2:
        return "smem", "e4m3 kernels run a cp.async ring: set smem.async_copy: true and stages >= 2"
    if isinstance(s.smem.swizzle, PadSwizzle):
        return "smem.swizzle", ("padded rows are not generated for e4m3 (the V^T tile's rows are keys); use "
                                "{xor_bits: B} or none")


MmaFp8Spec.rules = (rule_fp8_target, rule_head_dim_k32, rule_block_m_split, rule_block_n, rule_fp8_pipeline, rule_fp8_calls,
                    rule_threads)


@dataclass(frozen=True, kw_only=True)
class MmaFp8Fragments:
    m_tiles: int            # 16-row A fragments per warp
    n_tiles: int            # 8-key accumulator tiles of S
    d_tiles: int            # 8-column accumulator tiles of O
    k_steps_qk: int         # k32 steps of Q.K^T (over head_dim)
    k_steps_pv: int         # k32 steps of P.V (over the tile's keys)
    k: ClassVar[int] = KEY_STEP  # the K of an mma.sync step
    p_log2_offset: int      # P is kept 2^this larger (fits e4m3: at most 2^8 = 256 < 448)
    vt_swizzle: Swizzle     # address function of the V^T tile (rows: head-dim columns; chunks: 16 keys)
    s_regs: int
    o_regs: int
    q_regs: int
    est_regs: int


def vt_swizzle(block_n: int) -> Swizzle:
    """The V^T tile's rows hold block_n keys (block_n bytes). ldmatrix reads 8 rows of one chunk; they
    fall on distinct banks when the XOR covers every chunk of a row and the rows that share a 128-byte
    line share its value: xor_bits log2(chunks per row) (at most 3), row_shift log2(rows per line)."""
    chunks = block_n // CHUNK_BYTES
    bits = min(3, chunks.bit_length() - 1)
    return Swizzle("xor", block_n, bits, 3 - bits)


def fragments(spec: MmaFp8Spec, rows_per_warp: int, file) -> MmaFp8Fragments:
    m_tiles = rows_per_warp // 16
    n_tiles = spec.tile.block_n // 8
    d_tiles = spec.head_dim // 8
    k_qk = spec.head_dim // KEY_STEP
    q_regs = m_tiles * k_qk * 4 if spec.smem.q_in_registers else 0
    return MmaFp8Fragments(m_tiles=m_tiles, n_tiles=n_tiles, d_tiles=d_tiles, k_steps_qk=k_qk,
                           k_steps_pv=spec.tile.block_n // KEY_STEP, p_log2_offset=P_LOG2_OFFSET,
                           vt_swizzle=vt_swizzle(spec.tile.block_n), s_regs=m_tiles * n_tiles * 4,
                           o_regs=m_tiles * d_tiles * 4, q_regs=q_regs,
                           est_regs=m_tiles * (n_tiles + d_tiles) * 4 + q_regs)


def tile_regions(spec: MmaFp8Spec, sw: Swizzle) -> list[Region]:
    """Q tile, then each stage's K tile (rows in P's key order) and V^T tile (head_dim rows of block_n keys)."""
    elem = spec.dtype
    d, bn, bm = spec.head_dim, spec.tile.block_n, spec.tile.block_m
    vt = vt_swizzle(bn)
    regions = [Region("q", bm, d, elem, 1, sw.pitch_bytes, swizzle=sw.describe(), per="Q tile, loaded once")]
    for s in range(spec.smem.stages):
        regions.append(Region(f"k{s}", bn, d, elem, 1, sw.pitch_bytes, swizzle=sw.describe(),
                              per=f"K tile, stage {s}, rows in P's key order"))
        regions.append(Region(f"v{s}", d, bn, elem, 1, vt.pitch_bytes, swizzle=vt.describe(),
                              per=f"V^T tile, stage {s}"))
    return regions


def bank_patterns(plan) -> list[banks.Pattern]:
    """The K copy, the V^T copy and the three ldmatrix.x4 reads (A: Q; B: K and V^T, both K-major)."""
    d, bn, bm = plan.head_dim, plan.block_n, plan.block_m
    vt = _Tile(plan.fragments.vt_swizzle, bn // CHUNK_BYTES)
    k_store = banks.tile_store_pattern(_Tile(_KeyOrder(plan.swizzle), plan.chunks_per_row), bn, plan.threads)
    vt_store = banks.tile_store_pattern(vt, d, plan.threads)
    # ldmatrix_phases counts 16-bit columns: a row of n e4m3 bytes is n / 2 of them.
    q = banks.ldmatrix_phases(plan, bm, d // 2, banks.a_row, banks.a_chunk)
    k = banks.ldmatrix_phases(plan, bn, d // 2, banks.b_row, banks.b_chunk)
    v = banks.ldmatrix_phases(vt, d, bn // 2, banks.b_row, banks.b_chunk)
    return [banks.Pattern("K tile store (cp.async, 16 B)", 16, banks.worst(k_store, 16), len(k_store)),
            banks.Pattern("V^T tile store (cp.async, 16 B)", 16, banks.worst(vt_store, 16), len(vt_store)),
            banks.Pattern("ldmatrix.x4 Q (A fragments)", 16, banks.worst(q, 16), len(q)),
            banks.Pattern("ldmatrix.x4 K (B fragments of Q.K^T)", 16, banks.worst(k, 16), len(k)),
            banks.Pattern("ldmatrix.x4 V^T (B fragments of P.V)", 16, banks.worst(v, 16), len(v))]


@dataclass(frozen=True)
class _Tile:
    """A tile as the bank analysis reads one: its address function and chunks per row."""
    swizzle: object
    chunks_per_row: int


def key_row(key: int) -> int:
    """The K tile row of a key (the template's key_row): key 4b + 2c + e of each 16 in row 8c + 2b + e."""
    return (key & ~15) | ((key & 2) << 2) | ((key >> 1) & 6) | (key & 1)


@dataclass(frozen=True)
class _KeyOrder:
    """The K tile's address function as its copy writes it: row r of the copy lands in key_row(r)."""
    swizzle: Swizzle

    def chunk_offset(self, row: int, chunk: int) -> int:
        return self.swizzle.chunk_offset(key_row(row), chunk)


def explain_lines(plan) -> list[str]:
    """explain's lines of an e4m3 plan after the fragment numbers fwd_mma's explain gives every plan."""
    f = plan.fragments
    return [f"mma.sync m16n8k32 e4m3 per tile per warp: {f.m_tiles * f.n_tiles * f.k_steps_qk} (Q.K^T) + "
            f"{f.m_tiles * f.d_tiles * f.k_steps_pv} (P.V)",
            "K tile rows in P's key order: key 4b + 2c + e of each 16 sits in row 8c + 2b + e, so the m16n8 "
            "accumulators of S are the A fragments of P.V",
            f"V^T tile ({plan.head_dim} rows x {plan.block_n} keys): {f.vt_swizzle.describe()}",
            f"online softmax: exp2 with the scale and the q, k descales folded in; P = exp2(s - max + "
            f"{f.p_log2_offset}) rounded to e4m3; output x v descale, {plan.spec.out_dtype}; rescale "
            f"{plan.rescale.replace('_', ' ')}"]
