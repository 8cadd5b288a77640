"""fwd_mma: the mma.sync m16n8k16 attention forward (FlashAttention-2 style). S, P and O stay in
registers; ldmatrix(.trans) feeds the fragments from XOR-swizzled tiles; a cp.async ring, or
producer warps handing tiles to consumer warps over mbarriers.

`dtype: e4m3` runs the same kernel on 8-bit operands (FlashAttention-3's Is_FP8; e4m3.py): mma.sync
m16n8k32, K rows in P's key order, a V^T tile and the descales, with its own spec model, plan and call
convention under this kind's name and templates."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from pydantic import Field

from ...core import banks
from ...core.fp8 import FP8_ABI
from ...core.forward_plan import plan_forward
from ...core.forward_space import default_forward_space
from ...core.kind import Kind
from ...core.spec_keys import (ForwardSpec, refuse, rule_block_m_split, rule_block_n, rule_head_dim_fragments,
                               rule_head_dim_vector_loads, rule_pad_16_bytes, rule_pad_bytes, rule_stages_need_async,
                               rule_threads, rule_warp_roles_need_a_ring)
from . import e4m3
from .e4m3 import FRAGMENT, MmaFp8Spec

NAME = "fwd_mma"
TITLE = "mma.sync m16n8k16 attention forward"
E4M3_TITLE = "mma.sync m16n8k32 e4m3 attention forward"


# What a paged spec's varlen functions need: the homogeneous cp.async ring gathers K/V rows through the
# block table (templates/fwd_mma/pipeline.j2); masks none, causal and window (each sequence's window
# counts from its own key count, as the packed varlen call's). Score modifiers read only a sequence's
# lengths and the head, which the paged sequence sets as the packed one does; an expression variant
# may read K/V-indexed tensors, so none.
rule_paged_varlen = refuse(
    "paged", lambda s: s.paged and (not s.varlen or s.producer_warps or not s.smem.async_copy or s.smem.stages < 2
                                    or s.variant is not None or set(s.masks) - {"none", "causal", "window"}),
    lambda s: "paged: true reads K/V pages in the varlen functions of a homogeneous cp.async ring: it needs "
              "varlen: true, smem.async_copy: true, stages >= 2, no producer warps, masks none/causal/window and "
              "no expression variant (score modifiers softcap, alibi and sink are taken)", "rule_paged_varlen")


class MmaSpec(ForwardSpec):
    mma: Literal[FRAGMENT] = Field(description="mma_m16n8k16: mma.sync, S/P/O in registers")
    paged: bool = Field(default=False, description=(
        "the varlen functions also read K/V from page pools through a block table (FlashAttention's "
        "flash_attn_varlen_func(block_table=, seqused_k=)), of any power-of-two page size from 1 to 512 "
        "given per call; false: packed K/V only"))
    row_unit = 16
    row_unit_what = "16-row fragments"
    key_unit = 16
    key_unit_why = "whole k16 steps of the P.V product"
    masks_taken = ("none", "causal", "window", "expr")
    takes_scores = True
    takes_sinks = True
    # l4_mma_d64 (80 accumulators, 128 threads): no spill at a cap of 168, 24 B at 128; h100_mma_d128
    # (128): 368 B at 128 (sm_89/sm_90, nvcc 13.0).
    register_margin = 72
    rules = (rule_head_dim_vector_loads, rule_head_dim_fragments, rule_block_m_split, rule_block_n,
             rule_stages_need_async, rule_pad_bytes, rule_pad_16_bytes, rule_warp_roles_need_a_ring,
             rule_threads, rule_paged_varlen)

    def register_need(self):
        f = fragments(self, self.tile.block_m // self.compute_warps, None)
        return f.est_regs, "fp32 S and O accumulators" + (" and Q fragments" if f.q_regs else "")


@dataclass(frozen=True, kw_only=True)
class MmaFragments:
    m_tiles: int            # 16-row A fragments per warp
    n_tiles: int            # 8-key accumulator tiles of S
    d_tiles: int            # 8-column accumulator tiles of O
    k_steps_qk: int         # k16 steps of Q.K^T
    k_steps_pv: int         # k16 steps of P.V
    s_regs: int
    o_regs: int
    q_regs: int
    est_regs: int           # fp32 accumulators + Q fragments, before addressing
    # What the template asks of every plan (e4m3.MmaFp8Fragments sets them otherwise):
    k: ClassVar[int] = 16                   # the K of an mma.sync step
    p_log2_offset: ClassVar[int] = 0        # P as it is
    vt_swizzle: ClassVar[None] = None       # no V^T tile: V is read row-major through ldmatrix.trans


def fragments(spec: MmaSpec, rows_per_warp: int, file) -> MmaFragments:
    m_tiles = rows_per_warp // 16
    n_tiles = spec.tile.block_n // 8
    d_tiles = spec.head_dim // 8
    k_qk = spec.head_dim // 16
    q_regs = m_tiles * k_qk * 4 if spec.smem.q_in_registers else 0
    return MmaFragments(m_tiles=m_tiles, n_tiles=n_tiles, d_tiles=d_tiles, k_steps_qk=k_qk,
                        k_steps_pv=spec.tile.block_n // 16, s_regs=m_tiles * n_tiles * 4,
                        o_regs=m_tiles * d_tiles * 4, q_regs=q_regs,
                        est_regs=m_tiles * (n_tiles + d_tiles) * 4 + q_regs)


def bank_patterns(plan) -> list[banks.Pattern]:
    """The K/V copy (by the producer warps, or every thread) and the ldmatrix reads (see
    LdmatrixLanes in kernel.cu.j2: core.banks' A and B lane maps)."""
    return banks.mma_sync_patterns(plan, plan.producer_threads or plan.threads)


def plan(spec: MmaSpec, file: str | None = None):
    return plan_forward(spec, kind=KIND, title=TITLE, file=file,
                        fragments=fragments, bank_patterns=bank_patterns)


def plan_e4m3(spec: MmaFp8Spec, file: str | None = None):
    return plan_forward(spec, kind=E4M3, title=E4M3_TITLE, file=file, fragments=e4m3.fragments,
                        bank_patterns=e4m3.bank_patterns, tiles=e4m3.tile_regions, abi=FP8_ABI)


def fragment_line(f) -> str:
    """explain's line of a plan's fragment numbers (both dtypes)."""
    return (f"fragments per warp: {f.m_tiles} x m16 rows; S = {f.m_tiles}x{f.n_tiles} m16n8 tiles "
            f"({f.s_regs} fp32 regs), O = {f.m_tiles}x{f.d_tiles} tiles ({f.o_regs} fp32 regs)"
            + (f", Q fragments {f.q_regs} regs" if f.q_regs else ", Q re-read from shared memory")
            + f"; ~{f.est_regs} accumulator registers per thread")


def explain_e4m3(plan) -> list[str]:
    return [fragment_line(plan.fragments), *e4m3.explain_lines(plan)]


def explain(plan) -> list[str]:
    f = plan.fragments
    return [fragment_line(f),
            f"mma.sync per tile per warp: {f.m_tiles * f.n_tiles * f.k_steps_qk} (Q.K^T) + "
            f"{f.m_tiles * f.d_tiles * f.k_steps_pv} (P.V)",
            f"online softmax: exp2 with the scale folded in; rescale {plan.rescale.replace('_', ' ')}"] + (
        ["paged varlen: with a block table, K/V rows come from page pools of any page size from 1 to 512 keys "
         "(a power of two, page_size and page_shift in Params), a cp.async per 16-byte chunk at a 64-bit offset"]
        if plan.paged else [])


E4M3 = Kind(NAME, E4M3_TITLE, ("mma", FRAGMENT), MmaFp8Spec, plan_e4m3, explain_e4m3, space=default_forward_space,
            calls="forward_fp8")
KIND = Kind(NAME, TITLE, ("mma", FRAGMENT), MmaSpec, plan, explain, space=default_forward_space,
            by_dtype=(("e4m3", E4M3),))
