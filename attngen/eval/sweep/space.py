"""The search space of a sweep: the fields varied around a base spec (`SearchSpace`, its points
`Choice`), the swizzle tokens candidates are named by, and the cases measured (`parse_cases`)."""
from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from typing import ClassVar, Iterable

from ...spec import PadSwizzle, Spec, XorSwizzle
from ..bench import CAUSAL_CHOICES, Case, parse_shape

Shape = tuple[int, int, int, int]          # batch, heads, seqlen, head_dim

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


@dataclass(frozen=True)
class Choice:
    """One point of a SearchSpace: a value for each field."""

    block_m: int
    block_n: int
    warps: WarpChoice
    stages: int
    swizzle: str
    q_in_registers: bool

    @property
    def tag(self) -> str:
        """Short, deterministic and unique within a space, e.g. m128n64w8s2x3q."""
        return (f"m{self.block_m}n{self.block_n}{self.warps.tag}s{self.stages}{_swizzle_tag(self.swizzle)}"
                + ("q" if self.q_in_registers else ""))

    def as_dict(self) -> dict:
        return {"block_m": self.block_m, "block_n": self.block_n, "warps": str(self.warps),
                "stages": self.stages, "swizzle": self.swizzle, "q_in_registers": self.q_in_registers}


@dataclass(frozen=True)
class SearchSpace:
    """The values each varied field may take; everything else comes from the base spec."""

    block_m: tuple[int, ...]
    block_n: tuple[int, ...]
    warps: tuple[WarpChoice, ...]
    stages: tuple[int, ...]
    swizzle: tuple[str, ...]
    q_in_registers: tuple[bool, ...]

    FIELDS: ClassVar[tuple[str, ...]] = ("block_m", "block_n", "warps", "stages", "swizzle", "q_in_registers")

    @property
    def size(self) -> int:
        return math.prod(len(getattr(self, f)) for f in self.FIELDS)

    def choices(self) -> Iterable[Choice]:
        """Every point, in a fixed order (the fields' values in the order given)."""
        for values in itertools.product(*(getattr(self, f) for f in self.FIELDS)):
            yield Choice(*values)

    def neighbours(self, choice: Choice) -> list[Choice]:
        """Points that differ from `choice` in one field, by one step in that field's value list."""
        out = []
        for f in self.FIELDS:
            values = getattr(self, f)
            i = values.index(getattr(choice, f))
            for j in (i - 1, i + 1):
                if 0 <= j < len(values):
                    out.append(Choice(**{**_fields(choice), f: values[j]}))
        return out

    def as_dict(self) -> dict:
        d = {f: list(getattr(self, f)) for f in self.FIELDS}
        d["warps"] = [w.as_spec() for w in self.warps]
        return d


def _fields(choice: Choice) -> dict:
    return {f: getattr(choice, f) for f in SearchSpace.FIELDS}


def _with(defaults: Iterable, base_value) -> tuple:
    return tuple(sorted(set(defaults) | {base_value}))


def choice_of(spec: Spec) -> Choice:
    """The point a spec sits at."""
    warps = WarpChoice(spec.compute_warps, spec.producer_warps)
    return Choice(spec.tile.block_m, spec.tile.block_n, warps, spec.smem.stages, swizzle_token(spec.smem.swizzle),
                  spec.smem.q_in_registers)


def default_space(base: Spec) -> SearchSpace:
    """The default space around `base`: its own values plus the usual alternatives.

    Producer/consumer splits are tried only when the base uses warp roles; the swizzle is the
    base's or none.
    """
    at = choice_of(base)
    warps = {WarpChoice(w) for w in DEFAULT_COMPUTE_WARPS}
    if base.producer_warps:
        warps |= {WarpChoice(c, p) for p, c in DEFAULT_ROLE_PAIRS}
    warps.add(at.warps)
    return SearchSpace(
        block_m=_with(DEFAULT_BLOCK_M, at.block_m),
        block_n=_with(DEFAULT_BLOCK_N, at.block_n),
        warps=tuple(sorted(warps, key=lambda w: (w.producer > 0, w.producer, w.compute))),
        stages=_with(DEFAULT_STAGES, at.stages),
        swizzle=tuple(dict.fromkeys((at.swizzle, "none"))),
        q_in_registers=(False, True),
    )


def shape_of(case: Case) -> Shape:
    return case.batch, case.heads, case.seqlen, case.head_dim


def parse_cases(shapes: str, base: Spec, causal: str) -> list[Case]:
    """--shapes and --causal as cases in the base's dtype; a shape must have the base's head_dim and
    the base must emit the mask variants asked for."""
    causals = CAUSAL_CHOICES[causal]
    for c in causals:
        mask = "causal" if c else "none"
        if mask not in base.masks:
            raise ValueError(f"the base spec {base.name} has no {mask!r} variant (masks {list(base.masks)}); "
                             f"choose --causal {'no' if c else 'yes'}")
    cases = []
    for text in shapes.split(","):
        shape = parse_shape(text.strip())
        if shape[3] != base.head_dim:
            raise ValueError(f"shape {text.strip()} has head_dim {shape[3]}, the base spec {base.name} "
                             f"{base.head_dim}")
        cases += [Case(*shape, base.dtype, c) for c in causals]
    return cases
