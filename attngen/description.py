"""A spec's description is free text that lands in every generated header, so it can go stale: a
spec edited from 2 stages to 1 that still says "2-stage". The facts a description commonly states
(tiles, stages, warps, head_dim, shared memory, swizzle, where Q lives, registers, warpgroups) are
read from it here and compared with the plan; `attngen check` reports each one that disagrees."""
from __future__ import annotations

import re


def _number(digits: str) -> int | None:
    """A number the description states; None for one longer than any plan value (a 5000-digit number
    is free text's right, and int() of it would exceed Python's conversion limit)."""
    return int(digits) if len(digits) <= 12 else None


def _facts(plan) -> list[tuple[str, str, object]]:
    """(regex with one or two number groups, what it states, the plan's value) of the checkable facts."""
    spec = plan.spec
    sw = getattr(getattr(spec, "smem", None), "swizzle", None)     # a kind without tiles has no smem key
    xor = getattr(sw, "xor_bits", 0)
    facts = [
        (r"\b(\d+)x(\d+) tiles\b", "tiles", (plan.block_m, plan.block_n)),
        (r"\b(\d+)-key tiles\b", "keys per tile", plan.block_n),
        (r"\b(\d+)[- ]stages?\b", "stages", plan.stages),
        (r"\bstages (\d+)\b", "stages", plan.stages),
        (r"(?<!producer )(?<!consumer )\b(\d+) warps\b", "warps", plan.compute_warps + plan.producer_warps),
        (r"\bhead_dim (\d+)\b", "head_dim", plan.head_dim),
        (r"\b(\d+) KiB\b", "KiB of shared memory", round(plan.smem_bytes / 1024)),
        (r"\bswizzle xor(\d)\b", "xor_bits", xor),
        (r"\b(\d+) group rows\b", "group rows", plan.block_m),
        (r"\b(\d+) producer warps\b", "producer warps", plan.producer_warps),
    ]
    regs = getattr(spec, "registers", None)
    if regs is not None:
        facts.append((r"\b(?:setmaxnreg|registers) (\d+)/(\d+)\b", "registers", (regs.producer, regs.consumer)))
    groups = getattr(plan.fragments, "consumer_warpgroups", None)
    if groups is not None:
        facts.append((r"\b(\d+) consumer warpgroups\b", "consumer warpgroups", groups))
    return facts


def description_drift(plan) -> list[str]:
    """What the spec's description states that its plan does not (empty: nothing checkable is stale)."""
    text = plan.spec.description
    out = []
    for pattern, what, value in _facts(plan):
        for m in re.finditer(pattern, text):
            said = tuple(map(_number, m.groups())) if len(m.groups()) > 1 else _number(m.group(1))
            if said != value:
                shown = "x".join(map(str, value)) if isinstance(value, tuple) else value
                out.append(f"the description says {m.group(0)[:80]!r}, the plan has {shown} ({what})")
    if re.search(r"\bQ in registers\b", text) and not plan.q_in_registers:
        out.append("the description says 'Q in registers', the plan keeps Q in shared memory")
    if re.search(r"\bQ in smem\b", text) and plan.q_in_registers:
        out.append("the description says 'Q in smem', the plan keeps Q in registers")
    if re.search(r"\bXOR-swizzled\b", text) and not plan.swizzle.is_xor:
        out.append("the description says 'XOR-swizzled', the plan has no XOR swizzle")
    return out


__all__ = ["description_drift"]
