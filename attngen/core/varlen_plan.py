"""Varlen sequences, for the forward kinds whose kernels read q, k, v and o through Params
pointers: every sequence's rows lie back to back, (total, heads, head_dim), and cu_seqlens_q/k
(int32, batch + 1) give where each sequence begins. A spec with `varlen: true` emits one more
kernel function per mask; its block narrows a copy of Params to its sequence (first rows, lengths,
the mask's per-sequence fields) and then runs the kind's attention() unchanged. This module names
no kind."""
from __future__ import annotations

from .abi import int32, int_pointer
from .function_keys import KeySuffix
from .input_errors import ERRORS_FIELD

VARLEN = KeySuffix("_varlen")   # function key (and name) suffix of a mask's varlen function

VARLEN_ABI_FIELDS = (
    int_pointer("cu_seqlens_q", "int32 (batch + 1,): varlen calls, first row of each sequence in q and o, then the "
            "total; null in padded calls", optional=True),
    int_pointer("cu_seqlens_k", "int32 (batch + 1,): varlen calls, first row of each sequence in k and v", optional=True),
    int_pointer("seq_order", "varlen calls: int32 (batch,), the sequence blockIdx.z computes: longest first, so "
                "the longest blocks do not form the tail of the grid; null: blockIdx.z", optional=True),
    int32("total_q", "varlen calls: rows of q and o; offsets are clamped to [0, total_q], never read past", default=0),
    int32("total_k", "varlen calls: rows of k and v; offsets are clamped to [0, total_k]", default=0),
    ERRORS_FIELD,
)


varlen_key = VARLEN.key      # the function key of a mask's varlen kernel function
is_varlen = VARLEN.has
mask_of = VARLEN.mask        # the mask a function key runs: the key itself, or a varlen key without its suffix
