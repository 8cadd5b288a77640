"""What every e4m3 forward kind shares: its Params (the forward's, V transposed, the descale
factors), the spec keys of its element types, and the power of two P is kept at."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..targets import TARGETS
from .abi import Abi, pointer
from .forward_plan import FORWARD_ABI

E4M3_MAX = 448.0        # e4m3's largest finite value (conversions saturate to it)
P_LOG2_OFFSET = 8       # P = exp2(s - max + 8) <= 256, inside e4m3's 448: its small values keep their bits
# With a kept max (softmax.lazy_rescale) P may pass 2^offset by the slack, and the slack is what is left below 448:
# at 8 it is 0.75, and a warp of random rows moves its max in a fifth to over half of its tiles. At 5 it is 3.75, and
# on the bench's inputs a warp moves it in 0-0.1 % of the tiles after a row's first
# (docs/hopper-h200/kept_max_first/fallback_rate.py). What the lower power costs is at P's small end: values below
# 2^-11 of the row's max become subnormal, whose step (2^-14 of the max) is far finer than the rounding of the large
# values that set the error (3 mantissa bits): emulated, offsets 8 down to 4 give the same output error
# (docs/hopper-h200/kept_max_first/p_offset_error.py).
P_LOG2_OFFSET_KEPT_MAX = 5


def p_log2_offset(lazy_rescale: bool) -> int:
    """The power of two an e4m3 P is kept at: lower where a row keeps its max, for the slack that leaves."""
    return P_LOG2_OFFSET_KEPT_MAX if lazy_rescale else P_LOG2_OFFSET


KEY_STEP = 32           # keys (and head-dim columns) per k32 step of an 8-bit mma
FP8_FROM_ARCH = 89      # e4m3 tensor-core instructions: Ada (sm_89) and later; sm_80 has none

# Params: the forward's, V described as the transposed tensor it is, and the descale factors.
FP8_ABI = Abi("Params", tuple(
    pointer("v", "values transposed: (batch, kv_heads, head_dim, seqlen_k) e4m3, keys contiguous, rows 16-byte "
                 "aligned") if f.name == "v" else f for f in FORWARD_ABI.fields) + (
    pointer("q_descale", "fp32 (batch, kv_heads) factor of q's values; null: 1", optional=True),
    pointer("k_descale", "fp32 (batch, kv_heads) factor of k's values; null: 1", optional=True),
    pointer("v_descale", "fp32 (batch, kv_heads) factor of v's values; null: 1", optional=True)))


class E4m3Types:
    """Spec keys of an e4m3 kind (mixed into its spec model): e4m3 inputs, a fp16 or bf16 output."""

    dtype: Literal["e4m3"] = Field(default="e4m3", description="element type of q, k and v: e4m3 (fp8)")
    output_dtype: Literal["fp16", "bf16"] = Field(
        default="bf16", alias="out_dtype", description="element type of the output (bf16 as FlashAttention-3's fp8)")

    @property
    def elem_bytes(self) -> int:
        return 1

    @property
    def out_dtype(self) -> str:
        return self.output_dtype


def has_fp8(target: str) -> bool:
    return int(TARGETS[target].arch.removeprefix("sm_")) >= FP8_FROM_ARCH


def rule_fp8_target(s):
    """ptxas refuses e4m3 mma on an older GPU; say so before rendering anything."""
    if not has_fp8(s.target):
        runs = ", ".join(t for t in TARGETS if has_fp8(t))
        return "target", (f"e4m3 tensor-core instructions need sm_{FP8_FROM_ARCH} or later; target {s.target} is "
                          f"{TARGETS[s.target].arch}: use target {runs}, or dtype fp16/bf16 with an fp16 fragment")


def rule_head_dim_k32(s):
    if s.head_dim % KEY_STEP:
        return "head_dim", (f"must be a multiple of {KEY_STEP} for e4m3 fragments (k32 steps of Q.K^T; got "
                            f"{s.head_dim}); try {-(-s.head_dim // KEY_STEP) * KEY_STEP}")


def rule_fp8_calls(s):
    if s.varlen:
        return "varlen", "varlen sequences are not generated for e4m3 yet; set varlen: false"
    if s.head_dim_v not in (None, s.head_dim):
        return "head_dim_v", "e4m3 kernels share Q's head dim for V; leave head_dim_v unset"
