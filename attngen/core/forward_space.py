"""The sweep axes of the forward kinds that share the classic layout (scalar, wmma, mma.sync):
tiles, warps (homogeneous or producer/consumer), ring depth, swizzle and Q placement."""
from __future__ import annotations

import re
from dataclasses import dataclass

from .search_space import Axis, SearchSpace, field_axis, with_base
from .spec_keys import PadSwizzle, XorSwizzle

DEFAULT_BLOCK_M = (64, 96, 112, 128)
DEFAULT_BLOCK_N = (32, 64, 128)
DEFAULT_COMPUTE_WARPS = (2, 4, 8)
DEFAULT_ROLE_PAIRS = ((1, 4), (1, 7), (2, 4), (2, 6))   # (producer, consumer), for bases with roles
DEFAULT_STAGES = (1, 2, 3, 4)


@dataclass(frozen=True)
class WarpChoice:
    """Homogeneous warps (producer 0) or a producer/consumer split."""

    compute: int
    producer: int = 0

    def as_spec(self) -> dict:
        if self.producer:
            return {"producer": self.producer, "consumer": self.compute}
        return {"compute": self.compute}

    @property
    def tag(self) -> str:
        return f"p{self.producer}c{self.compute}" if self.producer else f"w{self.compute}"

    def __str__(self) -> str:
        return f"{self.producer}+{self.compute}" if self.producer else str(self.compute)


def swizzle_token(value) -> str:
    """A spec's smem.swizzle (model or dumped form) as a short token: none, xor3, xor3r1, pad16."""
    if isinstance(value, (PadSwizzle, XorSwizzle)):
        value = value.model_dump()
    if value == "none":
        return "none"
    if "pad_bytes" in value:
        return f"pad{value['pad_bytes']}"
    shift = value.get("row_shift", 0)
    return f"xor{value['xor_bits']}" + (f"r{shift}" if shift else "")


def swizzle_value(token: str):
    """Inverse of swizzle_token: the value a spec's smem.swizzle takes."""
    m = re.fullmatch(r"none|pad(\d+)|xor(\d+)(?:r(\d+))?", token)
    if not m:
        raise ValueError(f"swizzle token {token!r} is not none, padN, xorB or xorBrS")
    if token == "none":
        return "none"
    if m.group(1):
        return {"pad_bytes": int(m.group(1))}
    return {"xor_bits": int(m.group(2)), "row_shift": int(m.group(3) or 0)}


def _swizzle_tag(token: str) -> str:
    return {"none": "u"}.get(token, token.replace("xor", "x").replace("pad", "p"))


def _write_warps(data: dict, w: WarpChoice) -> None:
    data["warps"] = w.as_spec()


def forward_space(block_m, block_n, warps, stages, swizzle, q_in_registers) -> SearchSpace:
    """A space over the six classic fields, with the values given (tags like m128n64w4s2x3q)."""
    return SearchSpace((
        field_axis("block_m", "tile.block_m", block_m, lambda s: s.tile.block_m, lambda v: f"m{v}"),
        field_axis("block_n", "tile.block_n", block_n, lambda s: s.tile.block_n, lambda v: f"n{v}"),
        Axis("warps", tuple(warps), lambda s: WarpChoice(s.compute_warps, s.producer_warps), _write_warps,
             lambda w: w.tag),
        field_axis("stages", "smem.stages", stages, lambda s: s.smem.stages, lambda v: f"s{v}"),
        Axis("swizzle", tuple(swizzle), lambda s: swizzle_token(s.smem.swizzle),
             lambda data, v: data.setdefault("smem", {}).__setitem__("swizzle", swizzle_value(v)), _swizzle_tag),
        field_axis("q_in_registers", "smem.q_in_registers", q_in_registers, lambda s: s.smem.q_in_registers,
                   lambda v: "q" if v else "", lambda v: "yes" if v else "no"),
    ))


def default_forward_space(base) -> SearchSpace:
    """The default space around `base`: its own values plus the usual alternatives.

    Producer/consumer splits are tried only when the base uses warp roles; the swizzle is the
    base's or none.
    """
    at = WarpChoice(base.compute_warps, base.producer_warps)
    warps = {WarpChoice(w) for w in DEFAULT_COMPUTE_WARPS}
    if base.producer_warps:
        warps |= {WarpChoice(c, p) for p, c in DEFAULT_ROLE_PAIRS}
    warps.add(at)
    return forward_space(
        block_m=with_base(DEFAULT_BLOCK_M, base.tile.block_m),
        block_n=with_base(DEFAULT_BLOCK_N, base.tile.block_n),
        warps=tuple(sorted(warps, key=lambda w: (w.producer > 0, w.producer, w.compute))),
        stages=with_base(DEFAULT_STAGES, base.smem.stages),
        swizzle=tuple(dict.fromkeys((swizzle_token(base.smem.swizzle), "none"))),
        q_in_registers=(False, True),
    )
