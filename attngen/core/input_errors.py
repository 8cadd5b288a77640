"""Input errors a kernel clamps around and records, instead of the call reading them back: the one
list the kernels' flag constants (templates/lib/prelude.j2, input_error_flags) and the host's
messages (attngen.check_errors) both come from. A call that never waits for the GPU cannot refuse
a bad length or offset before launching; the kernel keeps every access inside the tensors, sets
the flag in a per-device word, and the next check_errors() raises with these messages."""
from __future__ import annotations

from typing import NamedTuple

from .abi import pointer


class InputErrorFlag(NamedTuple):
    # A NamedTuple, not a frozen dataclass: a first call defines this class (core.frozen says why).
    bit: int
    cpp: str            # the kernel's constant
    message: str        # what the caller passed, and what the kernel did instead


INPUT_ERRORS = (
    InputErrorFlag(1, "kBadSeqlen", "a cache_seqlens entry was outside [0, capacity] (with appended tokens: its new "
                                    "tokens did not fit, or a cache_leftpad or cache_batch_idx entry was out of range); "
                                    "the kernel clamped it"),
    InputErrorFlag(2, "kBadPage", "a block_table entry of a sequence's pages was outside [0, num_pages); the "
                                  "kernel read the nearest page of the pool instead"),
    InputErrorFlag(4, "kBadOffsets", "cu_seqlens offsets were negative, decreasing or past the varlen tensors; the "
                                     "kernel clamped them"),
    InputErrorFlag(8, "kShortGrid", "a query sequence was longer than max_seqlen_q; its rows past the grid "
                                    "(max_seqlen_q rounded up to whole query blocks) were not computed"),
)

ERRORS_FIELD = pointer("errors", "int32 word of input-error flags (core/input_errors.py) the kernel sets with "
                                 "atomicOr where it clamped a bad length, page id or offset; null: not recorded",
                       const=False, optional=True)


def messages(flags: int) -> list[str]:
    return [e.message for e in INPUT_ERRORS if flags & e.bit]
