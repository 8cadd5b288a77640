"""Which verify module builds a kernel's cases: one per call convention, as core.calls.CALLS names it."""
from __future__ import annotations

from ...core.calls import CALLS
from . import backward, decode, forward, forward_fp8, merge

# Each convention's verify cases (kernel, shapes, masks) -> cases, from the module CALLS names for it.
_ROOMS = {room.__name__: room for room in (forward, decode, backward, forward_fp8, merge)}
CASES = {call.name: _ROOMS[call.verify].verify_cases for call in CALLS}


def convention_of(kernel) -> str:
    """The convention a kernel is called by; a stand-in kernel without a runtime convention class
    goes by its plan's kind."""
    return getattr(kernel, "convention", None) or kernel.plan.kind.calls


def kernel_cases(kernel, shapes, masks) -> list[tuple]:
    """(variant label, function, shape, index, check(seed, label) -> CaseResult) of every case of
    `kernel`, as its convention's verify module builds them."""
    return CASES[convention_of(kernel)](kernel, shapes, masks)
