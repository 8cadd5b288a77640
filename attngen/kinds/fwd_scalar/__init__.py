"""fwd_scalar: the FMA attention forward ("Phase 4"). Each compute warp owns rows of the query
block; lane l owns keys l + 32j of S and column pairs l + 32c of O; P goes through shared memory."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from ...core import banks
from ...core.forward_plan import plan_forward
from ...core.forward_space import default_forward_space
from ...core.kind import Kind
from ...core.layout import Region
from ...core.spec_keys import (ForwardSpec, refuse, rule_always_rescales, rule_block_m_split, rule_block_n,
                          rule_head_dim_vector_loads, rule_no_q_in_registers, rule_no_warp_roles, rule_no_xor_swizzle,
                          rule_pad_bytes, rule_stages_need_async, rule_threads)

NAME = "fwd_scalar"
TITLE = "scalar FMA attention forward"
FRAGMENT = "scalar"


def rule_scalar_head_dim(s):
    if s.head_dim % 64:
        return "head_dim", (f"the scalar kernel gives each lane head_dim/32 columns as half2 pairs, so it must be "
                            f"a multiple of 64 (got {s.head_dim}); use a tensor-core fragment for other sizes")


rule_no_async_copy = refuse(
    "smem.async_copy", lambda s: s.smem.async_copy,
    lambda s: f"asynchronous copies are not generated for {s.mma}; set smem.async_copy: false", "rule_no_async_copy")


class ScalarSpec(ForwardSpec):
    mma: Literal[FRAGMENT] = Field(description="scalar: FMA kernel, no tensor cores")
    row_unit = 1
    row_unit_what = "rows"
    key_unit = 32
    key_unit_why = "one key per lane per step"
    rules = (rule_head_dim_vector_loads, rule_scalar_head_dim, rule_block_m_split, rule_block_n, rule_stages_need_async,
             rule_no_async_copy, rule_no_q_in_registers, rule_no_xor_swizzle, rule_pad_bytes,
             rule_no_warp_roles, rule_threads, rule_always_rescales)
    # phase4 (32 registers of S and O, 128 threads): no spill at a cap of 128, 8 B at 96 (sm_89, nvcc 13.0).
    register_margin = 96

    def register_need(self):
        rows = self.tile.block_m // self.compute_warps
        return (rows * (self.tile.block_n // 32 + self.head_dim // 32),
                "each row's keys and output columns a lane holds")


@dataclass(frozen=True, kw_only=True)
class ScalarFragments:
    keys_per_lane: int      # S columns each lane owns
    pairs_per_lane: int     # elem2 column pairs of O each lane owns
    rows_per_warp: int


def fragments(spec: ScalarSpec, rows_per_warp: int, file) -> ScalarFragments:
    return ScalarFragments(keys_per_lane=spec.tile.block_n // 32, pairs_per_lane=spec.head_dim // 64,
                           rows_per_warp=rows_per_warp)


def extra_regions(spec: ScalarSpec) -> list[Region]:
    bm, bn = spec.tile.block_m, spec.tile.block_n
    return [Region("p", bm, bn, "float", 4, bn * 4, per="P = softmax numerators, fp32, row per warp slice")]


def bank_patterns(plan) -> list[banks.Pattern]:
    d, bn = plan.head_dim, plan.block_n
    kv = banks.word_store_pattern(plan, bn, plan.threads)
    sw = plan.swizzle
    k_read = [[sw.byte_offset(lane + 32 * j, 4 * p) for lane in range(32)]
              for j in range(bn // 32) for p in range(d // 2)]
    v_read = [[sw.byte_offset(j, 4 * lane + 128 * p) for lane in range(32)]
              for j in range(bn) for p in range(d // 64)]
    return [banks.Pattern("K/V tile store (4 x 4 B per 16-B chunk)", 4, banks.worst(kv, 4), len(kv)),
            banks.Pattern("K read for Q.K^T (half2 per lane, one key per lane)", 4, banks.worst(k_read, 4), len(k_read)),
            banks.Pattern("V read for P.V (half2 per lane, one row per warp)", 4, banks.worst(v_read, 4), len(v_read))]


def plan(spec: ScalarSpec, file: str | None = None):
    return plan_forward(spec, kind=KIND, title=TITLE, file=file, fragments=fragments,
                        extra_regions=extra_regions, bank_patterns=bank_patterns)


def explain(plan) -> list[str]:
    f = plan.fragments
    return [f"scalar: each lane owns {f.keys_per_lane} key(s) of S and {f.pairs_per_lane} column pair(s) of O per "
            f"row; P goes through shared memory; every tile rescales"]


KIND = Kind(NAME, TITLE, ("mma", FRAGMENT), ScalarSpec, plan, explain, space=default_forward_space)
