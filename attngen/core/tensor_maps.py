"""Tensor maps (TMA descriptors) a plan asks the runtime for: which tensor, and the box one copy
moves. The runtime encodes them per call (attngen/tma.py) into Params fields (`abi_field`), 128
bytes each, 64-byte aligned; the kernel takes Params as a __grid_constant__ parameter so the maps
have a parameter-space address TMA can read."""
from __future__ import annotations

from typing import NamedTuple

from .abi import AbiField, blob

MAP_BYTES = 128           # one CUtensorMap
MAP_ALIGN = 64            # its required alignment


class TensorMapSpec(NamedTuple):
    # A NamedTuple, not a frozen dataclass: a first call defines this class (core.frozen says why).
    tensor: str           # q, k, v, o or dout: the (batch, heads, seq, head_dim) tensor it describes
    box_rows: int         # sequence rows one copy moves
    box_cols: int         # head_dim columns one copy moves: one swizzled panel row
    swizzle: str          # 128B, 64B or 32B (CUtensorMapSwizzle); the box row spans its bytes
    store: bool = False   # written by the kernel (TMA store): rows past the sequence are dropped
    transposed: bool = False  # V^T (batch, heads, head_dim, seq): rows are head-dim columns, columns keys
    row_stride: int = 1   # a copy takes every row_stride-th row of its box_rows (TMA's traversal stride): box_rows /
                          # row_stride rows land in shared memory

    @property
    def abi_field(self) -> str:
        """The Params field that carries the map, by value (a __grid_constant__ parameter)."""
        return f"tma_{self.tensor}"

    def describe(self) -> str:
        dims = "(seq, head_dim, heads, batch)" if self.transposed else "(head_dim, seq, heads, batch)"
        every = (f" (one row in {self.row_stride}: {self.box_rows // self.row_stride} rows a copy)"
                 if self.row_stride > 1 else "")
        return (f"{self.tensor}{'^T' if self.transposed else ''}: 4-D {dims}, box {self.box_cols} x {self.box_rows}{every}, "
                f"{self.swizzle} swizzle, " + ("stored; rows and columns past the tensor are not written" if self.store
                                               else "rows and columns past the tensor read as zeros"))


def map_abi_fields(maps) -> tuple[AbiField, ...]:
    """The Params fields that carry `maps` (TensorMapSpec), by value, in their order."""
    return tuple(blob(m.abi_field, MAP_BYTES, MAP_ALIGN, f"TMA tensor map of {m.tensor}, encoded by the runtime per call")
                 for m in maps)
