"""apply_rotary_emb in plain torch (this stand-in's own code), with FlashAttention's documented
arguments: the kvcache test builds its reference with it, so it must rotate exactly as the
documentation says, not call attngen."""
from __future__ import annotations

import torch


def _rotate(x, cos, sin, interleaved: bool):
    """x (..., rotary_dim) fp32, cos / sin (..., rotary_dim / 2) fp32 broadcast over x's heads."""
    if interleaved:         # GPT-J: pairs (2i, 2i + 1)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)
    half = x.shape[-1] // 2     # GPT-NeoX: pairs (i, i + rotary_dim / 2)
    x0, x1 = x[..., :half], x[..., half:]
    return torch.cat((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)


def _table(cos, sin, positions):
    """cos / sin rows at `positions` (any shape, int64); a position past the table reads cos 1, sin 0
    (no rotation), as FlashAttention's kernel masks it."""
    seqlen_ro = cos.shape[0]
    inside = (positions >= 0) & (positions < seqlen_ro)
    at = positions.clamp(0, max(seqlen_ro - 1, 0))
    c = torch.where(inside[..., None], cos.float()[at], torch.ones((), device=cos.device))
    s = torch.where(inside[..., None], sin.float()[at], torch.zeros((), device=sin.device))
    return c, s


def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0, cu_seqlens=None,
                     max_seqlen=None):
    """x (batch, seqlen, nheads, headdim), or (total_seqlen, nheads, headdim) with cu_seqlens (batch + 1,);
    cos, sin (seqlen_ro, rotary_dim / 2). Rotates the first rotary_dim columns of each head; token t of
    sequence b sits at position t + seqlen_offsets (an int, or (batch,) per sequence). interleaved: GPT-J
    pairs (2i, 2i + 1), else GPT-NeoX pairs (i, i + rotary_dim / 2). Returns the rotated tensor (x itself,
    written, with inplace). Computed in fp32, stored in x's dtype."""
    rotary_dim = 2 * cos.shape[-1]
    if rotary_dim > x.shape[-1]:
        raise ValueError(f"rotary_dim {rotary_dim} exceeds headdim {x.shape[-1]}")
    device = x.device
    if cu_seqlens is None:
        batch, seqlen = x.shape[0], x.shape[1]
        positions = torch.arange(seqlen, device=device).expand(batch, seqlen)
        if isinstance(seqlen_offsets, torch.Tensor):
            positions = positions + seqlen_offsets.to(device=device, dtype=torch.long).reshape(batch, 1)
        else:
            positions = positions + int(seqlen_offsets)
        c, s = _table(cos, sin, positions)          # (batch, seqlen, rotary_dim / 2)
        c, s = c[:, :, None, :], s[:, :, None, :]   # over the heads
    else:
        total = x.shape[0]
        starts = cu_seqlens.to(device=device, dtype=torch.long)
        rows = torch.arange(total, device=device)
        seq = torch.searchsorted(starts[1:], rows, right=True)     # each row's sequence
        positions = rows - starts[seq]
        if isinstance(seqlen_offsets, torch.Tensor):
            positions = positions + seqlen_offsets.to(device=device, dtype=torch.long)[seq]
        else:
            positions = positions + int(seqlen_offsets)
        c, s = _table(cos, sin, positions)          # (total, rotary_dim / 2)
        c, s = c[:, None, :], s[:, None, :]
    rotated = _rotate(x[..., :rotary_dim].float(), c, s, interleaved).to(x.dtype)
    if inplace:
        x[..., :rotary_dim] = rotated
        return x
    return torch.cat((rotated, x[..., rotary_dim:]), dim=-1)


apply_rotary_emb_func = apply_rotary_emb
