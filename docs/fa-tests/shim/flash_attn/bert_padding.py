"""unpad_input / pad_input as FlashAttention 2.8's flash_attn.bert_padding documents them, in plain
torch (this stand-in's own code). Both keep gradients: unpad gathers rows, pad scatters them."""
from __future__ import annotations

import torch


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """hidden_states (batch, seqlen, ...), attention_mask (batch, seqlen) bool/int (1: a token),
    unused_mask (batch, seqlen) (1: allocated but unused; selected too).

    Returns (hidden_states (total_nnz, ...) of the selected tokens in order, indices (total_nnz,) of
    those tokens in the flattened (batch * seqlen) input, cu_seqlens int32 (batch + 1,), the longest
    sequence's length (int), seqused int32 (batch,): the tokens attention_mask alone selects)."""
    keep = attention_mask.bool() if unused_mask is None else attention_mask.bool() | unused_mask.bool()
    batch, seqlen = keep.shape
    lengths = keep.to(torch.int32).sum(1).to(torch.int32)
    offsets = torch.zeros(batch + 1, dtype=torch.int32, device=keep.device)
    offsets[1:] = lengths.cumsum(0).to(torch.int32)
    positions = torch.arange(batch * seqlen, device=keep.device)[keep.reshape(-1)]
    rows = hidden_states.reshape((batch * seqlen,) + tuple(hidden_states.shape[2:])).index_select(0, positions)
    used = attention_mask.bool().to(torch.int32).sum(1).to(torch.int32)
    return rows, positions, offsets, int(lengths.max().item()) if batch else 0, used


def pad_input(hidden_states, indices, batch, seqlen):
    """hidden_states (total_nnz, ...), indices (total_nnz,) into the flattened (batch * seqlen)
    output: returns (batch, seqlen, ...) with those rows set and every other row zero."""
    out = hidden_states.new_zeros((batch * seqlen, *hidden_states.shape[1:]))
    out = out.index_copy(0, indices, hidden_states)
    return out.reshape(batch, seqlen, *hidden_states.shape[1:])
