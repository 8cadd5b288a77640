"""fwd_wmma: the wmma m16n16k16 attention forward. The wmma accumulator layout is opaque, so S
goes to shared memory for the softmax, P comes back from shared memory as an A operand, and the
running output O lives in shared memory (fp32) where rows can be rescaled."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from ...core import banks
from ...core.forward_plan import ELEMENT_TYPES, plan_forward
from ...core.forward_space import default_forward_space
from ...core.kind import Kind
from ...core.layout import Region
from ...core.spec_keys import (ForwardSpec, rule_always_rescales, rule_block_m_split, rule_block_n, rule_head_dim_fragments,
                          rule_head_dim_vector_loads, rule_no_q_in_registers, rule_no_warp_roles, rule_no_xor_swizzle,
                          rule_pad_16_bytes, rule_pad_bytes, rule_stages_need_async, rule_threads)
from ...errors import SpecError

NAME = "fwd_wmma"
TITLE = "wmma m16n16k16 attention forward"
FRAGMENT = "wmma_m16n16k16"


class WmmaSpec(ForwardSpec):
    mma: Literal[FRAGMENT] = Field(description="wmma_m16n16k16: wmma fragments, S/P/O in shared memory")
    row_unit = 16
    row_unit_what = "16-row fragments"
    key_unit = 16
    key_unit_why = "whole k16 steps of the P.V product"
    rules = (rule_head_dim_vector_loads, rule_head_dim_fragments, rule_block_m_split, rule_block_n,
             rule_stages_need_async, rule_no_q_in_registers, rule_no_xor_swizzle, rule_pad_bytes, rule_pad_16_bytes,
             rule_no_warp_roles, rule_threads, rule_always_rescales)
    # phase5_wmma (64 row-slice registers, 64 threads): no spill at a cap of 128, 32 B at 112 (sm_89,
    # nvcc 13.0).
    register_margin = 64

    def register_need(self):
        rows = self.tile.block_m // self.compute_warps
        if rows > 32 or 32 % rows:
            return None     # the plan refuses the split (fragments)
        lanes = 32 // rows
        return (self.tile.block_n // lanes + self.head_dim // lanes,
                "the row slices of S and O a lane holds in the softmax and the rescale")


@dataclass(frozen=True, kw_only=True)
class WmmaFragments:
    m_tiles: int            # 16-row tiles per warp
    n_tiles: int            # 16-key tiles of S
    d_tiles: int            # 16-column tiles of O
    k_steps_qk: int
    k_steps_pv: int
    lanes_per_row: int      # lanes sharing one softmax row
    cols_per_lane: int      # S columns each of them owns
    d_per_lane: int         # O columns each of them owns


def fragments(spec: WmmaSpec, rows_per_warp: int, file) -> WmmaFragments:
    if rows_per_warp > 32 or 32 % rows_per_warp:
        raise SpecError(f"the wmma kernel gives each warp 16 or 32 rows (got {rows_per_warp})", file=file,
                        key="tile.block_m", hint="make block_m = 16 or 32 x warps.compute")
    lanes_per_row = 32 // rows_per_warp
    bn, d = spec.tile.block_n, spec.head_dim
    return WmmaFragments(m_tiles=rows_per_warp // 16, n_tiles=bn // 16, d_tiles=d // 16, k_steps_qk=d // 16,
                         k_steps_pv=bn // 16, lanes_per_row=lanes_per_row, cols_per_lane=bn // lanes_per_row,
                         d_per_lane=d // lanes_per_row)


def extra_regions(spec: WmmaSpec) -> list[Region]:
    bm, bn, d = spec.tile.block_m, spec.tile.block_n, spec.head_dim
    ctype = ELEMENT_TYPES[spec.dtype][0]
    return [
        Region("s", bm, bn, "float", 4, bn * 4, per="S = Q.K^T scores, fp32"),
        Region("p", bm, bn, ctype, 2, bn * 2, per="P, softmax numerators in the input type"),
        Region("o", bm, d, "float", 4, d * 4, per="running output O, fp32"),
    ]


def bank_patterns(plan) -> list[banks.Pattern]:
    kv = banks.tile_store_pattern(plan, plan.block_n, plan.threads)
    q = banks.tile_store_pattern(plan, plan.block_m, plan.threads)
    # wmma::load_matrix_sync addresses are not specified by CUDA, so only the copies are analysed.
    return [banks.Pattern("K/V tile store (uint4, 16 B)", 16, banks.worst(kv, 16), len(kv)),
            banks.Pattern("Q tile store (uint4, 16 B)", 16, banks.worst(q, 16), len(q))]


def plan(spec: WmmaSpec, file: str | None = None):
    return plan_forward(spec, kind=KIND, title=TITLE, file=file, fragments=fragments,
                        extra_regions=extra_regions, bank_patterns=bank_patterns)


def explain(plan) -> list[str]:
    f = plan.fragments
    return [f"wmma 16x16x16 per warp: {f.m_tiles} row tile(s); S, P and O staged in shared memory; "
            f"{f.lanes_per_row} lanes per softmax row",
            "online softmax: exp2 with the scale folded in; rescale always"]


KIND = Kind(NAME, TITLE, ("mma", FRAGMENT), WmmaSpec, plan, explain, space=default_forward_space)
