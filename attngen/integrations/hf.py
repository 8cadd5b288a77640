"""attngen for Hugging Face transformers: `attn_implementation="attngen"`.

    import attngen.integrations.hf
    attngen.integrations.hf.register()       # the name, in AttentionInterface and AttentionMaskInterface
    model = AutoModelForCausalLM.from_config(config, attn_implementation="attngen")

`attention` receives what transformers hands a FlashAttention implementation: q (B, Hq, Sq, D), k and
v (B, Hkv, Sk, D), the mask FlashAttention's mask function makes (None, or a 2D padding mask), and the
keywords scaling, sliding_window (a window of that many keys, the token's own included, applied when
Sk exceeds it, as transformers' FlashAttention path does), softcap, s_aux (gpt-oss's learned sinks),
is_causal, dropout, position_ids and cu_seq_lens_q/k with max_length_q/k. It returns
((B, Sq, Hq, Dv), None).

- No mask: attngen.attention (causal bottom-right aligned, FlashAttention's convention with a cache).
- Packed sequences (batch 1, position_ids restarting, or cu_seq_lens_*): attngen.attention_varlen.
- A padding mask with Sq == Sk: the valid tokens packed, attngen.attention_varlen, scattered back.
- dropout > 0 is refused (attngen has no attention dropout).
- What attngen does not serve (fp32, a head dim or variant without a table entry, a gradient no
  backward spec serves, a 4D mask, a padding mask with a cache) runs a plain torch attention here,
  with one log warning per reason; `STATS` counts each path.
"""
from __future__ import annotations

import collections
import logging

NAME = "attngen"
STATS: collections.Counter = collections.Counter()   # "attngen", "attngen varlen", "reference: <reason>" -> calls
_LOG = logging.getLogger("attngen")
_WARNED: set = set()


def register(name: str = NAME) -> str:
    """Register `name` with transformers' AttentionInterface (this module's `attention`) and its
    AttentionMaskInterface (FlashAttention's mask: None, or the 2D padding mask). Idempotent."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    except ImportError as exc:
        raise ImportError("attn_implementation='attngen' needs transformers with AttentionInterface and "
                          f"AttentionMaskInterface (5.x): {exc}") from None
    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, flash_attention_mask)
    return name


def attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, sliding_window=None,
              softcap=None, is_causal=None, s_aux=None, **kwargs):
    """transformers' attention function for attngen (see the module's docstring)."""
    if dropout:
        raise ValueError(f"attn_implementation='attngen' has no attention dropout (got dropout={dropout}): set the "
                         "config's attention_dropout to 0.0, call model.eval(), or train with "
                         "attn_implementation='sdpa' or 'eager'")
    import torch
    from ..errors import ToolError
    from ..ops import attention as dense, attention_varlen
    refusals = (LookupError, NotImplementedError, TypeError, ValueError, ToolError)

    sinks = s_aux if s_aux is not None else kwargs.get("sinks")
    causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    batch, heads, seqlen_q, _ = query.shape
    seqlen_k = key.shape[2]
    window = (sliding_window - 1, sliding_window - 1) if sliding_window and seqlen_k > sliding_window else None
    call = dict(causal=causal, alignment="bottom_right" if causal or window is not None else None, scale=scaling,
                window=window, softcap=softcap, sinks=None if sinks is None else sinks.float())
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))      # (B, S, H, D) views

    reason = None
    if not query.is_cuda or query.dtype not in (torch.float16, torch.bfloat16):
        reason = f"{query.dtype} on {query.device}"
    elif attention_mask is not None and attention_mask.dim() != 2:
        reason = "a 4D attention mask"
    elif attention_mask is not None and seqlen_q != seqlen_k:
        reason = "a padding mask with a cache"
    segments = _segments(torch, attention_mask, kwargs, batch, seqlen_q, seqlen_k) if reason is None else None

    if reason is None:
        try:
            if attention_mask is not None:
                out = _unpadded(torch, attention_varlen, q, k, v, attention_mask.bool(), call)
                STATS["attngen varlen"] += 1
            elif segments is not None:
                cu_q, cu_k, max_q, max_k = segments
                out = attention_varlen(q.reshape(-1, heads, q.shape[-1]), k.reshape(-1, k.shape[2], k.shape[-1]),
                                       v.reshape(-1, v.shape[2], v.shape[-1]), cu_q, cu_k, max_q, max_k, **call)
                out = out.view(batch, seqlen_q, heads, out.shape[-1])
                STATS["attngen varlen"] += 1
            else:
                out = dense(q, k, v, layout="bshd", **call)
                STATS["attngen"] += 1
            return out, None
        except refusals as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__

    key_ = reason.split(":")[0]
    STATS["reference: " + key_] += 1
    if key_ not in _WARNED:
        _WARNED.add(key_)
        _LOG.warning("attngen does not serve this attention call (%s): it runs a plain torch attention instead "
                     "(slower, memory quadratic in the sequence)", reason)
    keep = _keep(torch, attention_mask, segments, batch, seqlen_q, seqlen_k, query.device)
    return reference(torch, query, key, value, keep=keep, **call), None


def _segments(torch, attention_mask, kwargs, batch, seqlen_q, seqlen_k):
    """(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) of packed sequences, or None: given as
    cu_seq_lens_q/k, or read from position_ids that restart within one row (batch 1)."""
    if attention_mask is not None:
        return None
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None and cu_k is not None:
        max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
        max_q = int(max_q) if max_q is not None else int((cu_q[1:] - cu_q[:-1]).max())
        max_k = int(max_k) if max_k is not None else int((cu_k[1:] - cu_k[:-1]).max())
        return cu_q.int(), cu_k.int(), max_q, max_k
    position_ids = kwargs.get("position_ids")
    if position_ids is None or batch != 1 or seqlen_q != seqlen_k or seqlen_q < 2:
        return None
    positions = position_ids.reshape(-1)
    if positions.numel() != seqlen_q or not bool((positions[1:] - positions[:-1] != 1).any()):
        return None
    starts = (positions == positions.min()).nonzero().flatten().int()
    cu = torch.cat([starts, starts.new_tensor([seqlen_q])])
    longest = int((cu[1:] - cu[:-1]).max())
    return cu, cu, longest, longest


def _unpadded(torch, attention_varlen, q, k, v, valid, call):
    """Attention of the valid tokens of (B, S, H, D) tensors packed back to back, scattered back to
    (B, S, H, Dv) with zeros at the padding (FlashAttention's unpadded path)."""
    batch, seqlen = valid.shape
    lengths = valid.sum(1, dtype=torch.int32)
    cu = torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
    index = valid.flatten().nonzero().flatten()
    longest = int(lengths.max())
    rows = [t.reshape(batch * seqlen, t.shape[2], t.shape[3]).index_select(0, index) for t in (q, k, v)]
    out = attention_varlen(*rows, cu, cu, longest, longest, **call)
    full = out.new_zeros(batch * seqlen, out.shape[1], out.shape[2]).index_copy(0, index, out)
    return full.view(batch, seqlen, out.shape[1], out.shape[2])


def _keep(torch, attention_mask, segments, batch, seqlen_q, seqlen_k, device):
    """The keys each query may see beyond causality and the window, (B or 1, 1, Sq, Sk) bool, or a
    float bias for a 4D float mask; None when there is no such restriction."""
    if attention_mask is not None:
        if attention_mask.dim() == 4:
            return attention_mask
        return attention_mask.bool()[:, None, None, -seqlen_k:]
    if segments is not None:
        cu_q, cu_k = segments[0].long(), segments[1].long()
        ids_q = torch.bucketize(torch.arange(seqlen_q, device=device), cu_q[1:], right=True)
        ids_k = torch.bucketize(torch.arange(seqlen_k, device=device), cu_k[1:], right=True)
        return (ids_q[:, None] == ids_k[None, :])[None, None]
    return None


def reference(torch, query, key, value, *, causal=False, alignment=None, scale=None, window=None, softcap=None,
              sinks=None, keep=None):
    """softmax(scale q k^T) v in fp32 scores, with the same options as attngen's calls (causal and the
    window bottom-right aligned), keep (a bool mask of visible keys, or a float bias) and sinks (a
    logit per head that joins each row's denominator). (B, H, S, D) in; (B, Sq, H, Dv) out."""
    heads, seqlen_q, seqlen_k = query.shape[1], query.shape[2], key.shape[2]
    if key.shape[1] != heads:
        key, value = (t.repeat_interleave(heads // t.shape[1], dim=1) for t in (key, value))
    scores = torch.matmul(query.float(), key.float().transpose(-1, -2)) * (query.shape[-1] ** -0.5 if scale is None
                                                                            else scale)
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    if keep is not None and keep.dtype != torch.bool:
        scores = scores + keep.float()
        keep = None
    row = torch.arange(seqlen_q, device=query.device)[:, None] + (seqlen_k - seqlen_q)
    col = torch.arange(seqlen_k, device=query.device)[None, :]
    visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=query.device)
    if causal:
        visible &= col <= row
    if window is not None:
        left, right = window
        if left >= 0:
            visible &= col >= row - left
        if right >= 0:
            visible &= col <= row + right
    visible = visible if keep is None else visible & keep
    scores = scores.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        extra = sinks.float().view(1, heads, 1, 1).expand(scores.shape[0], heads, seqlen_q, 1)
        scores = torch.cat([scores, extra], dim=-1)
    probs = torch.softmax(scores, dim=-1)
    if sinks is not None:
        probs = probs[..., :-1]
    probs = probs.nan_to_num(0.0)          # a row that sees no key (and no sink): zeros
    return torch.matmul(probs.to(value.dtype), value).transpose(1, 2).contiguous()


__all__ = ["NAME", "STATS", "attention", "reference", "register"]
