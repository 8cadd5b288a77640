"""Mask variants: which keys a query row sees. One definition per variant serves the CUDA hook
(templates/lib/mask.j2 reads the variant's Params fields) and the fp32 reference of `verify`, so a
kernel and its test cannot disagree about the mask.

A variant is chosen per kernel function by the spec's `masks` list (none, causal); its options
(causal alignment) are runtime values packed into Params, so one function serves every option.
MaskVariant itself knows no variant: each one brings its Params fields, the function that fills
them and the function that draws its visible keys for the reference.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from .abi import AbiField, int32

TOP_LEFT = "top_left"          # torch SDPA is_causal: query i sees keys 0..i
BOTTOM_RIGHT = "bottom_right"  # FlashAttention >= 2.1: query i sees keys 0..i + Sk - Sq (KV-cache prefill)
ALIGNMENTS = (TOP_LEFT, BOTTOM_RIGHT)

# (option, seqlen_q, seqlen_k) -> {Params field name: value}; the option is already checked.
AbiValues = Callable[[str, int, int], dict]
# (torch, seqlen_q, seqlen_k, option, device) -> (Sq, Sk) bool tensor of visible keys, or None
# when every key is visible; the option is already checked.
Visible = Callable[[Any, int, int, str, Any], Optional[Any]]


@dataclass(frozen=True)
class MaskVariant:
    name: str                       # the spec's word for it (masks: [...])
    cpp: str                        # the C++ enumerator the kernel function is instantiated with
    options: tuple[str, ...]        # runtime options; the first is the default
    abi_fields: tuple[AbiField, ...]
    describe: str
    fill: AbiValues                 # the values of abi_fields for one call
    visibility: Visible             # the reference's mask
    varlen_only: tuple[str, ...] = ()   # abi_fields only varlen functions read

    def check_option(self, option: str | None) -> str:
        if option is None:
            return self.options[0] if self.options else ""
        if option not in self.options:
            have = ", ".join(self.options) if self.options else "none"
            raise ValueError(f"mask {self.name!r} takes alignment in ({have}), got {option!r}")
        return option

    def abi_values(self, option: str | None, seqlen_q: int, seqlen_k: int) -> dict:
        """The variant's Params fields for one call (fields left out take their defaults)."""
        values = self.fill(self.check_option(option), seqlen_q, seqlen_k)
        unknown = set(values) - {f.name for f in self.abi_fields}
        if unknown:
            raise ValueError(f"mask {self.name!r} fills Params field(s) it does not declare: "
                             f"{', '.join(sorted(unknown))}")
        return values

    def visible(self, torch, seqlen_q: int, seqlen_k: int, option: str | None, device):
        """(Sq, Sk) bool tensor of visible keys, or None when every key is visible."""
        return self.visibility(torch, seqlen_q, seqlen_k, self.check_option(option), device)


# -- none: every key is visible ---------------------------------------------------------------------

def no_abi_values(option: str, seqlen_q: int, seqlen_k: int) -> dict:
    return {}


def every_key_visible(torch, seqlen_q: int, seqlen_k: int, option: str, device):
    return None


NONE = MaskVariant("none", "Mask::None", (), (), "every key is visible", no_abi_values, every_key_visible)


# -- causal: query row i sees keys j <= i + causal_offset ----------------------------------------------

def causal_key_offset(option: str, seqlen_q: int, seqlen_k: int) -> int:
    """Query row i sees keys j <= i + offset: 0 top-left, Sk - Sq bottom-right."""
    return seqlen_k - seqlen_q if option == BOTTOM_RIGHT else 0


def causal_abi_values(option: str, seqlen_q: int, seqlen_k: int) -> dict:
    return {"causal_offset": causal_key_offset(option, seqlen_q, seqlen_k),
            "causal_from_end": int(option == BOTTOM_RIGHT)}


def causal_visible(torch, seqlen_q: int, seqlen_k: int, option: str, device):
    offset = causal_key_offset(option, seqlen_q, seqlen_k)
    return torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device).tril(diagonal=offset)


CAUSAL = MaskVariant(
    "causal", "Mask::Causal", ALIGNMENTS,
    (int32("causal_offset", "causal: query row i sees keys j <= i + causal_offset (0 top-left, Sk - Sq "
                            "bottom-right)", default=0),
     int32("causal_from_end", "causal, varlen sequences: 1 (bottom-right) adds each sequence's seqlen_k - seqlen_q "
                              "to causal_offset; padded calls carry it in causal_offset already", default=0)),
    "query row i sees keys j <= i + causal_offset; causal_offset = 0 (top_left) or Sk - Sq (bottom_right)",
    causal_abi_values, causal_visible, varlen_only=("causal_from_end",))

MASKS: dict[str, MaskVariant] = {m.name: m for m in (NONE, CAUSAL)}
