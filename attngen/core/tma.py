"""Tensor maps (TMA descriptors) a plan asks the runtime for: which tensor, and the box one copy
moves. The runtime encodes them per call (attngen/tma.py); the kernel reads them from the
`tensor_maps` parameter, 128 bytes each, in the plan's order."""
from __future__ import annotations

from dataclasses import dataclass

MAP_BYTES = 128           # one CUtensorMap
MAP_ALIGN = 64            # its required alignment
SWIZZLE_128B_COLS = 64    # 16-bit elements in one 128-byte swizzled row: the widest box row with SWIZZLE_128B


@dataclass(frozen=True)
class TensorMapSpec:
    tensor: str           # q, k or v: the (batch, heads, seq, head_dim) operand it describes
    box_rows: int         # sequence rows one copy moves
    box_cols: int = SWIZZLE_128B_COLS
    swizzle: str = "128B"

    def describe(self) -> str:
        return (f"{self.tensor}: 4-D (head_dim, seq, heads, batch), box {self.box_cols} x {self.box_rows}, "
                f"{self.swizzle} swizzle, rows past the sequence read as zeros")
