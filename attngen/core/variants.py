"""Mask variants: which keys a query row sees. One definition per variant serves the CUDA hook
(templates/lib/mask.j2 reads the variant's Params fields) and the fp32 reference of `verify`, so a
kernel and its test cannot disagree about the mask.

A variant is chosen per kernel function by the spec's `masks` list (none, causal); its options
(causal alignment) are runtime values packed into Params, so one function serves every option.
"""
from __future__ import annotations

from dataclasses import dataclass

from .abi import AbiField, int32

TOP_LEFT = "top_left"          # torch SDPA is_causal: query i sees keys 0..i
BOTTOM_RIGHT = "bottom_right"  # FlashAttention >= 2.1: query i sees keys 0..i + Sk - Sq (KV-cache prefill)
ALIGNMENTS = (TOP_LEFT, BOTTOM_RIGHT)


@dataclass(frozen=True)
class MaskVariant:
    name: str                       # the spec's word for it (masks: [...])
    cpp: str                        # the C++ enumerator the kernel function is instantiated with
    options: tuple[str, ...]        # runtime options; the first is the default
    abi_fields: tuple[AbiField, ...]
    describe: str

    def check_option(self, option: str | None) -> str:
        if option is None:
            return self.options[0] if self.options else ""
        if option not in self.options:
            have = ", ".join(self.options) if self.options else "none"
            raise ValueError(f"mask {self.name!r} takes alignment in ({have}), got {option!r}")
        return option

    def key_offset(self, option: str | None, seqlen_q: int, seqlen_k: int) -> int:
        """Query row i sees keys j <= i + offset (only for variants that bound the keys)."""
        option = self.check_option(option)
        return seqlen_k - seqlen_q if option == BOTTOM_RIGHT else 0

    def abi_values(self, option: str | None, seqlen_q: int, seqlen_k: int) -> dict:
        if not self.abi_fields:
            return {}
        return {"causal_offset": self.key_offset(option, seqlen_q, seqlen_k)}

    def visible(self, torch, seqlen_q: int, seqlen_k: int, option: str | None, device):
        """(Sq, Sk) bool tensor of visible keys, or None when every key is visible."""
        if not self.abi_fields:
            return None
        offset = self.key_offset(option, seqlen_q, seqlen_k)
        return torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device).tril(diagonal=offset)


NONE = MaskVariant("none", "Mask::None", (), (), "every key is visible")
CAUSAL = MaskVariant(
    "causal", "Mask::Causal", ALIGNMENTS,
    (int32("causal_offset", "causal: query row i sees keys j <= i + causal_offset (0 top-left, Sk - Sq "
                            "bottom-right)", default=0),),
    "query row i sees keys j <= i + causal_offset; causal_offset = 0 (top_left) or Sk - Sq (bottom_right)")

MASKS: dict[str, MaskVariant] = {m.name: m for m in (NONE, CAUSAL)}


def mask_abi_fields(names) -> tuple[AbiField, ...]:
    """The Params fields of the listed variants, each once, in MASKS order."""
    out: list[AbiField] = []
    for m in MASKS.values():
        if m.name in names:
            out += [f for f in m.abi_fields if f not in out]
    return tuple(out)
