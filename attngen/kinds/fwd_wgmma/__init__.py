"""fwd_wgmma: the Hopper (sm_90a) attention forward. TMA copies Q, K and V into 128-byte-swizzled,
1024-aligned tiles, completing on mbarriers; one thread issues every copy into a K/V ring: the first
thread of a producer warpgroup, or (homogeneous, `warps: {compute: N}`) the first thread of the last
consumer warpgroup between its GEMMs. Each consumer warpgroup owns 64 query rows and runs S = Q.K^T
with both operands from shared memory (wgmma SS) and O += P.V with P from registers and V MN-major
(wgmma RS), fp32 accumulators. K and V of a stage are handed back on separate mbarriers. setmaxnreg
moves registers from the producer to the consumers.

`dtype: e4m3` is the same kernel on 8-bit operands (FlashAttention-3's Is_FP8; e4m3.py): its own
spec model, plan and call convention under this kind's name and templates.

spec.py holds the spec model and rules, plan.py the plan and explain, space.py the sweep axes; the
kernel is templates/fwd_wgmma/kernel.cu.j2."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from ...core.fp8 import FP8_ABI, P_LOG2_OFFSET
from ...core.kind import Kind
from ...core.spec_keys import refuse
from .e4m3 import WgmmaFp8Spec
from .plan import WgmmaFragments, explain, plan_for
from .space import sweep_space
from .spec import FRAGMENT, WgmmaForwardSpec

NAME = "fwd_wgmma"
TITLE = "wgmma + TMA attention forward (sm_90a)"
E4M3_TITLE = "wgmma + TMA e4m3 attention forward (sm_90a)"


# What a paged spec's varlen functions need: the issuing warp (the producer's, or homogeneous a consumer warp) reads
# a tile's page ids (a lane each) and its first lane copies each page's rows with TMA (templates/fwd_wgmma/copies.j2);
# masks none, causal and window; score modifiers read only a sequence's lengths and the head, an expression variant may read
# K/V-indexed tensors, so none.
rule_paged_varlen = refuse(
    "paged", lambda s: s.paged and (not s.varlen or s.variant is not None
                                    or set(s.masks) - {"none", "causal", "window"}),
    lambda s: "paged: true reads K/V pages in the varlen functions: it needs varlen: true (or only), masks "
              "none/causal/window and no expression variant (score modifiers softcap, alibi and sink are taken)",
    "rule_paged_varlen")


rule_page_copies = refuse(
    "page_copies", lambda s: s.page_copies != "first_lane" and (not s.paged or s.page_copies == "gather"
                                                                 and not s.producer_warps),
    lambda s: ("page_copies picks who copies a paged tile: it needs paged: true (or leave it out)" if not s.paged else
               "page_copies: gather copies with the producer warpgroup's threads: it needs warps: {producer: 4, "
               "consumer: ...}"),
    "rule_page_copies")


class WgmmaSpec(WgmmaForwardSpec):
    mma: Literal[FRAGMENT] = Field(description="wgmma_m64nNk16: Hopper wgmma + TMA (sm_90a)")
    paged: bool = Field(default=False, description=(
        "the varlen functions also read K/V from page pools through a block table (FlashAttention's "
        "flash_attn_varlen_func(block_table=, seqused_k=)), of any power-of-two page size from 1 to 512 given "
        "per call: TMA copies each page's rows of a tile; false: packed K/V only"))
    page_copies: Literal["first_lane", "every_lane", "gather"] = Field(default="first_lane", description=(
        "who copies a paged tile: first_lane, the issuing warp's first lane, a TMA copy of a page's rows at a time, "
        "each page id handed to it by a shuffle; every_lane, each lane of that warp the TMA copy whose page id it read "
        "(up to 32 at once); gather, the producer warpgroup's 128 threads with cp.async, 16 bytes each, rows past "
        "the keys zero-filled (needs a producer warpgroup); needs paged: true"))
    rules = WgmmaForwardSpec.rules + (rule_paged_varlen, rule_page_copies)


def plan(spec: WgmmaSpec, file: str | None = None):
    return plan_for(spec, file, kind=KIND, title=TITLE)


def plan_e4m3(spec: WgmmaFp8Spec, file: str | None = None):
    return plan_for(spec, file, kind=E4M3, title=E4M3_TITLE, abi_base=FP8_ABI, vt=True, p_log2_offset=P_LOG2_OFFSET,
                    k_even_odd=spec.k_rows == "even_odd")


E4M3 = Kind(NAME, E4M3_TITLE, ("mma", FRAGMENT), WgmmaFp8Spec, plan_e4m3, explain, space=sweep_space,
            calls="forward_fp8")
KIND = Kind(NAME, TITLE, ("mma", FRAGMENT), WgmmaSpec, plan, explain, space=sweep_space, by_dtype=(("e4m3", E4M3),))

__all__ = ["KIND", "WgmmaFragments", "WgmmaFp8Spec", "WgmmaSpec"]
