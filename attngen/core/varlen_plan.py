"""Varlen sequences, for the forward kinds whose kernels read q, k, v and o through Params
pointers: every sequence's rows lie back to back, (total, heads, head_dim), and cu_seqlens_q/k
(int32, batch + 1) give where each sequence begins. A spec with `varlen: true` emits one more
kernel function per mask; its block narrows a copy of Params to its sequence (first rows, lengths,
the mask's per-sequence fields) and then runs the kind's attention() unchanged. This module names
no kind."""
from __future__ import annotations

from .abi import int32, int64, int_pointer
from .function_keys import KeySuffix
from .launch_rules import DETERMINISTIC, GROUP_SPLIT, MAX_PAGE_SIZE
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


def backward_mask_of(key: str) -> str:
    """The mask a backward main function key runs: without its group-split, deterministic and varlen
    suffixes."""
    return mask_of(DETERMINISTIC.mask(GROUP_SPLIT.mask(key)))


# A paged spec's varlen functions (`paged: true`) also read K and V from page pools through a block
# table, as FlashAttention's flash_attn_varlen_func(block_table=, seqused_k=): key j of sequence b lies
# in page block_table[b][j >> page_shift], row j & (page_size - 1) of it. Appended after every other
# field, so that a spec without pages keeps its Params.
PAGED_VARLEN_ABI_FIELDS = (
    int_pointer("block_table", "int32 (batch, table_cols) with row stride table_stride: page ids of each "
                "sequence's keys, in order; null: k and v are packed (total_k, kv_heads, head_dim)", optional=True),
    int_pointer("seqused_k", "int32 (batch,): keys of each sequence (paged calls); null: from cu_seqlens_k",
                optional=True),
    int64("k_page_stride", "paged: elements between pages of the k pool", default=0),
    int64("v_page_stride", "paged: elements between pages of the v pool", default=0),
    int32("table_stride", "elements between rows of block_table", default=0),
    int32("table_cols", "pages per row of block_table: a sequence holds at most table_cols x page_size keys",
          default=0),
    int32("num_pages", "pages in the k and v pools; a page id outside [0, num_pages) is clamped, never read past",
          default=0),
    int32("page_size", "keys per page: a power of two, 1 to 512", default=0),
    int32("page_shift", "log2(page_size)", default=0),
    int32("single_queries_apart", "paged calls: 1 where a serving step's decode rows (sequences of exactly one "
          "query) are the paged decode kernel's, which writes them into the same output (its rows functions): "
          "this kernel leaves them alone; 0: every sequence is this kernel's", default=0),
)
PAGED_VARLEN_FIELDS = tuple(f.name for f in PAGED_VARLEN_ABI_FIELDS)
