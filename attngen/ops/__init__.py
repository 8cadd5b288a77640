"""attngen as a library: one call per convention, each served by the committed dispatch table's
kernel for the GPU, dtype, head dim, mask and sequence length at hand.

    import attngen
    o = attngen.attention(q, k, v, causal=True)                      # (B, H, S, D) fp16 / bf16
    o = attngen.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    o = attngen.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, block_table=table)
    o = attngen.attention_fp8(q8, k8, v_t8, q_descale=qd, k_descale=kd, v_descale=vd)   # e4m3, bf16 out
    o, lse = attngen.merge_attention(o_a, lse_a, o_b, lse_b)        # two parts' results over split keys

Eager calls go straight to the kernel (a few microseconds of host time); under torch.compile
they go through the torch ops attngen::attention, ... (library.py), which trace without a graph
break. attention() on tensors that need gradients goes through attngen::attention_train (with
variants, attngen::attention_variant_train), attention_varlen() through
attngen::attention_varlen_train when traced, and eagerly through the same forward and backward as
a torch.autograd.Function (library.train; attention(): library.train_attention, both directions
prepared once per shape); their backward runs the dispatch table's backward spec. Decode is
forward only: a call on tensors that need gradients is refused rather than returning an output
autograd cannot differentiate. A head dim the table serves no kernel of runs at the smallest served
head dim above it, q, k and v zero-padded (library._pad; docs/dispatch.md).
"""
from __future__ import annotations

__all__ = ["attention", "attention_fp8", "attention_varlen", "attention_with_kvcache", "merge_attention",
           "merge_attention_list"]

_bound = None   # (is_compiling, is_grad_enabled, torch.ops.attngen, library), bound on the first call


def _bind():
    """torch and the ops, bound once (this package imports without torch, for `attngen check`)."""
    global _bound
    import torch
    from . import library
    _bound = (torch.compiler.is_compiling, torch.is_grad_enabled, torch.ops.attngen, library)
    return _bound


def _refuse_grad(what: str) -> None:
    raise NotImplementedError(f"attngen has no backward for {what} yet (attngen.attention has one where the "
                              "dispatch table lists a backward spec: `attngen dispatch --call backward`): call it "
                              "under torch.no_grad() / torch.inference_mode(), or on tensors that do not require grad")


def attention(q, k, v, *, causal: bool = False, alignment: str | None = None, scale: float | None = None,
              layout: str = "bhsd", return_lse: bool = False, window=None, softcap: float | None = None,
              alibi_slopes=None, deterministic: bool = False, sinks=None):
    """softmax(scale q k^T) v for q (B, Hq, Sq, D) and k, v (B, Hkv, Sk, D) ("bshd": (B, S, H, D)).

    causal: query i sees keys j <= i ("top_left", torch's is_causal) or j <= i + Sk - Sq
    ("bottom_right", FlashAttention's); GQA/MQA when Hq is a multiple of Hkv; scale defaults to
    1/sqrt(D). Returns o like q, or (o, lse) with lse fp32 (B, Hq, Sq), natural log.

    Variants (served by the table's specs that carry them): window=(left, right), FlashAttention's
    window_size (-1: an open side; causal closes the right side at 0; the offset follows
    `alignment`); softcap=cap: cap * tanh(scale * s / cap); alibi_slopes: fp32 (Hq,) or (B, Hq),
    -slope * |i + Sk - Sq - j| added to the scaled score; sinks: fp32 (Hq,) learned logits (gpt-oss),
    head h's joins every row's softmax denominator as a key with no value, and gets its gradient.

    deterministic: the backward of this call (on tensors that need gradients) gives the same dq bit
    for bit every time, at the cost of its key blocks taking turns (dk and dv always repeat).
    """
    compiling, grad, ops, library = _bound or _bind()
    if window is not None or softcap is not None or alibi_slopes is not None or sinks is not None:
        if grad() and (q.requires_grad or k.requires_grad or v.requires_grad or
                       (sinks is not None and sinks.requires_grad)):
            # as below, through the differentiable variant op
            if compiling():
                o, lse = ops.attention_variant_train(q, k, v, causal, alignment, scale, layout,
                                                     None if window is None else list(window), softcap, alibi_slopes,
                                                     deterministic, *(() if sinks is None else (sinks,)))
            else:   # prepared once per shape, as below
                o, lse = library.train_attention(q, k, v, causal, alignment, scale, layout, deterministic, window,
                                                 softcap, alibi_slopes, sinks)
            return (o, lse) if return_lse else o
        if compiling():
            o, lse = ops.attention_variant(q, k, v, causal, alignment, scale, layout,
                                           None if window is None else list(window), softcap, alibi_slopes, sinks)
            return (o, lse) if return_lse else o
        return library.forward_variant(q, k, v, causal, alignment, scale, layout, return_lse, window, softcap,
                                       alibi_slopes, sinks)
    if grad() and (q.requires_grad or k.requires_grad or v.requires_grad):
        # traced by torch.compile: the differentiable op (its backward is registered); eager: the
        # same forward and backward without the op's dispatch, prepared once per shape
        # (library.train_attention: a new shape first makes sure a backward spec serves it)
        if compiling():
            o, lse = ops.attention_train(q, k, v, causal, alignment, scale, layout, deterministic)
        else:
            o, lse = library.train_attention(q, k, v, causal, alignment, scale, layout, deterministic)
        return (o, lse) if return_lse else o
    if compiling():
        o, lse = ops.attention(q, k, v, causal, alignment, scale, layout)
        return (o, lse) if return_lse else o
    return library.forward(q, k, v, causal, alignment, scale, layout, return_lse)


def attention_fp8(q, k, v_t, *, q_descale=None, k_descale=None, v_descale=None, causal: bool = False,
                  alignment: str | None = None, scale: float | None = None, layout: str = "bhsd",
                  return_lse: bool = False):
    """Attention of e4m3 inputs: q (B, Hq, Sq, D) and k (B, Hkv, Sk, D) float8_e4m3fn ("bshd": (B, S,
    H, D)), v_t V transposed, (B, Hkv, D, Sk) with keys contiguous, and FlashAttention-3's descales,
    fp32 (B, Hkv) or None. Returns o bf16 like q, or (o, lse). `quantize_fp8(q, k, v)` makes all of it
    (attngen.runtime.calls.forward_fp8). Forward only: e4m3 tensors carry no gradients."""
    compiling, _grad, ops, library = _bound or _bind()
    if compiling():
        o, lse = ops.attention_fp8(q, k, v_t, q_descale, k_descale, v_descale, causal, alignment, scale, layout)
        return (o, lse) if return_lse else o
    return library.forward_fp8(q, k, v_t, q_descale, k_descale, v_descale, causal, alignment, scale, layout,
                               return_lse)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k=None, max_seqlen_q: int | None = None,
                     max_seqlen_k: int | None = None, *, causal: bool = False, alignment: str | None = None,
                     scale: float | None = None, return_lse: bool = False, deterministic: bool = False, window=None,
                     softcap: float | None = None, alibi_slopes=None, sinks=None, block_table=None, seqused_k=None):
    """Attention of varlen sequences: q (total_q, Hq, D), k and v (total_k, Hkv, D), cu_seqlens_q/k
    int32 (batch + 1) offsets on the GPU; v may have a head dim of its own (DeepSeek MLA: 192 / 128),
    which keys the table too. max_seqlen_q/k (ints, as FlashAttention takes them) size
    the grid and pick the kernel; without them nothing is read back either (the grid covers every
    row). causal alignment "bottom_right" is FlashAttention's varlen convention. Returns o like q
    (with V's head dim), or (o, lse) with lse fp32 (Hq, total_q). On tensors that need gradients the call is
    differentiable (the table's varlen backward spec); deterministic as in attention().

    Variants as in attention(), per sequence (a window's bottom_right alignment and ALiBi's offset
    use each sequence's own lengths; (B, Hq) slopes are per sequence): window, softcap, alibi_slopes,
    sinks; differentiable where the table has a varlen backward for the call's mask and score
    modifiers (`attngen dispatch --call varlen_backward --window`, ...; learned sinks take the varlen
    backward of their mask and get their own gradient).

    Paged K/V (FlashAttention's block_table= and seqused_k=, forward only): k and v are page pools
    (num_pages, page_size, Hkv, D), page_size a power of two from 1 to 512 (a decode pool (num_pages, Hkv,
    page_size, D) serves as pool.transpose(1, 2)); block_table int32 (batch, max_pages); seqused_k int32
    (batch,) the keys of each sequence (then cu_seqlens_k may be None). Masks none, causal and window
    ("bottom_right": each sequence's queries are the last of its keys, so prefill chunks and single decode
    tokens share a call), with softcap, alibi_slopes and sinks (gpt-oss and Gemma 2 serving); docs/varlen.md,
    "Paged K/V". A step of one query per sequence (max_seqlen_q 1 and total_q == batch: a decode step) without
    a window runs the paged decode kernel, which reads each KV head's keys once for all its query heads
    (with score modifiers, where a paged decode kernel runs them at the head dim).
    """
    compiling, grad, ops, library = _bound or _bind()
    if block_table is not None:
        if grad() and (q.requires_grad or k.requires_grad or v.requires_grad or
                       (sinks is not None and sinks.requires_grad)):
            _refuse_grad("attention_varlen with block_table (paged K/V, a serving call)")
        if compiling():     # one op for torch.compile: the decode-row split and its launches inside it
            o, lse = ops.attention_varlen_paged(q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, seqused_k,
                                                max_seqlen_q, max_seqlen_k, causal, alignment, scale,
                                                None if window is None else list(window), softcap, alibi_slopes,
                                                sinks)
            return (o, lse) if return_lse else o
        return library.paged_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, seqused_k, max_seqlen_q,
                                    max_seqlen_k, causal, alignment, scale, return_lse, window, softcap,
                                    alibi_slopes, sinks)
    if seqused_k is not None:
        raise ValueError("seqused_k is read with block_table (paged K/V) only so far; packed K/V take each "
                         "sequence's keys from cu_seqlens_k")
    if cu_seqlens_k is None:
        raise ValueError("cu_seqlens_k is needed without block_table (packed K/V): int32 (batch + 1) offsets")
    if window is not None or softcap is not None or alibi_slopes is not None or sinks is not None:
        window = None if window is None else list(window)
        if grad() and (q.requires_grad or k.requires_grad or v.requires_grad or
                       (sinks is not None and sinks.requires_grad)):
            # as attention()'s variants: the differentiable varlen variant op (compiling), or first the
            # table's varlen backward for the call's mask and scores, then the eager training call
            args = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, alignment, scale, window,
                    softcap, alibi_slopes, deterministic) + (() if sinks is None else (sinks,))
            if compiling():
                o, lse = ops.attention_varlen_variant_train(*args)
            else:
                library.varlen_backward_kernel(q, k, causal, max_seqlen_k, v, window, softcap, alibi_slopes)
                o, lse = library.train("attention_varlen_variant", *args)
            return (o, lse) if return_lse else o
        if compiling():
            o, lse = ops.attention_varlen_variant(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                  causal, alignment, scale, window, softcap, alibi_slopes, sinks)
            return (o, lse) if return_lse else o
        return library.varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, alignment,
                              scale, return_lse, window, softcap, alibi_slopes, sinks)
    if grad() and (q.requires_grad or k.requires_grad or v.requires_grad):
        args = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, alignment, scale, deterministic)
        if compiling():
            o, lse = ops.attention_varlen_train(*args)
        else:   # as in attention()
            library.varlen_backward_kernel(q, k, causal, max_seqlen_k, v)
            o, lse = library.train("attention_varlen", *args)
        return (o, lse) if return_lse else o
    if compiling():
        o, lse = ops.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                                      alignment, scale)
        return (o, lse) if return_lse else o
    return library.varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, alignment, scale,
                          return_lse)


def attention_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, *,
                           cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                           rotary_interleaved: bool = True, causal: bool = False, scale: float | None = None,
                           num_splits: int | None = None, layout: str = "bhsd", return_lse: bool = False, window=None,
                           softcap: float | None = None, alibi_slopes=None, sinks=None, k_scale=None, v_scale=None):
    """Decode: q (B, Hq, Sq, D) new tokens against a KV cache (B, Hkv, capacity, D), or pools of
    pages (num_pages, Hkv, page_size, D) through block_table (int32 (B, max_pages)); page_size is any
    power of two from 1 to 512, read by one kernel per cell (a kernel parameter, checked here).
    cache_seqlens (int32 (B,), on the GPU): keys per sequence, new tokens included. causal: token t
    sees keys up to len - Sq + t. Never waits for the GPU, so a step can be captured in a CUDA graph
    and replayed after the lengths change. Returns o like q, or (o, lse).

    Variants (served by the table's decode specs that carry them), as flash_attn_with_kvcache takes
    them: window=(left, right) from each new token's own position (-1: an open side; causal closes
    the right side at 0; only the window's keys are read), softcap=cap, alibi_slopes fp32 (Hq,) or
    (B, Hq) with each sequence's length as Sk, sinks fp32 (Hq,): learned logits (gpt-oss), head h's
    joins every row's softmax denominator as a key with no value (forward only: no gradient).

    Appending new tokens, as flash_attn_with_kvcache (served by the table's decode_append entries, one
    launch; a head dim without one runs padded, the caches copied and written back: docs/decode.md): k and v, the new tokens, (B, Hkv, Snew, D) (layout "bshd": (B, Snew, Hkv, D), as
    FlashAttention), 1 <= Snew <= Sq, go into the cache at keys cache_seqlens[b] .. cache_seqlens[b] +
    Snew - 1 (pages through block_table) and are attended with the cache; cache_seqlens then counts the
    keys before them. rotary_cos / rotary_sin ((seqlen_ro >= capacity, rotary_dim / 2), q's dtype)
    rotate k at those positions and q at cache_seqlens + t with causal or a window, else at
    cache_seqlens; rotary_interleaved: dims (2i, 2i + 1) pair (GPT-J), else (i, i + rotary_dim / 2)
    (GPT-NeoX). cache_batch_idx (int32 (B,)): the cache row of each sequence; cache_leftpad (int32 (B,)):
    keys before it are not attended (both contiguous caches only). The cache tensors are written in
    place; no host sync, so the step can be captured in a CUDA graph. Eager only so far (under
    torch.compile a NotImplementedError).

    One latent cache (multi-head latent attention, DeepSeek V2/V3 with the up-projections absorbed): q of
    576 columns (512 latent + 64 rotary), k_cache (B, 1, capacity, 576) or pages (num_pages, 1, page_size, 576)
    ("bshd": (B, capacity, 1, 576), FlashMLA's layout), and v_cache = k_cache[..., :512], the same tensor:
    each key's value is its own row's first 512 columns, read once. The output has 512 columns. Served by
    the table's head_dim 576 / head_dim_v 512 decode entries (masks none and causal; pass scale=, e.g.
    1 / sqrt(192) for DeepSeek, since the default is 1 / sqrt(576)).

    e4m3 KV cache: k_cache and v_cache torch.float8_e4m3fn (q fp16 or bf16; the output is q's dtype), with
    k_scale and v_scale as vLLM passes them (dequantised value = e4m3 x scale): a number, a one-element
    fp32 tensor, or fp32 (Hkv,) per KV head; None is 1. Served by the table's decode_kv_e4m3 entries
    (head dims 64, 128, 256; masks none and causal; eager calls, not yet under torch.compile; no append)."""
    compiling, grad, ops, library = _bound or _bind()
    if _is_e4m3(k_cache) or _is_e4m3(v_cache) or k_scale is not None or v_scale is not None:
        if window is not None or softcap is not None or alibi_slopes is not None or sinks is not None:
            raise ValueError("an e4m3 KV cache is served without window, softcap, alibi_slopes or sinks (decode_kv_e4m3 "
                             "specs apply none); pass a fp16/bf16 cache for them")
        if k is not None or v is not None or rotary_cos is not None or cache_batch_idx is not None or \
                cache_leftpad is not None:
            raise ValueError("an e4m3 KV cache takes no new tokens (k, v, rotary_cos / rotary_sin, cache_batch_idx, "
                             "cache_leftpad): quantise and write them into the cache, then call without them")
        if compiling():
            raise NotImplementedError("attention_with_kvcache on an e4m3 KV cache has no torch op yet: call it "
                                      "outside torch.compile (e.g. under torch.compiler.disable)")
        if grad() and q.requires_grad:
            _refuse_grad("decode")
        return library.kvcache_e4m3(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits, layout,
                                    return_lse, k_scale, v_scale)
    if k is not None or v is not None or rotary_cos is not None or rotary_sin is not None or \
            cache_batch_idx is not None or cache_leftpad is not None:
        if compiling():
            raise NotImplementedError("attention_with_kvcache with k, v, rotary_cos, rotary_sin, cache_batch_idx or "
                                      "cache_leftpad writes the cache in place and has no torch op yet: call it "
                                      "outside torch.compile (torch.compiler.disable) or in a CUDA graph")
        if grad() and (q.requires_grad or (k is not None and k.requires_grad) or (v is not None and v.requires_grad)):
            _refuse_grad("decode")
        return library.kvcache_append(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                                      cache_batch_idx, cache_leftpad, block_table, rotary_interleaved, causal, scale,
                                      num_splits, layout, return_lse, window, softcap, alibi_slopes, sinks)
    if window is not None or softcap is not None or alibi_slopes is not None or sinks is not None:
        if compiling():
            o, lse = ops.attention_with_kvcache_variant(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale,
                                                        num_splits, layout, None if window is None else list(window),
                                                        softcap, alibi_slopes, sinks)
            return (o, lse) if return_lse else o
        if grad() and (q.requires_grad or (sinks is not None and sinks.requires_grad)):
            _refuse_grad("decode")
        return library.kvcache_variant(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits,
                                       layout, return_lse, window, softcap, alibi_slopes, sinks)
    if compiling():
        o, lse = ops.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale,
                                            num_splits, layout)
        return (o, lse) if return_lse else o
    if grad() and q.requires_grad:
        _refuse_grad("decode")
    return library.kvcache(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits, layout,
                           return_lse)


def _is_e4m3(t) -> bool:
    """t is a tensor of torch.float8_e4m3fn (read by name: this module imports no torch)."""
    return str(getattr(t, "dtype", "")) == "torch.float8_e4m3fn"


def merge_attention_list(outs, lses, *, layout: str = "bhsd", out_dtype=None):
    """Merge partial attention results: part i is attention of the same queries over a subset of the
    keys, its output outs[i] ((B, H, S, D), "bshd": (B, S, H, D)) and its natural-log LSE lses[i], fp32
    (B, H, S) in either layout, as attention(..., return_lse=True) returns them. Returns (out, lse): out
    = sum_i exp(lse_i - lse) outs[i], lse = logsumexp_i lse_i, so parts over disjoint key sets merge
    into attention over their union. A part with LSE -inf saw no key: it weighs 0 and its output is not
    read; a row where every part is -inf is 0 with LSE -inf.

    The parts share one shape, dtype (float16, bfloat16 or float32: a ring's running partial) and GPU,
    each with its own strides (last dim contiguous, 16-byte rows). out_dtype: the output's (the parts'
    by default; float32, or float16 / bfloat16 for float32 parts); a new contiguous tensor. Any number
    of parts: one launch takes up to the spec's max_parts (8), more are merged in rounds through fp32.
    Forward only (no gradient)."""
    compiling, grad, ops, library = _bound or _bind()
    if compiling():
        return ops.merge_attention(list(outs), list(lses), layout, out_dtype)
    if grad() and any(getattr(t, "requires_grad", False) for t in (*outs, *lses)):
        raise NotImplementedError("attngen has no backward for merge_attention: call it under torch.no_grad() / "
                                  "torch.inference_mode(), or on tensors that do not require grad")
    return library.merge(outs, lses, layout, out_dtype)


def merge_attention(out_a, lse_a, out_b, lse_b, *, layout: str = "bhsd", out_dtype=None):
    """Merge two partial attention results (a ring step's into the running one, say): (out, lse) of
    merge_attention_list([out_a, out_b], [lse_a, lse_b]); see it for the shapes, dtypes and -inf rows."""
    return merge_attention_list([out_a, out_b], [lse_a, lse_b], layout=layout, out_dtype=out_dtype)
