"""What every wgmma kind (sm_90a) shares: warpgroups, and the swizzled panels TMA writes and wgmma
reads (their spec names, descriptor modes and the rule that picks one)."""
from __future__ import annotations

from dataclasses import dataclass

from ..targets import TARGETS
from .layout import Region
from .spec_keys import XorSwizzle

WARPGROUP = 4              # warps
ROWS_PER_WARPGROUP = 64    # the M of every wgmma
TILE_ALIGN = 1024          # the widest (128-byte) swizzle pattern repeats every 8 rows = 1024 B, on absolute addresses


def rule_target_has_sm90a(s):
    if TARGETS[s.target].arch != "sm_90":
        return "target", (f"wgmma and setmaxnreg need an sm_90a GPU; target {s.target} is "
                          f"{TARGETS[s.target].arch}: use target h100 or h200, or a fragment the target runs")


# The swizzles TMA writes and wgmma reads, by the bytes of one swizzled row: the spec's XOR swizzle
# (chunk ^= (row >> row_shift) % 2**xor_bits) that each one is, and its descriptor and tensor-map
# names. A tile is stored in panels of one such row's width (64, 32 or 16 16-bit elements).
@dataclass(frozen=True)
class PanelSwizzle:
    row_bytes: int          # bytes of one swizzled panel row
    xor_bits: int
    row_shift: int
    descriptor_mode: int    # bits 62-63 of a wgmma shared-memory descriptor
    tma_name: str           # CUtensorMapSwizzle

    @property
    def cols(self) -> int:
        """Elements of 16-bit types in one panel row."""
        return self.row_bytes // 2

    def columns(self, elem_bytes: int) -> int:
        """Elements of `elem_bytes` bytes in one panel row."""
        return self.row_bytes // elem_bytes

    def describe(self) -> str:
        return f"{{xor_bits: {self.xor_bits}" + (f", row_shift: {self.row_shift}" if self.row_shift else "") + "}"


PANEL_SWIZZLES = (PanelSwizzle(128, 3, 0, 1, "128B"), PanelSwizzle(64, 2, 1, 2, "64B"), PanelSwizzle(32, 1, 2, 3, "32B"))


def panel_swizzle(s) -> PanelSwizzle | None:
    """The panel swizzle the spec's smem.swizzle names, or None."""
    sw = s.smem.swizzle
    if isinstance(sw, XorSwizzle):
        return next((p for p in PANEL_SWIZZLES if (p.xor_bits, p.row_shift) == (sw.xor_bits, sw.row_shift)), None)
    return None


def widest_panels(head_dim: int, elem_bytes: int = 2) -> PanelSwizzle:
    """The widest panel swizzle whose rows tile head_dim without padding (the narrowest when none does)."""
    return next((p for p in PANEL_SWIZZLES if head_dim % p.columns(elem_bytes) == 0), PANEL_SWIZZLES[-1])


def rule_swizzle_panels(s):
    if panel_swizzle(s) is None:
        eb = s.elem_bytes
        best = widest_panels(s.head_dim, eb)
        return "smem.swizzle", ("TMA and wgmma read 128-, 64- or 32-byte swizzled panels: set swizzle: "
                                + ", ".join(p.describe() for p in PANEL_SWIZZLES)
                                + f" (panels of {', '.join(str(p.columns(eb)) for p in PANEL_SWIZZLES)} columns; "
                                  f"head_dim {s.head_dim} takes {best.describe()} without padding)")


def swizzled_tile(name: str, rows: int, cols: int, panel: PanelSwizzle, ctype: str, per: str,
                  elem_bytes: int = 2) -> Region:
    """A tile as TMA writes it with the panel's swizzle: [cols / panel cols][rows][panel cols]."""
    panel_cols = panel.columns(elem_bytes)
    panels = cols // panel_cols
    pattern = f"(row >> {panel.row_shift})" if panel.row_shift else "row"
    return Region(name, panels * rows, panel_cols, ctype, elem_bytes, panel.row_bytes,
                  swizzle=f"{panel.tma_name}: chunk ^= {pattern} % {panel.row_bytes // 16}",
                  per=f"{per}; {panels} panel(s) of {rows} rows x {panel_cols}", align=TILE_ALIGN)
