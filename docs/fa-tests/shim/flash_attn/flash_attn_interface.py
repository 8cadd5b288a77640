"""FlashAttention 2's entry points as calls of attngen (a stand-in for running FA's tests; see README.md).

Each function takes FlashAttention 2's arguments in FlashAttention's order and calls attngen with
layout "bshd" and causal alignment "bottom_right" (FlashAttention's conventions):

  flash_attn_func / _kvpacked_func / _qkvpacked_func        -> attngen.attention
  flash_attn_varlen_func / _varlen_kvpacked / _qkvpacked    -> attngen.attention_varlen
  flash_attn_with_kvcache                                   -> attngen.attention_with_kvcache

What attngen has no counterpart for raises NotImplementedError("unsupported: ..."): dropout_p > 0,
reading return_attn_probs's attention probabilities (S_dmask), an argument this stand-in does not
know, and FlashAttention's internal functions (_flash_attn_*, flash_attn_gpu). attngen's own
refusals (LookupError for a cell its dispatch table does not serve, NotImplementedError for a missing
backward) pass through as they are; the runner's plugin counts both as "unsupported".
"""
from __future__ import annotations

import torch

USE_TRITON_ROCM = False     # the test file reads it (skipif of a CUDA-extension-only test)

UNSUPPORTED = "unsupported: "


def _refuse(what: str):
    raise NotImplementedError(UNSUPPORTED + what)


def _attngen():
    import attngen          # on first call: importing the shim needs no attngen (collection)
    return attngen


def _check_unknown(function: str, unknown: dict) -> None:
    if unknown:
        _refuse(f"{function} argument(s) {', '.join(sorted(unknown))} (not mapped to attngen)")


def _no_dropout(dropout_p) -> None:
    if dropout_p is not None and float(dropout_p) > 0.0:
        _refuse("dropout_p > 0 (attngen has no dropout)")


def _window(window_size):
    """FlashAttention's window_size (left, right), ints or a 2-element tensor, to attngen's window:
    None for (-1, -1) (no window); any negative side is -1, an unbounded side, as both take it."""
    if window_size is None:
        return None
    left, right = (int(side) for side in window_size)
    left, right = (-1 if left < 0 else left), (-1 if right < 0 else right)
    return None if (left, right) == (-1, -1) else (left, right)


def _softcap(softcap):
    """FlashAttention's softcap (0.0, or any value <= 0: none) to attngen's (None: none)."""
    return None if softcap is None or float(softcap) <= 0.0 else float(softcap)


class _NoAttnProbs:
    """What return_attn_probs=True returns in S_dmask's place: attngen returns no attention
    probabilities, so any use of it raises NotImplementedError("unsupported: ..."). The tests read
    S_dmask only with dropout_p > 0, which is refused before."""

    why = UNSUPPORTED + "return_attn_probs's S_dmask (attngen returns no attention probabilities)"

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise NotImplementedError(self.why)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(cls.why)

    def _refused(self, *args, **kwargs):
        raise NotImplementedError(self.why)

    __getitem__ = __len__ = __iter__ = __bool__ = __float__ = __int__ = _refused
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _refused
    __ge__ = __gt__ = __le__ = __lt__ = __abs__ = __neg__ = __invert__ = _refused

    def __repr__(self):
        return "<S_dmask: not returned by attngen>"


_S_DMASK = _NoAttnProbs()


def _alignment(causal, window):
    """FlashAttention aligns causal masks and windows bottom-right; attngen takes an alignment only for
    a call that has one of them (ALiBi's offset is FlashAttention's either way)."""
    return "bottom_right" if causal or window is not None else None


def _attention(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
               return_attn_probs):
    _no_dropout(dropout_p)
    window = _window(window_size)
    result = _attngen().attention(
        q, k, v, layout="bshd", causal=bool(causal), alignment=_alignment(causal, window), scale=softmax_scale,
        return_lse=bool(return_attn_probs), window=window, softcap=_softcap(softcap),
        alibi_slopes=alibi_slopes, deterministic=bool(deterministic))
    if return_attn_probs:
        out, lse = result
        return out, lse, _S_DMASK
    return result


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False,
                              **unknown):
    """qkv (batch, seqlen, 3, nheads, headdim) -> out (batch, seqlen, nheads, headdim) [, lse, S_dmask]."""
    _check_unknown("flash_attn_qkvpacked_func", unknown)
    q, k, v = qkv.unbind(dim=2)
    return _attention(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                      return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False, **unknown):
    """q (batch, seqlen_q, nheads, headdim), kv (batch, seqlen_k, 2, nheads_k, headdim)."""
    _check_unknown("flash_attn_kvpacked_func", unknown)
    k, v = kv.unbind(dim=2)
    return _attention(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                      return_attn_probs)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False, **unknown):
    """q (batch, seqlen_q, nheads, headdim), k and v (batch, seqlen_k, nheads_k, headdim)."""
    _check_unknown("flash_attn_func", unknown)
    return _attention(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                      return_attn_probs)


class _ForwardOnly(torch.autograd.Function):
    """A paged varlen output on inputs that need gradients: FlashAttention returns one (its tests read
    the forward only); attngen's paged varlen call is forward only, so the output's backward is
    refused as unsupported when something asks for it."""

    @staticmethod
    def forward(ctx, out, *inputs):
        return out.clone()

    @staticmethod
    def backward(ctx, *grads):
        _refuse("backward of flash_attn_varlen_func with block_table (attngen's paged K/V call is forward only)")


def _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
            window_size, softcap, alibi_slopes, deterministic, return_attn_probs, block_table=None):
    _no_dropout(dropout_p)
    window = _window(window_size)
    kwargs = dict(causal=bool(causal), alignment=_alignment(causal, window), scale=softmax_scale,
                  return_lse=bool(return_attn_probs), deterministic=bool(deterministic), window=window,
                  softcap=_softcap(softcap), alibi_slopes=alibi_slopes, block_table=block_table)
    call = _attngen().attention_varlen
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    if block_table is not None and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        with torch.no_grad():
            result = call(*args, **kwargs)
        out = result[0] if return_attn_probs else result
        out = _ForwardOnly.apply(out, *(t for t in (q, k, v) if t.requires_grad))
        result = (out, result[1]) if return_attn_probs else out
    else:
        result = call(*args, **kwargs)
    if return_attn_probs:
        out, lse = result
        return out, lse, _S_DMASK
    return result


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False, **unknown):
    """qkv (total, 3, nheads, headdim), cu_seqlens int32 (batch + 1,)."""
    _check_unknown("flash_attn_varlen_qkvpacked_func", unknown)
    q, k, v = qkv.unbind(dim=1)
    return _varlen(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale, causal,
                   window_size, softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False, **unknown):
    """q (total_q, nheads, headdim), kv (total_k, 2, nheads_k, headdim)."""
    _check_unknown("flash_attn_varlen_kvpacked_func", unknown)
    k, v = kv.unbind(dim=1)
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
                   window_size, softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, **unknown):
    """q (total_q, nheads, headdim), k and v (total_k, nheads_k, headdim), or with block_table page
    pools (num_blocks, page_block_size, nheads_k, headdim)."""
    _check_unknown("flash_attn_varlen_func", unknown)
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
                   window_size, softcap, alibi_slopes, deterministic, return_attn_probs, block_table)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
                            cache_batch_idx=None, cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0, rotary_interleaved=True,
                            alibi_slopes=None, num_splits=0, return_softmax_lse=False, **unknown):
    """q (batch, seqlen_q, nheads, headdim) against a KV cache (batch_cache, seqlen_cache, nheads_k,
    headdim) or page pools (num_blocks, page_block_size, nheads_k, headdim) with block_table; k, v
    new tokens appended in place. num_splits 0 (FlashAttention's heuristic) is attngen's None."""
    _check_unknown("flash_attn_with_kvcache", unknown)
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32, device=k_cache.device)
    splits = None if num_splits is None or int(num_splits) <= 0 else int(num_splits)
    return _attngen().attention_with_kvcache(
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens=cache_seqlens,
        cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad, block_table=block_table,
        rotary_interleaved=bool(rotary_interleaved), causal=bool(causal), scale=softmax_scale, num_splits=splits,
        layout="bshd", return_lse=bool(return_softmax_lse), window=_window(window_size), softcap=_softcap(softcap),
        alibi_slopes=alibi_slopes)


def _get_block_size_n(device, head_dim, is_dropout, is_causal):
    """The key block size FlashAttention's tests assume when they decode a dropout mask from S_dmask;
    only read with dropout, which attngen refuses, so any plausible value serves."""
    return 128 if head_dim <= 64 and not is_dropout else 64


# FlashAttention's internal functions and its CUDA extension module: the tests that import them test
# FlashAttention's internals, which attngen does not stand in for.
_INTERNALS = ("flash_attn_gpu", "flash_attn_cuda", "flash_attn_2_cuda")


def __getattr__(name):
    if name in _INTERNALS or name.startswith("_flash_attn_"):
        _refuse(f"flash_attn.flash_attn_interface.{name} (FlashAttention's internal API; the stand-in maps only "
                "the public functions)")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
