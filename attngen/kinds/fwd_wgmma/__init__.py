"""fwd_wgmma: the Hopper (sm_90a) attention forward. TMA copies Q, K and V into 128-byte-swizzled,
1024-aligned tiles, completing on mbarriers; one thread issues every copy into a K/V ring: the first
thread of a producer warpgroup, or (homogeneous, `warps: {compute: N}`) the first thread of the last
consumer warpgroup between its GEMMs. Each consumer warpgroup owns 64 query rows and runs S = Q.K^T
with both operands from shared memory (wgmma SS) and O += P.V with P from registers and V MN-major
(wgmma RS), fp32 accumulators. K and V of a stage are handed back on separate mbarriers. setmaxnreg
moves registers from the producer to the consumers."""
from __future__ import annotations

from ...core.kind import Kind
from .plan import WgmmaFragments, explain, plan
from .space import sweep_space
from .spec import FRAGMENT, NAME, TITLE, WgmmaSpec

# The kind's jobs live in their own modules: spec.py (model and rules), plan.py (fragments, layout,
# plan, explain), space.py (the sweep's axes).
KIND = Kind(NAME, TITLE, ("mma", FRAGMENT), WgmmaSpec, plan, explain, space=sweep_space)

__all__ = ["KIND", "WgmmaFragments", "WgmmaSpec"]
