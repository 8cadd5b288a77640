"""fwd_wgmma: the Hopper (sm_90a) attention forward. TMA copies Q, K and V into 128-byte-swizzled,
1024-aligned tiles, completing on mbarriers; one thread issues every copy into a K/V ring: the first
thread of a producer warpgroup, or (homogeneous, `warps: {compute: N}`) the first thread of the last
consumer warpgroup between its GEMMs. Each consumer warpgroup owns 64 query rows and runs S = Q.K^T
with both operands from shared memory (wgmma SS) and O += P.V with P from registers and V MN-major
(wgmma RS), fp32 accumulators. K and V of a stage are handed back on separate mbarriers. setmaxnreg
moves registers from the producer to the consumers.

The spec model, plan, explain and sweep space are shared with the e4m3 kind (core.wgmma_forward_*);
the kernel is templates/lib/wgmma_forward.cu.j2."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from ...core.kind import Kind
from ...core.wgmma_forward_plan import WgmmaFragments, explain, plan_for
from ...core.wgmma_forward_space import sweep_space
from ...core.wgmma_forward_spec import WgmmaForwardSpec

NAME = "fwd_wgmma"
TITLE = "wgmma + TMA attention forward (sm_90a)"
FRAGMENT = "wgmma_m64nNk16"


class WgmmaSpec(WgmmaForwardSpec):
    mma: Literal[FRAGMENT] = Field(description="wgmma_m64nNk16: Hopper wgmma + TMA (sm_90a)")


def plan(spec: WgmmaSpec, file: str | None = None):
    return plan_for(spec, file, kind=KIND, title=TITLE)


KIND = Kind(NAME, TITLE, ("mma", FRAGMENT), WgmmaSpec, plan, explain, space=sweep_space)

__all__ = ["KIND", "WgmmaFragments", "WgmmaSpec"]
