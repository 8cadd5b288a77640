"""The Params fields of a decode call that appends new tokens to its KV cache (FlashAttention's k=,
v=, rotary_cos=, rotary_sin=, cache_batch_idx=, cache_leftpad=): part of the decode list
(core.decode_plan.DECODE_ABI_FIELDS, last), here on their own so that the decode call convention
(runtime/calls/decode.py) reads their names without importing the planner."""
from __future__ import annotations

from .abi import int32, int64, pointer

# The fields of a call that appends new tokens to the cache (FlashAttention's k=, v=, rotary_cos=, ...):
# only an append plan's Params has them, so every other decode kernel keeps its struct and code.
APPEND_ABI_FIELDS = (
    pointer("k_new", "new keys (batch, kv_heads, seqlen_new, head_dim), any strides, last dim contiguous: written "
            "(rotated) into the cache at each sequence's cache_seqlens and attended"),
    pointer("v_new", "new values, shaped like k_new"),
    int64("k_new_batch_stride", "k_new's batch stride (elements)", default=0),
    int64("k_new_head_stride", "k_new's head stride (elements)", default=0),
    int64("k_new_row_stride", "k_new's token stride (elements)", default=0),
    int64("v_new_batch_stride", "v_new's batch stride (elements)", default=0),
    int64("v_new_head_stride", "v_new's head stride (elements)", default=0),
    int64("v_new_row_stride", "v_new's token stride (elements)", default=0),
    pointer("cache_batch_idx", "int32 (batch,): the cache row of each batch row; null: row b is cache row b",
            optional=True),
    pointer("cache_leftpad", "int32 (batch,): keys before this index of a sequence's cache row are not attended "
            "(contiguous caches); null: 0", optional=True),
    pointer("rotary_cos", "(seqlen_ro, rotary_dim / 2) in the element type: cos of each position's angles; null: no "
            "rotary embedding", optional=True),
    pointer("rotary_sin", "(seqlen_ro, rotary_dim / 2): sin of the same angles", optional=True),
    int32("cache_rows", "rows (batch) of the contiguous k and v caches cache_batch_idx indexes", default=0),
    int32("seqlen_new", "new tokens per sequence (k_new's rows), 1 to seqlen_q", default=0),
    int32("rotary_dim", "leading dims of q and k_new that are rotated (even, <= head_dim; 0: none)", default=0),
    int32("rotary_interleaved", "1: dims (2i, 2i + 1) rotate as a pair (GPT-J); 0: dims i and i + rotary_dim / 2 "
          "(GPT-NeoX)", default=1),
)
APPEND_FIELDS = tuple(f.name for f in APPEND_ABI_FIELDS)

__all__ = ["APPEND_ABI_FIELDS", "APPEND_FIELDS"]
