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
# A kept max (softmax.lazy_rescale) keeps P at 2^8 too, for a slack of 0.75 below 448. At 2^5 (slack 3.75) a warp
# of random rows would fall back on almost no tile, but the kernels failed FlashAttention's error rule (H100: 6 of
# the e4m3 trials' verify cases, 1.03-1.6x the bound): a row's largest weight then lands anywhere in [2^5, 2^8.75]
# and is rounded, where the usual step puts it at exactly 2^8. Emulated on the verifier's inputs, the kept max's
# largest error is up to 2.7x torch's e4m3-P peer at 2^5 and 1.6x at 2^8
# (docs/hopper-h200/kept_max_first/kept_max_error.py).


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
