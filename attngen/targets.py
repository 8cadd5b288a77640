"""GPU profiles: facts only (vendor tables and measurements), no computation."""
from __future__ import annotations

from typing import NamedTuple


class Target(NamedTuple):
    # A NamedTuple, not a frozen dataclass: a first call defines this class (core.frozen says why).
    name: str
    gpu: str
    arch: str                 # nvcc -arch value
    smem_per_block: int       # bytes a block may use without opting in (static or dynamic)
    smem_per_block_optin: int  # bytes after cudaFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)
    smem_per_sm: int          # bytes of shared memory per SM available to blocks
    regs_per_sm: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    sm_count: int
    smem_reserved_per_block: int = 1024  # the driver reserves 1 KiB per resident block (sm_80+)


TARGETS: dict[str, Target] = {
    t.name: t
    for t in [
        Target("l4", "NVIDIA L4", "sm_89", 49152, 101376, 102400, 65536, 1536, 24, 58),
        Target("rtx4090", "NVIDIA GeForce RTX 4090", "sm_89", 49152, 101376, 102400, 65536, 1536, 24, 128),
        Target("a100", "NVIDIA A100 SXM", "sm_80", 49152, 166912, 167936, 65536, 2048, 32, 108),
        Target("h100", "NVIDIA H100 SXM", "sm_90", 49152, 232448, 233472, 65536, 2048, 32, 132),
        Target("h200", "NVIDIA H200", "sm_90", 49152, 232448, 233472, 65536, 2048, 32, 132),
    ]
}
