"""dtype e4m3 of fwd_wgmma: the Hopper forward on 8-bit operands (sm_90a). The kind's warpgroups,
TMA ring and schedules (spec.py, plan.py, templates/fwd_wgmma/kernel.cu.j2), with wgmma m64nNk32 on
e4m3 operands for Q.K^T and P.V:

- V comes transposed, (batch, kv_heads, head_dim, seqlen_k) with keys contiguous, the layout the
  e4m3 call convention takes (the B operand of an 8-bit wgmma is K-major): TMA copies V^T tiles of
  head_dim rows and wgmma reads them as it reads K;
- k_rows in_order: P leaves the S accumulators for the A registers of P.V through two shuffles per
  16 keys: an accumulator holds keys 2t, 2t + 1 and 8 + 2t, 9 + 2t of each 16, an A register four
  consecutive keys 4t .. 4t + 3, which lanes 2(t % 2) and 2(t % 2) + 1 of the quad hold. k_rows
  even_odd: two TMA copies that take every second key put a tile's even keys before its odd ones, so
  a lane's accumulators already hold its A registers' four keys and P packs with no exchange;
- P = exp2(s - max + 8) is rounded to e4m3 (the row sums take the 2^8 out); the q and k descales
  fold into the scale, v's into the output, which leaves as fp16 or bf16 from the registers."""
from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from ...core.fp8 import KEY_STEP, E4m3Types, rule_fp8_calls, rule_head_dim_k32
from ...core.spec_keys import rule_threads
from ...core.wgmma import rule_swizzle_panels, rule_target_has_sm90a
from .spec import (FRAGMENT, MAX_N, WgmmaForwardSpec, rule_always_rescales, rule_async_copies, rule_block_m_rows,
                   rule_item_overlap, rule_middle_pairs, rule_short_first, rule_longest_alone, rule_snake, rule_snake_tail, rule_kept_max_first, rule_max_chains, rule_p_buffers, rule_pingpong,
                   rule_key_halves, rule_q_in_shared, rule_q_tiles, rule_registers, rule_ring, rule_softmax_block, rule_warpgroups)


def rule_block_n_fp8(s):
    if s.tile.block_n % KEY_STEP or s.tile.block_n > MAX_N:
        return "tile.block_n", (f"must be a multiple of {KEY_STEP} (k32 steps of P.V; the V^T tile's rows of keys "
                                f"are swizzled panels) and at most {MAX_N} (the N of Q.K^T) for e4m3 {s.mma} (got "
                                f"{s.tile.block_n})")


def rule_fp8_epilogue(s):
    if s.epilogue != "registers":
        return "epilogue", ("e4m3 kernels write O from the registers (the Q tile holds half of O's bytes): use "
                            "epilogue: registers")


class WgmmaFp8Spec(E4m3Types, WgmmaForwardSpec):
    mma: Literal[FRAGMENT] = Field(description="wgmma_m64nNk16: Hopper wgmma + TMA (sm_90a); on e4m3 its k32 steps")
    k_rows: Literal["in_order", "even_odd"] = Field(default="in_order", description=(
        "the order of a K tile's keys in shared memory: in_order; or even_odd = the tile's even keys, then its odd "
        "ones (two TMA copies that take every second key), so that a lane's S accumulators hold the four "
        "consecutive keys of its P register and P reaches P.V with no lane exchange (no shuffles or byte "
        "selects); the mask reads each accumulator's key in that order"))
    key_unit = KEY_STEP
    key_unit_why = "k32 steps of P.V"
    takes_head_dim_v: ClassVar[bool] = False
    masks_taken: ClassVar[tuple[str, ...]] = ("none", "causal")
    takes_scores: ClassVar[bool] = False
    rules = (rule_target_has_sm90a, rule_head_dim_k32, rule_swizzle_panels, rule_fp8_epilogue, rule_fp8_calls,
             rule_warpgroups, rule_block_m_rows, rule_block_n_fp8, rule_async_copies, rule_q_in_shared, rule_ring,
             rule_always_rescales, rule_max_chains, rule_softmax_block, rule_kept_max_first, rule_p_buffers, rule_pingpong,
             rule_q_tiles, rule_item_overlap, rule_middle_pairs, rule_short_first, rule_longest_alone, rule_snake, rule_snake_tail, rule_key_halves, rule_registers, rule_threads)

