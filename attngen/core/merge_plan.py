"""What every merge kind shares: the Params of a merge of partial attention results (N parts, each
an output and its natural-log LSE, laid out as the forward writes them), the element forms of its
functions, and its plan. The merge call (attngen/runtime/calls/merge.py) and each merge kind read
these; none of it names a kind.

A part is attention over a subset of the keys (a ring step, a KV-cache shard, a chunk of a long
prompt): its output O_i normalised over its own keys, and LSE_i = log sum exp of its scores. The
merge is O = sum_i exp(LSE_i - LSE) O_i with LSE = logsumexp_i LSE_i. A part with LSE -inf saw no
key: its weight is 0 and its output is never read; a row where every part is -inf gets O = 0 and
LSE -inf (FlashAttention's answer where no key exists)."""
from __future__ import annotations

from dataclasses import dataclass

from .abi import Abi, array, float_pointer, int32, pointer
from .forward_plan import ForwardPlan, stride_fields

MAX_PARTS = 16          # most parts one launch may take (the spec's max_parts; Params hold that many pointers)
ELEM, FP32 = "elem", "fp32"

# The functions of a merge spec: (function key, parts' element type, output's element type), elem
# being the spec's dtype. fp32 parts are what a ring keeps between steps; an fp32 output is a round of
# a merge of more parts than one launch takes (and a ring's running partial). Every spec has all four.
FORMS: tuple[tuple[str, str, str], ...] = (
    ("none", ELEM, ELEM),
    ("fp32_parts", FP32, ELEM),
    ("fp32_out", ELEM, FP32),
    ("fp32", FP32, FP32),
)
MASK = "none"           # a merge applies no mask: the dispatch table keys its entries `mask: none`


def form_key(parts_fp32: bool, out_fp32: bool) -> str:
    """The function key of a merge of parts (fp32 or the spec's dtype) into an output (likewise)."""
    want = (FP32 if parts_fp32 else ELEM, FP32 if out_fp32 else ELEM)
    return next(key for key, parts, out in FORMS if (parts, out) == want)


def merge_abi(max_parts: int) -> Abi:
    """The Params of a merge of at most `max_parts` parts: the output and its LSE, then per part a
    pointer and strides (each part may be laid out on its own, as a forward call takes its inputs)."""
    return Abi("Params", (
        pointer("o", "merged output (batch, heads, seqlen, head_dim), any strides, last dim contiguous", const=False),
        float_pointer("lse", "fp32 (batch, heads, seqlen) natural-log LSE of the merged rows, contiguous"),
        array("part_o", "const void*", 8, max_parts, "each part's output, shaped like o (null past num_parts)"),
        array("part_lse", "const float*", 8, max_parts, "each part's fp32 LSE (batch, heads, seqlen), rows contiguous"),
        *stride_fields("o", "o"),
        array("part_o_strides", "long long", 8, 3 * max_parts,
              "part i's output strides at 3i: batch, head, row (elements)"),
        array("part_lse_strides", "long long", 8, 2 * max_parts, "part i's LSE strides at 2i: batch, head (elements)"),
        int32("batch", "batch size"),
        int32("heads", "heads"),
        int32("seqlen", "rows per head"),
        int32("num_parts", "parts this launch merges, 1 to max_parts"),
    ))


@dataclass(frozen=True, kw_only=True)
class MergeFragments:
    rows_per_block: int     # output rows per block, a warp each
    pairs_per_lane: int     # column pairs a lane merges: columns 2 x lane + 64 j of the row
    max_parts: int          # parts one launch merges at most


@dataclass(frozen=True)
class MergePlan(ForwardPlan):
    """The plan of a merge spec: the forward plan's names (explain, compile and the runtime read them),
    one row per warp, no shared memory, and the element forms of its functions."""

    max_parts: int = 8

    def key_mask(self, key: str) -> str:
        return MASK

    def form_types(self, key: str) -> tuple[str, str]:
        """The C++ element types (parts, output) of the function of `key`."""
        ctype = {ELEM: self.ctype, FP32: "float"}
        _, parts, out = next(f for f in FORMS if f[0] == key)
        return ctype[parts], ctype[out]


def max_parts_of(plan) -> int:
    """The most parts a launch of `plan` takes (a full plan or a launch record: its Params say)."""
    return next(f.array for f in plan.abi.fields if f.name == "part_o")


__all__ = ["ELEM", "FORMS", "FP32", "MASK", "MAX_PARTS", "MergeFragments", "MergePlan", "form_key", "max_parts_of",
           "merge_abi"]
