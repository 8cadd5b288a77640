"""attngen's torch ops: attngen::attention, attngen::attention_variant (window, softcap, ALiBi),
attngen::attention_varlen, attngen::attention_varlen_paged (its block_table form, a serving step's
decode-row split inside it), attngen::attention_with_kvcache, attngen::attention_with_kvcache_variant and
attngen::attention_fp8 (e4m3 inputs) and attngen::merge_attention (partial results by their LSE), each a torch.library op over the dispatcher, with a fake
(meta) implementation that gives the real output shapes and strides, so torch.compile traces
through a call without a graph break and CUDA graphs capture it. attngen::attention_train is
attngen::attention with a backward (register_autograd: it saves q, k, v, o and lse, and
attngen::attention_backward runs the table's backward spec), attngen::attention_variant_train and
attngen::attention_varlen_train the same for attngen::attention_variant and attngen::attention_varlen;
traced calls on tensors that need gradients take them, the others the plain ops, whose host time an
autograd registration would raise (measured: docs/performance.md, "Backward"). Eager calls on GPU
tensors that need gradients take train() (attention(): train_attention, prepared once per shape, but
for sinks joined after the kernel): the same forward and backward as a torch.autograd.Function, without the dispatcher's round
trips. The decode ops are forward only.

Importing this module registers the ops (it needs torch)."""
from __future__ import annotations

import math
import threading
import warnings

import torch

from ..core.calls import ATTENTION
from ..core.variants import SCORES, call_mask, window_keys
from ..runtime.calls.shared import call_key, variant_key
from ..runtime import native as _native
from ..runtime.gpu import persistent
from ..runtime.kernel import LOAD_BYTES
from .dispatch import DISPATCH
from .table import window_stands_in


def _heads_seq(q, layout: str) -> tuple[int, int, int]:
    return (q.shape[0], q.shape[1], q.shape[2]) if layout == "bhsd" else (q.shape[0], q.shape[2], q.shape[1])


# -- head dims the table does not serve --------------------------------------------------------------
# A call of a head dim with no kernel (59, 111, 224, ...) runs at the smallest head dim above it that
# the table serves (DISPATCH.padded_dims): q, k and v zero-padded in their last dim, which adds 0
# to every score and gives zero output columns past the call's, then the output cut back (a copy, with
# the strides the unpadded call would give) and the scale taken from the call's own head dim. A V of
# a head dim of its own pads on its own (96/64 runs at 128/64, 256/128 at 256/256). The padding is a
# copy of q, k and v (of the whole cache, for decode) per call.

def _pad(t, to: int):
    """t zero-padded in its last (head) dim to `to` columns (t itself where it has them: a pair of head
    dims may pad V alone)."""
    return t if t.shape[-1] == to else torch.nn.functional.pad(t, (0, to - t.shape[-1]))


def _cut_gradients(grads, d: int, dv: int):
    """A padded backward's (dq, dk, dv): dq and dk cut to q's head dim d, dv to V's."""
    dq, dk, dv_ = grads
    return dq[..., :d].contiguous(), dk[..., :d].contiguous(), dv_[..., :dv].contiguous()


def _check_head_dims(d: int, **tensors) -> None:
    """ValueError naming the first tensor whose last dim is not q's head dim `d` (None: not given):
    a padded call checks what the kernel call at the padded head dim could no longer see."""
    for name, t in tensors.items():
        if t is not None and t.shape[-1] != d:
            raise ValueError(f"{name} has head dim {t.shape[-1]}, q {d}: they must match (got {name} of shape "
                             f"{tuple(t.shape)})")


def _cut(result, d: int, return_lse: bool):
    """A padded call's output, its first d columns (V's head dim; lse as it is)."""
    if return_lse:
        o, lse = result
        return o[..., :d].contiguous(), lse
    return result[..., :d].contiguous()


def _scale(scale, d: int) -> float:
    """The call's scale: given, or 1 / sqrt of its own head dim (not the padded one)."""
    return scale if scale is not None else 1.0 / math.sqrt(d)


_SINKS_APART = object()   # a cached "kernel" that says: run without the sinks, then join_sinks


def join_sinks(out, lse, sinks, rows: str, merge: bool = False):
    """Learned sinks joined to attention computed without them: a sink is a key with no value, so it
    adds exp(sink) to its row's softmax denominator and nothing to the numerator. The output with it
    is the output without it times exp(lse - lse'), lse' = log(exp(lse) + exp(sink)) (a row that saw no
    key keeps 0 and gets lse' = sink). `rows`: how out's rows line up with lse's, "bhsd" (out (B, H,
    S, D), lse (B, H, S)), "bshd" (out (B, S, H, D)) or "packed" (varlen's out (T, H, D), lse (H,
    T)). out is this call's own: scaled in place, in fp32, rounded once. Returns (out, lse').

    merge: as a merge with a part of zeros whose LSE is the sink, one launch of the table's merge kernel
    (where it has one for the dtype and head dim): decode's few rows take it (on the H200, B8 32/8
    d128 softcap: 5.7 us over the call without sinks, the torch ops below 15.6), while a prefill's
    output runs faster through the torch ops (8x16x1024x64: 49 us over the call, the merge kernel 71)."""
    parts, lses = (out.unsqueeze(0), lse.unsqueeze(0)) if rows == "packed" else (out, lse)
    index, d = out.get_device(), out.shape[-1]
    # the checks a sink kernel makes: fp32, one logit per query head, on the call's GPU
    SCORES["sink"].fill(sinks, 1.0, {"heads": lses.shape[1], "device": index})
    key = (index, out.dtype, d)
    zero = _ZERO_ROW.get(key)
    # (a zero row first needed while a CUDA graph is captured could not be made: its memset would not run
    # until the graph replays; one made before, as by torch.compile's warm-up run, serves the capture)
    if merge and index >= 0 and (zero is not None or not torch.cuda.is_current_stream_capturing()) \
            and DISPATCH.serves("merge", index, out.dtype, d, "none"):
        if zero is None:   # kept for the process: made outside the calling thread's memory pool
            zero = _ZERO_ROW[key] = persistent(lambda: torch.zeros((1, 1, 1, d), dtype=out.dtype, device=out.device),
                                               index)
        sink_lse = sinks.float().reshape(1, -1, 1).expand(lses.shape).contiguous()
        _, joined = _merge_kernel(out, None)([parts, zero.expand(parts.shape)], [lses, sink_lse],
                                             layout="bhsd" if rows == "bhsd" else "bshd", out=parts)
        return out, joined[0] if rows == "packed" else joined
    joined = torch.logaddexp(lse, sinks.float().reshape(-1, 1))
    factor = torch.exp(lse - joined).nan_to_num_(0.0)   # nan: a row with no key and a sink of -inf
    if rows == "bshd":
        factor = factor.transpose(1, 2)
    elif rows == "packed":
        factor = factor.t()
    out.mul_(factor.unsqueeze(-1))
    return out, joined


_ZERO_ROW: dict = {}    # (device, dtype, head dim) -> a row of zeros, join_sinks' part for the sinks


def _joined(result, sinks, rows: str, return_lse: bool, merge: bool = False):
    """A call run with return_lse and without its sinks, the sinks joined (join_sinks); o or (o, lse)."""
    out, lse = join_sinks(*result, sinks, rows, merge)
    return (out, lse) if return_lse else out


_FORWARD: dict = {}     # (device, dtype, head_dim, causal, seqlen_k, V head_dim, query rows, one-row route) -> kernel


class OneRowDecode:
    """attention() of a few query rows per head (ROUTE_MAX_SEQLEN_Q) with no mask or causal aligned bottom-right (a
    decode step as torch SDPA and transformers make it, or a speculative step's drafts) as the decode call on a full
    cache: the forward's kernels tile 64-128 query rows per block and read each KV head's keys once per query head,
    where the decode kernels read them once for the head's group and split the keys across SMs (H200, bf16, 32/8
    heads, d128: B1 at 16k keys 194 against 24.5 us, B8 at 4k 101 against 34; docs/decode-h200/one_row/). Forward's
    call signature; the decode call keys its own kernel by the call's heads, cache and rows. Eager tensors that need
    gradients keep the forward's kernels. Inside a torch.compile graph no tensor says so, and a training step's
    forward of these rows takes the route: its output and LSE follow the forward's conventions (the backward reads
    them); the step keeps its Python node (native_forward)."""

    def __init__(self):
        self._made = threading.local()   # the decode kernel and prepared call of this thread's last call

    def __call__(self, q, k, v, *, causal, alignment, scale, layout, return_lse):
        causal = _route_causal(causal, q, layout)
        result = kvcache(q, k, v, None, None, causal, scale, None, layout, return_lse)
        kernel = _DECODE.get(_kvcache_key(q, k, v, None, causal, layout))
        self._made.last = None if kernel is None else (
            kernel, kernel.full_cache_prepared(q, k, v, scale, return_lse, layout, causal))
        return result

    def prepared(self, key):
        """What forward() keeps for the call just made on this thread (its _PREPARED entry: the decode kernel and
        its prepared call), or None."""
        made, self._made.last = getattr(self._made, "last", None), None
        return made if made is not None and made[1] is not None else None

    @staticmethod
    def run_prepared(made, q, k, v, return_lse):
        return made[0].run_full_cache(made[1], q, k, v, return_lse)

    @staticmethod
    def native_forward(made, q, k, v, o):
        return None     # a training step that adopted the route's prepared call keeps its Python node


ONE_ROW_DECODE = OneRowDecode()


def _route_causal(causal: bool, q, layout: str) -> bool:
    """The decode call's causal for a routed call: one row aligned bottom-right sees every key, so the full-mask
    kernel serves it (one launch fewer where the causal kernel splits); a few rows are the decode call's causal (each
    new token sees the keys up to its own position)."""
    return causal and q.shape[2 if layout == "bhsd" else 1] > 1


# The most query rows per head the route takes: a decode step's one, or speculative decoding's few drafts (no mask,
# or causal bottom-right: each row sees the keys up to its own position, as the decode call's causal); forward_variant's
# route takes one row. A module name so a measurement can turn the route off (0).
ROUTE_MAX_SEQLEN_Q = ATTENTION.one_row_max_rows
_PREPARED: dict = {}    # runtime call_key of a call made before -> (its kernel, the kernel's prepared call)


def forward(q, k, v, causal, alignment, scale, layout, return_lse):
    """The eager forward call: a shape seen before goes straight to its kernel's prepared call
    (one key, one dict get: the table lookup and the kernel's own key are not made again);
    otherwise the table's kernel for this shape, then the kernel call."""
    try:
        key = call_key(q, k, v, causal, alignment, scale, return_lse, layout)
        hit = _PREPARED.get(key)
    except (AttributeError, TypeError):
        key = hit = None
    if hit is not None:
        result = hit[0].run_prepared(hit[1], q, k, v, return_lse)
        if result is not None:
            return result
    bhsd = layout == "bhsd"
    seqlen_q, seqlen_k = (q.shape[2], k.shape[2]) if bhsd else (q.shape[1], k.shape[1])
    short = (q.get_device(), q.dtype, q.shape[-1], causal, seqlen_k, v.shape[-1], q.shape[0] * q.shape[1] * q.shape[2],
             # the route's mask, where it may take the call: 1 every key (a row of its own, or no mask), 2 causal rows
             ((2 if causal and seqlen_q > 1 else 1) if seqlen_q <= ROUTE_MAX_SEQLEN_Q and seqlen_q <= seqlen_k
              and (alignment == "bottom_right" if causal else alignment is None)   # else the kernel's own refusal
              and not (q.requires_grad or k.requires_grad or v.requires_grad) else 0))
    kernel = _FORWARD.get(short)
    if kernel is None:
        if short[0] < 0:
            raise ValueError(f"q is on {q.device}; attngen needs CUDA tensors (e.g. q.cuda())")
        pad = DISPATCH.padded_dims("forward", short[0], q.dtype, short[2], short[5], "causal" if causal else "none")
        if pad:
            return _cut(forward(_pad(q, pad[0]), _pad(k, pad[0]), _pad(v, pad[1]), causal, alignment,
                                _scale(scale, short[2]), layout, return_lse), short[5], return_lse)
        if short[7] and short[5] == short[2] and DISPATCH.serves(ATTENTION.one_row_call, short[0], q.dtype, short[2],
                                                                 ("none", "causal")[short[7] - 1]):
            kernel = ONE_ROW_DECODE
        else:
            kernel = DISPATCH.kernel("forward", short[0], q.dtype, short[2], "causal" if causal else "none", short[4],
                                     head_dim_v=short[5] if short[5] != short[2] else 0, rows=short[6])
        if len(_FORWARD) >= 4096:
            _FORWARD.clear()
        _FORWARD[short] = kernel
    result = kernel(q, k, v, causal=causal, alignment=alignment, scale=scale, layout=layout, return_lse=return_lse)
    _keep_prepared(_PREPARED, key, kernel, kernel.prepared(key) if key is not None else None)
    return result


def _keep_prepared(cache: dict, key, kernel, prepared) -> None:
    """cache[key] = (kernel, prepared) where the kernel made a prepared call (the cache emptied first at 4096)."""
    if prepared is None:
        return
    if len(cache) >= 4096:
        cache.clear()
    cache[key] = (kernel, prepared)


_VARIANT: dict = {}     # (device, dtype, head_dim, mask, scores, seqlen_k, V head_dim, query rows) -> kernel


def call_scores(softcap, alibi_slopes, sinks=None) -> str:
    """The score modifiers a call asks for, as the dispatch table keys them ("softcap+alibi", ...)."""
    given = {"softcap": softcap, "alibi_slopes": alibi_slopes, "sinks": sinks}
    return "+".join(s.name for s in SCORES.values() if given.get(s.argument) is not None)


def _variant_kernel_key(q, k, v, causal, layout, window, softcap, alibi_slopes, sinks, alignment=None) -> tuple:
    """forward_variant's key of the table's kernel for a call (_VARIANT); its last field: whether the one-row route
    may take it (a decode step's one query row that sees the keys a decode call's new token sees: bottom-right
    aligned, or neither causal nor a window; no gradient)."""
    mask = call_mask(causal, window)
    bhsd = layout == "bhsd"
    seqlen_q, seqlen_k = (q.shape[2], k.shape[2]) if bhsd else (q.shape[1], k.shape[1])
    return (q.get_device(), q.dtype, q.shape[-1], mask, call_scores(softcap, alibi_slopes, sinks), seqlen_k,
            v.shape[-1], q.shape[0] * q.shape[1] * q.shape[2], window_keys(causal, window) if mask == "window" else None,
            seqlen_q == 1 <= ROUTE_MAX_SEQLEN_Q and seqlen_q <= seqlen_k   # one row (ROUTE_MAX_SEQLEN_Q 0: no route)
            and (alignment is None if mask == "none" else alignment == "bottom_right")   # else the kernel's refusal
            and not _needs_grad(q, k, v, alibi_slopes, sinks))


class OneRowDecodeVariant(OneRowDecode):
    """OneRowDecode for forward_variant's calls: the decode call with the call's window (from the row's own position,
    bottom-right, as the decode call counts it), softcap, ALiBi (the decode call's offset is the same: Sk - Sq) and
    sinks (joined as the decode call joins them where no kernel of the others takes them: then no prepared call).
    forward_variant keeps the decode kernel's prepared call, as forward() keeps OneRowDecode's."""

    def __call__(self, q, k, v, *, causal, alignment, scale, layout, return_lse, window, softcap, alibi_slopes, sinks):
        causal = causal if window is not None else _route_causal(causal, q, layout)
        result = kvcache_variant(q, k, v, None, None, causal, scale, None, layout, return_lse, window, softcap,
                                 alibi_slopes, sinks)
        kernel = _DECODE_VARIANT.get(_kvcache_key(q, k, v, None, call_mask(causal, window),
                                                  call_scores(softcap, alibi_slopes, sinks), layout))
        self._made.last = None if kernel is None or kernel is _SINKS_APART else (
            kernel, kernel.full_cache_prepared(q, k, v, scale, return_lse, layout, causal,
                                               variant_key(window, softcap, alibi_slopes, sinks=sinks)))
        return result


ONE_ROW_DECODE_VARIANT = OneRowDecodeVariant()
# The variants whose one-row calls the route takes, and the work from which it takes them (batch x query heads x the
# keys the row sees); module names so a measurement can change them (then clearing _VARIANT and _PREPARED_VARIANT:
# calls seen before keep the kernel they were given).
ROUTE_VARIANTS = frozenset(ATTENTION.one_row_variants)
ROUTE_VARIANT_MIN_WORK = ATTENTION.one_row_variant_min_work


def _route_takes(mask: str, scores: str, rows: int, keys: int, forward_pads: bool = False) -> bool:
    """Whether the one-row route takes a call of this mask and these score modifiers (ROUTE_VARIANTS) over `rows`
    query rows (batch x heads) that each see `keys` keys: from ROUTE_VARIANT_MIN_WORK on where it has a variant (none:
    a window of two open sides, as forward()'s route, whatever its work), or whatever its work where the forward would
    run the call padded to another head dim (`forward_pads`: q, k and v copied at every call; H200, d96 B1 32/8 1k
    keys bf16, padded: 30-34 us on the GPU and 90-175 us eager, docs/decode-h200/one_row/variant_cells/)."""
    names = {name for name in scores.split("+") if name} | ({"window"} if mask == "window" else set())   # "": none
    return names <= ROUTE_VARIANTS and (not names or forward_pads or rows * keys >= ROUTE_VARIANT_MIN_WORK)


def _row_keys(seqlen_k: int, window) -> int:
    """The keys one query row aligned bottom-right sees: the window's left side and the row's own key at most."""
    left = None if window is None else window[0]
    return seqlen_k if left is None or left < 0 else min(seqlen_k, left + 1)


def _decode_serves(index: int, dtype, d: int, mask: str, scores: str, paged: bool = False) -> bool:
    """Whether the decode call (paged or contiguous) runs this mask and these score modifiers at head dim d itself: a
    kernel of them, or, for learned sinks no decode kernel of the others holds, one of the others with the sinks
    joined after it (kvcache_variant)."""
    return DISPATCH.serves_joining_sinks(ATTENTION.one_row_call, index, dtype, d, mask, scores, paged)


def forward_variant(q, k, v, causal, alignment, scale, layout, return_lse, window, softcap, alibi_slopes,
                    sinks=None):
    """The eager forward call with variants (window, softcap, ALiBi, sinks): the table's kernel for the
    call's mask and score modifiers, then the kernel call (which keeps its own prepared calls). Sinks
    that no kernel of the other modifiers takes are joined after them (join_sinks). A call seen before goes
    straight to its kernel's prepared call, as forward()'s do (the variants' tensors by address: the prepared call
    reads them there); a window or softcap of a type a key cannot tell from an accepted one takes the full call."""
    try:
        # the key holds whether a tensor needs gradients: such calls keep the forward's kernels (the one-row route's
        # condition), a training step's forward among them (_PreparedStep.outputs)
        own = call_key(q, k, v, causal, alignment, scale, return_lse, layout,
                       variant_key(window, softcap, alibi_slopes, sinks=sinks)) \
            if _keyable_variants(window, softcap) else None   # the kernel's own key of the call
        key = None if own is None else own + (_needs_grad(q, k, v, alibi_slopes, sinks),)
        hit = _PREPARED_VARIANT.get(key)
    except (AttributeError, TypeError):
        own = key = hit = None
    if hit is not None:
        result = hit[0].run_prepared(hit[1], q, k, v, return_lse)
        if result is not None:
            return result
    short = _variant_kernel_key(q, k, v, causal, layout, window, softcap, alibi_slopes, sinks, alignment)
    mask, scores = short[3], short[4]
    kernel = _VARIANT.get(short)
    if kernel is None:
        if short[0] < 0:
            raise ValueError(f"q is on {q.device}; attngen needs CUDA tensors (e.g. q.cuda())")
        pad = DISPATCH.padded_dims("forward", short[0], q.dtype, short[2], short[6], mask, scores)   # None: as it is
        if (short[9] and short[6] == short[2]   # one row: a causal one sees every key
                and _decode_serves(short[0], q.dtype, short[2], "none" if mask == "causal" else mask, scores)
                and _route_takes(mask, scores, short[7], _row_keys(short[5], window), pad is not None)):
            kernel = ONE_ROW_DECODE_VARIANT
        elif sinks is not None and DISPATCH.sinks_apart("forward", short[0], q.dtype, short[2], short[6], mask, scores):
            kernel = _SINKS_APART
        else:
            if pad:
                return _cut(forward_variant(_pad(q, pad[0]), _pad(k, pad[0]), _pad(v, pad[1]), causal, alignment,
                                            _scale(scale, short[2]), layout, return_lse, window, softcap,
                                            alibi_slopes, sinks), short[6], return_lse)
            kernel = DISPATCH.kernel("forward", short[0], q.dtype, short[2], mask, short[5],
                                     head_dim_v=short[6] if short[6] != short[2] else 0, scores=scores,
                                     rows=short[7], window=short[8])
        if len(_VARIANT) >= 4096:
            _VARIANT.clear()
        _VARIANT[short] = kernel
    if kernel is _SINKS_APART:
        return _joined(forward_variant(q, k, v, causal, alignment, scale, layout, True, window, softcap, alibi_slopes),
                       sinks, layout, return_lse)
    result = kernel(q, k, v, causal=causal, alignment=alignment, scale=scale, layout=layout, return_lse=return_lse,
                    window=None if window is None else tuple(window), softcap=softcap, alibi_slopes=alibi_slopes,
                    sinks=sinks)
    _keep_prepared(_PREPARED_VARIANT, key, kernel, kernel.prepared(own) if key is not None else None)
    return result


_PREPARED_VARIANT: dict = {}   # forward_variant's _PREPARED: call_key with the call's variant_key -> (kernel, prepared)


def _needs_grad(q, k, v, alibi_slopes, sinks) -> bool:
    """Whether a variant call's tensors need a gradient (the one-row route's condition): q, k, v, and the ALiBi slopes
    and sinks where given."""
    return (q.requires_grad or k.requires_grad or v.requires_grad
            or (alibi_slopes is not None and alibi_slopes.requires_grad) or (sinks is not None and sinks.requires_grad))


def sink_gradient(dout, out, lse, sinks, layout):
    """d loss / d sinks: head h's sink takes weight P = exp(sink - LSE) in each row, and its logit's
    gradient is -P * (dO . O) (a key with no value: its dP is 0, and the softmax's row term is
    dO . O). Summed over batch and rows, fp32 like the sinks."""
    rows = (dout.float() * out.float()).sum(-1)            # (B, H, S), or (B, S, H) for bshd
    if layout == "bshd":
        rows = rows.transpose(1, 2)
    weight = torch.exp(sinks.float().reshape(1, -1, 1) - lse)
    return -(weight * rows).sum(dim=(0, 2))


def sink_gradient_from_delta(delta, lse, sinks):
    """sink_gradient from the backward's delta (rowsum(dO * O) of every row, fp32 (B, H, S) like lse,
    the preprocess kernel's): the same sum, without a pass of its own over dO and O. The LSE holds the
    sink, so sink - LSE <= 0 and the weights are at most 1."""
    weight = torch.sub(sinks.reshape(1, -1, 1), lse).exp_()
    return weight.mul_(delta).sum(dim=(0, 2)).neg_()


def varlen_sink_gradient(dout, out, lse, sinks):
    """sink_gradient for varlen tensors: dout and out (total_q, H, Dv), lse (H, total_q)."""
    rows = (dout.float() * out.float()).sum(-1).t()         # (H, total_q)
    weight = torch.exp(sinks.float().reshape(-1, 1) - lse)
    return -(weight * rows).sum(dim=1)


def varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, alignment, scale, return_lse,
           window=None, softcap=None, alibi_slopes=None, sinks=None):
    """The eager varlen forward: the table's varlen kernel for the call's mask and score modifiers
    (window, softcap, ALiBi, sinks; each sequence against its own keys), then its varlen call. Sinks
    that no kernel of the other modifiers takes are joined after them (join_sinks)."""
    index = q.get_device()
    if index < 0:
        raise ValueError(f"q is on {q.device}; attngen needs CUDA tensors (e.g. q.cuda())")
    d, dv = q.shape[-1], v.shape[-1]        # V's head dim keys the entries where it differs (0: q's)
    mask, scores = call_mask(causal, window), call_scores(softcap, alibi_slopes, sinks)
    if sinks is not None and DISPATCH.sinks_apart("varlen", index, q.dtype, d, dv, mask, scores, paged=False):
        return _joined(varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, alignment, scale,
                              True, window, softcap, alibi_slopes), sinks, "packed", return_lse)
    pad = DISPATCH.padded_dims("varlen", index, q.dtype, d, dv, mask, scores, paged=False)
    if pad:
        return _cut(varlen(_pad(q, pad[0]), _pad(k, pad[0]), _pad(v, pad[1]), cu_seqlens_q, cu_seqlens_k,
                           max_seqlen_q, max_seqlen_k, causal, alignment, _scale(scale, d), return_lse, window,
                           softcap, alibi_slopes, sinks), dv, return_lse)
    kernel = DISPATCH.kernel("varlen", index, q.dtype, d, mask, max_seqlen_k if max_seqlen_k is not None else k.shape[0],
                             head_dim_v=_head_dim_v(q, v), scores=scores)
    return kernel.varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=max_seqlen_q, causal=causal,
                         alignment=alignment, scale=scale, return_lse=return_lse,
                         window=None if window is None else tuple(window), softcap=softcap,
                         alibi_slopes=alibi_slopes, sinks=sinks)


def paged_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, seqused_k, max_seqlen_q, max_seqlen_k, causal,
                 alignment, scale, return_lse, window=None, softcap=None, alibi_slopes=None, sinks=None):
    """The eager paged varlen forward: the table's paged varlen kernel (an entry with paged: true) for the
    call's mask (window: the window function) and score modifiers (softcap, ALiBi, sinks), then its varlen
    call through block_table. k is a page pool (num_pages, page_size, Hkv, D); the bucket's seqlen is
    max_seqlen_k, else a sequence's capacity (max_pages x page_size). A call whose window bounds a side
    keeps its decode rows in the varlen kernel (so does one whose score modifiers no paged decode kernel
    runs at its head dim)."""
    index = q.get_device()
    if index < 0:
        raise ValueError(f"q is on {q.device}; attngen needs CUDA tensors (e.g. q.cuda())")
    if k.dim() != 4:
        raise ValueError(f"with block_table, k and v are page pools (num_pages, page_size, kv_heads, head_dim) "
                         f"(got k of shape {tuple(k.shape)})")
    d, dv = q.shape[-1], v.shape[-1]
    mask, scores = call_mask(causal, window), call_scores(softcap, alibi_slopes, sinks)
    pad = DISPATCH.padded_dims("varlen", index, q.dtype, d, dv, mask, scores, paged=True)
    if pad:
        _check_head_dims(d, k=k)     # padding would hide a mismatch the kernel call refuses
        # No paged varlen kernel of this head dim: q and the page pools zero-padded to the next that has
        # one, as a padded paged decode pads its cache (the pools are copied, every call: docs/varlen.md)
        return _cut(paged_varlen(_pad(q, pad[0]), _pad(k, pad[0]), _pad(v, pad[1]), cu_seqlens_q, cu_seqlens_k,
                                 block_table, seqused_k, max_seqlen_q, max_seqlen_k, causal, alignment,
                                 _scale(scale, d), return_lse, window, softcap, alibi_slopes, sinks), dv, return_lse)
    split = mask != "window" and not _no_decode_rows(q, block_table, max_seqlen_q) and \
        _splits_decode_rows(q, cu_seqlens_q, cu_seqlens_k, block_table, seqused_k, causal, alignment, d, dv, scores)
    variants = (softcap, alibi_slopes, sinks) if scores else None
    if split and max_seqlen_q == 1:
        # Every sequence has at most one query (a decode step): the decode kernel alone.
        return _mixed_step(None, q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, seqused_k, max_seqlen_q, causal,
                           alignment, scale, return_lse, variants)
    capacity = block_table.shape[-1] * k.shape[1] if getattr(block_table, "dim", lambda: 0)() == 2 else k.shape[1]
    kernel = DISPATCH.kernel("varlen", index, q.dtype, d, mask, max_seqlen_k if max_seqlen_k is not None else capacity,
                             paged=True, head_dim_v=_head_dim_v(q, v), scores=scores, page=k.shape[1])
    if split and block_table.shape[0] >= 2:     # one sequence of several queries: nothing to split
        return _mixed_step(kernel, q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, seqused_k, max_seqlen_q, causal,
                           alignment, scale, return_lse, variants)
    return kernel.varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=max_seqlen_q, causal=causal,
                         alignment=alignment, scale=scale, return_lse=return_lse, block_table=block_table,
                         seqused_k=seqused_k, window=None if window is None else tuple(window), softcap=softcap,
                         alibi_slopes=alibi_slopes, sinks=sinks)


def _no_decode_rows(q, block_table, max_seqlen_q) -> bool:
    """Whether a paged varlen call's query rows show, on the host, that no sequence is a decode row: q holds
    batch x max_seqlen_q rows with max_seqlen_q >= 2, so (no sequence above max_seqlen_q, FlashAttention's contract)
    every sequence within q's rows has max_seqlen_q queries. Such a step (a prefill of equal chunks) has nothing to
    split, and skips the split's torch ops and decode launch. Where q holds rows past cu_seqlens_q's last offset, a
    single-query sequence may hide among them; it then stays in the varlen kernel, which serves it too (as it does
    under a window)."""
    return (isinstance(max_seqlen_q, int) and max_seqlen_q >= 2 and getattr(block_table, "dim", lambda: 0)() == 2
            and q.shape[0] == block_table.shape[0] * max_seqlen_q)


def _splits_decode_rows(q, cu_seqlens_q, cu_seqlens_k, block_table, seqused_k, causal, alignment, d: int,
                        dv: int, scores: str = "") -> bool:
    """Whether a paged varlen call sends its single-query sequences (decode rows) to the paged decode
    kernel: causal bottom-right or none, V of q's head dim, offsets and lengths well formed (int32 on q's
    GPU; anything else takes the varlen call, which names the problem), and a paged decode cell of the
    call's score modifiers in the table at this dtype and head dim itself (a padded one would copy the
    whole page pools per call; sinks may be joined after a decode kernel of the others, as the decode
    call joins them)."""
    index = q.get_device()

    def int32_vector(t, n: int) -> bool:
        return (isinstance(t, torch.Tensor) and t.dtype == torch.int32 and t.dim() == 1 and t.shape[0] == n
                and t.get_device() == index)

    if not (isinstance(block_table, torch.Tensor) and block_table.dim() == 2 and q.dim() == 3 and q.shape[0] >= 1):
        return False
    batch = block_table.shape[0]
    lengths = seqused_k if seqused_k is not None else cu_seqlens_k
    return (dv == d and (not causal or alignment in (None, "bottom_right")) and int32_vector(cu_seqlens_q, batch + 1)
            and int32_vector(lengths, batch if seqused_k is not None else batch + 1)
            and _decode_serves(index, q.dtype, d, "none", scores, paged=True))


def _mixed_step(kernel, q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, seqused_k, max_seqlen_q, causal, alignment,
                scale, return_lse, variants=None):
    """A serving step of prefill chunks and single decode tokens, as two launches that split the work by
    sequence on the GPU (nothing read back, so a CUDA graph captures it): the paged decode kernel takes
    each sequence's first query over its keys where the sequence has one query (the others get 0 keys,
    so it reads nothing for them), and the varlen kernel (`kernel`; None: a step with no sequence of
    more than one query) the rest, the single-query sequences given 0 keys. The decode rows are then
    copied into the output at their rows. Where a decode row takes a block of 64 or 128 query rows of
    one query head in the varlen kernel, the decode kernel packs a KV head's query heads into one block
    and reads its keys once. Offsets past q's rows are clamped (the varlen kernel clamps them too).
    `variants`: (softcap, alibi_slopes, sinks) of a call with score modifiers, which both kernels apply (a
    single query at the end of its keys sees ALiBi's offset and softcap as the varlen kernel's row)."""
    if not return_lse and seqused_k is not None:
        out = _step_in_place(kernel, q, k, v, cu_seqlens_q, block_table, seqused_k, max_seqlen_q, causal, alignment,
                             scale, variants)
        if out is not None:
            return out
    # Each torch op here costs the host several microseconds on every layer of a step: scalars stand in for
    # zero tensors, and the varlen kernel's blocks take the caller's lengths' longest-first order (computed
    # once per step for all layers: SequenceOrders), not one of the lengths made here per call.
    total_q, batch = q.shape[0], block_table.shape[0]
    used = seqused_k if seqused_k is not None else cu_seqlens_k[1:] - cu_seqlens_k[:-1]
    first = cu_seqlens_q[:-1]
    single = (cu_seqlens_q[1:] - first) == 1
    row = first.clamp(0, total_q - 1)
    rows_q, lengths = q.index_select(0, torch.where(single, row, 0)).unsqueeze(1), torch.where(single, used, 0)
    softcap, alibi_slopes, sinks = variants or (None, None, None)
    if variants is None:
        decoded = kvcache(rows_q, k, v, lengths, block_table, False, scale, None, "bshd", return_lse)
    else:
        decoded = kvcache_variant(rows_q, k, v, lengths, block_table, False, scale, None, "bshd", return_lse, None,
                                  softcap, alibi_slopes, sinks)
    out = q.new_empty((total_q + 1,) + tuple(q.shape[1:]))     # row total_q: where the other sequences' rows go
    lse = None
    if kernel is not None:
        result = kernel.varlen(q, k, v, cu_seqlens_q, None, max_seqlen_q=max_seqlen_q, causal=causal,
                               alignment=alignment, scale=scale, return_lse=return_lse, block_table=block_table,
                               seqused_k=torch.where(single, 0, used), out=out[:total_q], softcap=softcap,
                               alibi_slopes=alibi_slopes, sinks=sinks, order_by=(seqused_k, cu_seqlens_k))
        lse = result[1] if return_lse else None
    rows = torch.where(single, row, total_q).long()
    out.index_copy_(0, rows, (decoded[0] if return_lse else decoded).squeeze(1))
    if not return_lse:
        return out[:total_q]
    heads = q.shape[1]
    lse_all = q.new_empty((heads, total_q + 1), dtype=torch.float32)
    if lse is not None:
        lse_all[:, :total_q] = lse
    lse_all.index_copy_(1, rows, decoded[1].view(batch, heads).t())
    return out[:total_q], lse_all[:, :total_q].contiguous()


_STEP_DECODE: dict = {}   # (device, dtype, q's heads and dim, batch, pool shape, V dim, table shape, modifiers, sinks)
                          # -> decode kernel or None


def _step_in_place(kernel, q, k, v, cu_seqlens_q, block_table, seqused_k, max_seqlen_q, causal, alignment, scale,
                   variants):
    """_mixed_step without tensor ops: the paged decode kernel's rows functions (DecodeKernel.rows_call) read each
    single-query sequence's query at its row of q and write its output at that row of one output, and the varlen
    kernel (single_queries_apart) the other sequences' rows of it. Two launches, nothing copied; no LSE. None, having
    launched nothing, where the table's decode kernel for the step has no rows functions (or pads the head dim, or
    joins sinks after it), or its rows call does not fit (the caller then splits the step with tensor ops)."""
    softcap, alibi_slopes, sinks = variants or (None, None, None)
    decode = _step_decode(q, k, v, block_table, call_scores(softcap, alibi_slopes, sinks), sinks is not None)
    if decode is None:
        return None
    out = q.new_empty(q.shape)
    if not decode.rows_call(q, k, v, seqused_k, block_table, cu_seqlens_q, out, scale=scale, softcap=softcap,
                            alibi_slopes=alibi_slopes, sinks=sinks):
        return None
    if kernel is not None:
        kernel.varlen(q, k, v, cu_seqlens_q, None, max_seqlen_q=max_seqlen_q, causal=causal, alignment=alignment,
                      scale=scale, block_table=block_table, seqused_k=seqused_k, out=out, softcap=softcap,
                      alibi_slopes=alibi_slopes, sinks=sinks, single_queries_apart=True)
    return out


def _step_decode(q, k, v, block_table, scores: str, sinks: bool):
    """The paged decode kernel of a step's decode rows (the one _mixed_step's decode call takes: mask none, the
    step's score modifiers, (batch, 1, Hq, D) queries) where it has rows functions and serves the head dim and the
    sinks itself; else None (also where the step has more sequences than query rows). Kept per shape."""
    batch = block_table.shape[0]
    if not 1 <= batch <= q.shape[0]:
        return None
    key = (q.get_device(), q.dtype, q.shape[1:], batch, k.shape, v.shape[-1], block_table.shape, scores, sinks)
    if key in _STEP_DECODE:
        return _STEP_DECODE[key]
    decode = None
    if not _decode_padding(q, v, "none", scores, True) and not (
            sinks and DISPATCH.sinks_apart("decode", key[0], q.dtype, q.shape[-1], _head_dim_v(q, v), "none", scores,
                                           True)):
        rows = q.as_strided((batch, 1) + tuple(q.shape[1:]), (q.stride(0),) + tuple(q.stride()))
        decode = _decode_kernel(rows, k, block_table, "none", "bshd", scores, head_dim_v=_head_dim_v(q, v))
        if not getattr(decode.plan, "step_rows", False):
            decode = None
    if len(_STEP_DECODE) >= 4096:
        _STEP_DECODE.clear()
    _STEP_DECODE[key] = decode
    return decode


_BACKWARD: dict = {}    # (device, dtype, head_dim, mask, scores, seqlen_q, V head_dim) -> kernel


def _vector_ready(t) -> bool:
    """The backward kernel reads t in 16-byte vectors: last dim contiguous, other strides in 8s."""
    return t.stride(-1) == 1 and not any(s % 8 for s in t.stride()[:-1]) and t.data_ptr() % 16 == 0


def backward_kernel(q, k, v, causal, layout, window=None, softcap=None, alibi_slopes=None):
    """The table's backward kernel for a call's gradients (its mask and score modifiers);
    NotImplementedError (before the forward runs, from attention()) where the table has none: a
    forward whose backward would then fail. The table's backward buckets key on seqlen_q: a block of
    keys walks every query block, so their count and the last one's empty rows decide between query tiles
    (docs/performance/backward.md, "80-row query blocks when seqlen_q and seqlen_k differ")."""
    seqlen_q = q.shape[2] if layout == "bhsd" else q.shape[1]
    mask, scores = call_mask(causal, window), call_scores(softcap, alibi_slopes)
    d, dv = q.shape[-1], v.shape[-1]
    pad = DISPATCH.padded_dims("backward", q.get_device(), q.dtype, d, dv, mask, scores) if q.get_device() >= 0 else None
    short = (q.get_device(), q.dtype, pad[0] if pad else d, mask, scores, seqlen_q, pad[1] if pad else dv)
    kernel = _BACKWARD.get(short)
    if kernel is None:
        try:   # V's head dim keys the entries as the forward's do (0: q's)
            kernel = DISPATCH.kernel("backward", short[0], q.dtype, short[2], mask, seqlen_q,
                                     head_dim_v=short[6] if short[6] != short[2] else 0, scores=scores)
        except LookupError as exc:
            raise NotImplementedError(f"attngen has no backward for this call yet: {exc}") from None
        if len(_BACKWARD) >= 4096:
            _BACKWARD.clear()
        _BACKWARD[short] = kernel
    return kernel


def backward(dout, q, k, v, out, lse, causal, alignment, scale, layout, window=None, softcap=None, alibi_slopes=None,
             deterministic=False, return_delta=False):
    """The gradients (dq, dk, dv) of attention(q, k, v) at dout through the table's backward spec
    (with the forward call's variants). dout comes from autograd in any strides (a sum's is
    expanded, stride 0): copied when the kernel cannot read it in place. return_delta: (dq, dk, dv,
    delta), delta = rowsum(dO * O) per query row, fp32 like lse (sink_gradient_from_delta)."""
    d = q.shape[-1]
    pad = DISPATCH.padded_dims("backward", q.get_device(), q.dtype, d, v.shape[-1], call_mask(causal, window),
                               call_scores(softcap, alibi_slopes)) if q.get_device() >= 0 else None
    if pad:
        grads = backward(_pad(dout, pad[1]), _pad(q, pad[0]), _pad(k, pad[0]), _pad(v, pad[1]), _pad(out, pad[1]), lse,
                         causal, alignment, _scale(scale, d), layout, window, softcap, alibi_slopes, deterministic,
                         return_delta)   # the padded columns are zeros in O and dO: the same delta
        return _cut_gradients(grads[:3], d, v.shape[-1]) + tuple(grads[3:])
    kernel = backward_kernel(q, k, v, causal, layout, window, softcap, alibi_slopes)
    if not _vector_ready(dout):
        dout = dout.contiguous()
    return kernel(q, k, v, out, lse, dout, causal=causal, alignment=alignment, scale=scale, layout=layout,
                  window=None if window is None else tuple(window), softcap=softcap, alibi_slopes=alibi_slopes,
                  deterministic=deterministic, return_delta=return_delta)


def varlen_backward_mask(q, k, v, causal, window, softcap, alibi_slopes):
    """(causal, window) for a varlen backward call: as given, or, for a call without a window (mask none
    or causal) whose score modifiers the table's varlen backward serves at no kernel of that mask but at
    a window kernel (at d256, non-causal ALiBi has only the window function: mask none's deterministic
    function spills), a window wider than every sequence, which hides no key the mask would show
    (causal: (wide, 0)). The forward's LSE is the same either way."""
    scores = call_scores(softcap, alibi_slopes)
    mask = call_mask(causal, window)
    index = q.get_device()
    if not window_stands_in("varlen_backward", mask, scores) or index < 0:
        return causal, window
    d, dv = q.shape[-1], v.shape[-1]

    def served(m):
        return (DISPATCH.serves("varlen_backward", index, q.dtype, d, m, head_dim_v=0 if dv == d else dv,
                                scores=scores)
                or DISPATCH.padded_dims("varlen_backward", index, q.dtype, d, dv, m, scores) is not None)
    if served(mask) or not served("window"):
        return causal, window
    wide = q.shape[0] + k.shape[0]        # more than any sequence's queries or keys, whatever the alignment
    return causal, (wide, 0 if causal else wide)


def varlen_backward_kernel(q, k, causal, max_seqlen_k, v=None, window=None, softcap=None, alibi_slopes=None):
    """The table's backward kernel for a varlen call's gradients (its mask and score modifiers; keyed
    by V's head dim too, where v is given and it differs); NotImplementedError (before the forward runs,
    from attention_varlen()) where the table has none."""
    index = q.get_device()
    if index < 0:
        raise ValueError(f"q is on {q.device}; attngen needs CUDA tensors (e.g. q.cuda())")
    causal, window = varlen_backward_mask(q, k, q if v is None else v, causal, window, softcap, alibi_slopes)
    d, dv = q.shape[-1], q.shape[-1] if v is None else v.shape[-1]
    mask, scores = call_mask(causal, window), call_scores(softcap, alibi_slopes)
    d, dv = DISPATCH.padded_dims("varlen_backward", index, q.dtype, d, dv, mask, scores) or (d, dv)
    dv = 0 if dv == d else dv
    try:
        return DISPATCH.kernel("varlen_backward", index, q.dtype, d, mask,
                               max_seqlen_k if max_seqlen_k is not None else k.shape[0], head_dim_v=dv, scores=scores)
    except LookupError as exc:
        raise NotImplementedError(f"attngen has no varlen backward for this call yet: {exc}") from None


def varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                    alignment, scale, deterministic=False, window=None, softcap=None, alibi_slopes=None):
    """The gradients (dq, dk, dv) of attention_varlen at dout through the table's varlen backward
    spec for the call's mask and score modifiers (dout copied when the kernel cannot read it in place,
    as in backward()); a mask the table serves only as a window runs as one (varlen_backward_mask)."""
    d = q.shape[-1]
    causal, window = varlen_backward_mask(q, k, v, causal, window, softcap, alibi_slopes)
    pad = DISPATCH.padded_dims("varlen_backward", q.get_device(), q.dtype, d, v.shape[-1], call_mask(causal, window),
                               call_scores(softcap, alibi_slopes)) if q.get_device() >= 0 else None
    if pad:
        grads = varlen_backward(_pad(dout, pad[1]), _pad(q, pad[0]), _pad(k, pad[0]), _pad(v, pad[1]),
                                _pad(out, pad[1]), lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                                alignment, _scale(scale, d), deterministic, window, softcap, alibi_slopes)
        return _cut_gradients(grads, d, v.shape[-1])
    kernel = varlen_backward_kernel(q, k, causal, max_seqlen_k, v, window, softcap, alibi_slopes)
    if not _vector_ready(dout):
        dout = dout.contiguous()
    variants = {} if window is None and softcap is None and alibi_slopes is None else {
        "window": None if window is None else tuple(window), "softcap": softcap, "alibi_slopes": alibi_slopes}
    return kernel.varlen(q, k, v, out, lse, dout, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                         max_seqlen_k=max_seqlen_k, causal=causal, alignment=alignment, scale=scale,
                         deterministic=deterministic, **variants)


_DECODE: dict = {}      # (device, dtype, q shape, cache shape, table shape, causal, layout) -> kernel


def _kvcache_key(q, k_cache, v_cache, block_table, *call) -> tuple:
    """kvcache's and kvcache_variant's key of the table's kernel: device, dtype, q shape, cache shape, V head dim,
    table shape, then the call's options (causal, layout; or mask, score modifiers, layout)."""
    return (q.get_device(), q.dtype, q.shape, k_cache.shape, v_cache.shape[-1],
            None if block_table is None else block_table.shape, *call)


def kvcache(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits, layout, return_lse):
    key = _kvcache_key(q, k_cache, v_cache, block_table, causal, layout)
    kernel = _DECODE.get(key)
    if kernel is None:
        to = _decode_padding(q, v_cache, "causal" if causal else "none", "", block_table is not None)
        if to:
            return _cut(kvcache(_pad(q, to), _pad(k_cache, to), _pad(v_cache, to), cache_seqlens, block_table, causal,
                                _scale(scale, q.shape[-1]), num_splits, layout, return_lse), q.shape[-1], return_lse)
        kernel = _decode_kernel(q, k_cache, block_table, "causal" if causal else "none", layout,
                                head_dim_v=_head_dim_v(q, v_cache))
        if len(_DECODE) >= 4096:
            _DECODE.clear()
        _DECODE[key] = kernel
    return kernel(q, k_cache, v_cache, cache_seqlens=cache_seqlens, block_table=block_table, causal=causal,
                  scale=scale, num_splits=num_splits, layout=layout, return_lse=return_lse)


_DECODE_VARIANT: dict = {}   # _kvcache_key with mask, score modifiers and layout -> kernel


def kvcache_variant(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits, layout, return_lse,
                    window, softcap, alibi_slopes, sinks=None):
    """The eager decode call with variants (window, softcap, ALiBi, sinks): the table's decode kernel for
    the call's mask and score modifiers, then the kernel call (which keeps its own prepared calls). Sinks
    that no kernel of the other modifiers takes are joined after them (join_sinks)."""
    mask, scores = call_mask(causal, window), call_scores(softcap, alibi_slopes, sinks)
    key = _kvcache_key(q, k_cache, v_cache, block_table, mask, scores, layout)
    kernel = _DECODE_VARIANT.get(key)
    if kernel is None and sinks is not None:
        if key[0] < 0:
            raise ValueError(f"q is on {q.device}; attngen needs CUDA tensors (e.g. q.cuda())")
        if DISPATCH.sinks_apart("decode", key[0], q.dtype, q.shape[-1], _head_dim_v(q, v_cache), mask, scores,
                                block_table is not None):
            if len(_DECODE_VARIANT) >= 4096:
                _DECODE_VARIANT.clear()
            kernel = _DECODE_VARIANT[key] = _SINKS_APART
    if kernel is _SINKS_APART:
        return _joined(kvcache_variant(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits,
                                       layout, True, window, softcap, alibi_slopes), sinks, layout, return_lse,
                       merge=True)
    if kernel is None:
        to = _decode_padding(q, v_cache, mask, scores, block_table is not None)
        if to:
            return _cut(kvcache_variant(_pad(q, to), _pad(k_cache, to), _pad(v_cache, to), cache_seqlens, block_table,
                                        causal, _scale(scale, q.shape[-1]), num_splits, layout, return_lse, window,
                                        softcap, alibi_slopes, sinks), q.shape[-1], return_lse)
        kernel = _decode_kernel(q, k_cache, block_table, mask, layout, scores, head_dim_v=_head_dim_v(q, v_cache))
        if len(_DECODE_VARIANT) >= 4096:
            _DECODE_VARIANT.clear()
        _DECODE_VARIANT[key] = kernel
    return kernel(q, k_cache, v_cache, cache_seqlens=cache_seqlens, block_table=block_table, causal=causal,
                  scale=scale, num_splits=num_splits, layout=layout, return_lse=return_lse,
                  window=None if window is None else tuple(window), softcap=softcap, alibi_slopes=alibi_slopes,
                  sinks=sinks)


_DECODE_E4M3: dict = {}     # (device, dtype, q shape, cache shape, table shape, causal, layout) -> kernel


def kvcache_e4m3(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits, layout, return_lse,
                 k_scale, v_scale):
    """The eager decode call on an e4m3 KV cache: the table's decode_kv_e4m3 kernel (its entries key on the
    queries' dtype, paged or not), then the kernel call, which checks the cache's dtype and the scales."""
    key = (q.get_device(), q.dtype, q.shape, k_cache.shape, None if block_table is None else block_table.shape,
           causal, layout)
    kernel = _DECODE_E4M3.get(key)
    if kernel is None:
        kernel = _decode_kernel(q, k_cache, block_table, "causal" if causal else "none", layout,
                                call="decode_kv_e4m3")
        if len(_DECODE_E4M3) >= 4096:
            _DECODE_E4M3.clear()
        _DECODE_E4M3[key] = kernel
    return kernel(q, k_cache, v_cache, cache_seqlens=cache_seqlens, block_table=block_table, causal=causal,
                  scale=scale, num_splits=num_splits, layout=layout, return_lse=return_lse, k_scale=k_scale,
                  v_scale=v_scale)


_DECODE_APPEND: dict = {}   # (device, dtype, q shape, cache shape, table shape, mask, scores, layout) -> kernel


def kvcache_append(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
                   block_table, rotary_interleaved, causal, scale, num_splits, layout, return_lse, window=None,
                   softcap=None, alibi_slopes=None, sinks=None):
    """The eager decode call that appends new tokens (k, v; rotary; cache_batch_idx, cache_leftpad): the
    table's decode_append kernel for the call's mask and score modifiers (an append spec: it writes the
    cache in the same launch), then the kernel call, which checks every argument."""
    mask, scores = call_mask(causal, window), call_scores(softcap, alibi_slopes, sinks)
    key = (q.get_device(), q.dtype, q.shape, k_cache.shape, None if block_table is None else block_table.shape,
           mask, scores, layout)
    kernel = _DECODE_APPEND.get(key)
    if kernel is None:
        to = _decode_padding(q, v_cache, mask, scores, block_table is not None, call="decode_append")
        if to:
            return _append_padded(to, q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                                  cache_batch_idx, cache_leftpad, block_table, rotary_interleaved, causal, scale,
                                  num_splits, layout, return_lse, window, softcap, alibi_slopes, sinks)
        kernel = _decode_kernel(q, k_cache, block_table, mask, layout, scores, call="decode_append")
        if len(_DECODE_APPEND) >= 4096:
            _DECODE_APPEND.clear()
        _DECODE_APPEND[key] = kernel
    extra = {} if window is None else {"window": tuple(window)}
    for name, value in (("softcap", softcap), ("alibi_slopes", alibi_slopes), ("sinks", sinks)):
        if value is not None:
            extra[name] = value
    return kernel(q, k_cache, v_cache, cache_seqlens=cache_seqlens, block_table=block_table, causal=causal,
                  scale=scale, num_splits=num_splits, layout=layout, return_lse=return_lse, k=k, v=v,
                  rotary_cos=rotary_cos, rotary_sin=rotary_sin, cache_batch_idx=cache_batch_idx,
                  cache_leftpad=cache_leftpad, rotary_interleaved=rotary_interleaved, **extra)


def _append_padded(to, q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                   cache_leftpad, block_table, rotary_interleaved, causal, scale, num_splits, layout, return_lse,
                   window, softcap, alibi_slopes, sinks):
    """kvcache_append at a head dim with no append kernel: q, the new tokens and the caches (or pools)
    zero-padded to head dim `to`, the append run on the padded copies, whose first columns are then
    copied back into the caller's caches (every row: those the call did not write are equal), and the
    output cut back. Three passes over the caches per call; an append kernel of the head dim needs none.
    The write-back is a copy of every row (or page of the pools), in stream order: a row another stream
    writes during the call is overwritten with its value from before."""
    d = q.shape[-1]
    _check_head_dims(d, k_cache=k_cache, v_cache=v_cache, k=k, v=v)
    if rotary_cos is not None and 2 * rotary_cos.shape[-1] > d:
        raise ValueError(f"rotary_dim ({2 * rotary_cos.shape[-1]}: 2 x rotary_cos.shape[1]) must be at most head_dim "
                         f"({d})")
    padded_k, padded_v = _pad(k_cache, to), _pad(v_cache, to)
    result = kvcache_append(_pad(q, to), padded_k, padded_v, None if k is None else _pad(k, to),
                            None if v is None else _pad(v, to), rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                            cache_leftpad, block_table, rotary_interleaved, causal, _scale(scale, d), num_splits,
                            layout, return_lse, window, softcap, alibi_slopes, sinks)
    k_cache.copy_(padded_k[..., :d])
    v_cache.copy_(padded_v[..., :d])
    return _cut(result, d, return_lse)


def _decode_padding(q, v_cache, mask: str | None, scores: str = "", paged: bool | None = None,
                    call: str = "decode") -> int:
    """The head dim a decode call pads to (0: none; see _pad): its mask, score modifiers and cache kind
    (mask None: any entry of the call serves the head dim)."""
    index = q.get_device()
    if index < 0:
        raise ValueError(f"q is on {q.device}; attngen needs CUDA tensors (e.g. q.cuda())")
    return DISPATCH.padded_head_dim(call, index, q.dtype, q.shape[-1], v_cache.shape[-1], mask, scores, paged)


def _head_dim_v(q, v) -> int:
    """The table key's head_dim_v of a call: V's head dim where it differs from q's, else 0."""
    return 0 if v.shape[-1] == q.shape[-1] else v.shape[-1]


def _decode_kernel(q, k_cache, block_table, mask: str, layout, scores: str = "", call: str = "decode",
                   head_dim_v: int = 0):
    """The table's decode kernel for this call: keyed by its mask and score modifiers, V's head dim where it
    differs from q's, the cache's capacity, whether it is paged (a paged kernel reads any page size; it
    checks the one given), the query rows per KV head and the call's query rows (batch x heads x new tokens:
    where a bucket's winner depends on the grid's size)."""
    index = q.get_device()
    if index < 0:
        raise ValueError(f"q is on {q.device}; attngen needs CUDA tensors (e.g. q.cuda())")
    batch, heads, seqlen_q = _heads_seq(q, layout)
    bhsd = layout == "bhsd"
    kv_heads = k_cache.shape[1] if bhsd else k_cache.shape[2]
    rows = k_cache.shape[2] if bhsd else k_cache.shape[1]
    paged = block_table is not None
    capacity = block_table.shape[1] * rows if paged else rows
    group_rows = max(1, heads // max(kv_heads, 1)) * seqlen_q
    return DISPATCH.kernel(call, index, q.dtype, q.shape[-1], mask, capacity, paged=paged,
                           group_rows=group_rows, scores=scores, head_dim_v=head_dim_v,
                           rows=batch * heads * seqlen_q)


_FP8: dict = {}         # (device, head_dim, causal, seqlen_k) -> kernel


def forward_fp8(q, k, v_t, q_descale, k_descale, v_descale, causal, alignment, scale, layout, return_lse):
    """The eager e4m3 forward: the table's kernel for this device, head dim, mask and seqlen_k, then
    the kernel call (its own prepared-call path skips the checks of a shape seen before)."""
    seqlen_k = k.shape[2] if layout == "bhsd" else k.shape[1]
    short = (q.get_device(), q.shape[-1], causal, seqlen_k)
    kernel = _FP8.get(short)
    if kernel is None:
        if short[0] < 0:
            raise ValueError(f"q is on {q.device}; attngen needs CUDA tensors (e.g. q.cuda())")
        kernel = DISPATCH.kernel("forward_fp8", short[0], q.dtype, short[1], "causal" if causal else "none", seqlen_k)
        if len(_FP8) >= 4096:
            _FP8.clear()
        _FP8[short] = kernel
    return kernel(q, k, v_t, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale, causal=causal,
                  alignment=alignment, scale=scale, layout=layout, return_lse=return_lse)


_MERGE: dict = {}       # (device, parts' dtype, out_dtype, head_dim) -> kernel
_HALF = {torch.float16: "fp16", torch.bfloat16: "bf16"}


def _merge_table_dtype(parts_dtype, out_dtype) -> str:
    """The dtype a merge's table entry is keyed by: the half type among its parts and output (every merge
    spec also merges fp32 into fp32, so an all-fp32 merge takes the fp16 entry's)."""
    if parts_dtype in _HALF:
        if out_dtype not in (None, parts_dtype, torch.float32):
            raise TypeError(f"a merge of {parts_dtype} parts writes {parts_dtype} or torch.float32 (got out_dtype "
                            f"{out_dtype})")
        return _HALF[parts_dtype]
    if parts_dtype == torch.float32:
        if out_dtype not in (None, torch.float32) and out_dtype not in _HALF:
            raise TypeError(f"a merge writes float16, bfloat16 or float32 (got out_dtype {out_dtype})")
        return _HALF.get(out_dtype, "fp16")
    raise TypeError(f"attngen merges float16, bfloat16 or float32 parts (got {parts_dtype})")


def merge(outs, lses, layout, out_dtype):
    """The eager merge of partial attention results: the table's merge kernel for the device, dtype and
    head dim (remembered per key), then the kernel call, which checks every part."""
    if not isinstance(outs, (list, tuple)) or not outs or not isinstance(outs[0], torch.Tensor):
        raise TypeError("outs must be a non-empty list of torch.Tensor parts (each (B, H, S, D) or (B, S, H, D))")
    return _merge_kernel(outs[0], out_dtype)(outs, lses, layout=layout, out_dtype=out_dtype)


def _merge_kernel(first, out_dtype):
    """The table's merge kernel for parts like `first` (device, dtype, head dim) and out_dtype, remembered
    per key."""
    key = (first.get_device(), first.dtype, out_dtype, first.shape[-1])
    kernel = _MERGE.get(key)
    if kernel is None:
        if key[0] < 0:
            raise ValueError(f"outs[0] is on {first.device}; attngen needs CUDA tensors (e.g. .cuda())")
        kernel = DISPATCH.kernel("merge", key[0], _merge_table_dtype(first.dtype, out_dtype), key[3], "none", 0)
        if len(_MERGE) >= 4096:
            _MERGE.clear()
        _MERGE[key] = kernel
    return kernel


# -- the ops ---------------------------------------------------------------------------------------
# Defined with torch.library.Library (schema, CUDA kernel, fake) rather than custom_op: a call of
# the op then costs the dispatcher alone, not custom_op's Python wrapper on top of it.

LIB = torch.library.Library("attngen", "DEF")
LIB.define("attention(Tensor q, Tensor k, Tensor v, bool causal, str? alignment, float? scale, str layout) "
           "-> (Tensor, Tensor)")
LIB.define("attention_train(Tensor q, Tensor k, Tensor v, bool causal, str? alignment, float? scale, str layout, "
           "bool deterministic=False) -> (Tensor, Tensor)")
LIB.define("attention_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, bool causal, "
           "str? alignment, float? scale, str layout, bool deterministic=False) -> (Tensor, Tensor, Tensor)")
LIB.define("attention_variant(Tensor q, Tensor k, Tensor v, bool causal, str? alignment, float? scale, str layout, "
           "int[]? window, float? softcap, Tensor? alibi_slopes, Tensor? sinks=None) -> (Tensor, Tensor)")
LIB.define("attention_variant_train(Tensor q, Tensor k, Tensor v, bool causal, str? alignment, float? scale, "
           "str layout, int[]? window, float? softcap, Tensor? alibi_slopes, bool deterministic=False, "
           "Tensor? sinks=None) -> (Tensor, Tensor)")
LIB.define("attention_variant_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
           "bool causal, str? alignment, float? scale, str layout, int[]? window, float? softcap, "
           "Tensor? alibi_slopes, bool deterministic=False) -> (Tensor, Tensor, Tensor)")
LIB.define("attention_varlen(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
           "int? max_seqlen_q, int? max_seqlen_k, bool causal, str? alignment, float? scale) -> (Tensor, Tensor)")
LIB.define("attention_varlen_variant(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
           "int? max_seqlen_q, int? max_seqlen_k, bool causal, str? alignment, float? scale, int[]? window, "
           "float? softcap, Tensor? alibi_slopes, Tensor? sinks) -> (Tensor, Tensor)")
LIB.define("attention_varlen_train(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
           "int? max_seqlen_q, int? max_seqlen_k, bool causal, str? alignment, float? scale, "
           "bool deterministic=False) -> (Tensor, Tensor)")
LIB.define("attention_varlen_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
           "Tensor cu_seqlens_q, Tensor cu_seqlens_k, int? max_seqlen_q, int? max_seqlen_k, bool causal, "
           "str? alignment, float? scale, bool deterministic=False) -> (Tensor, Tensor, Tensor)")
LIB.define("attention_varlen_variant_train(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
           "int? max_seqlen_q, int? max_seqlen_k, bool causal, str? alignment, float? scale, int[]? window, "
           "float? softcap, Tensor? alibi_slopes, bool deterministic=False, Tensor? sinks=None) -> (Tensor, Tensor)")
LIB.define("attention_varlen_variant_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
           "Tensor cu_seqlens_q, Tensor cu_seqlens_k, int? max_seqlen_q, int? max_seqlen_k, bool causal, "
           "str? alignment, float? scale, int[]? window, float? softcap, Tensor? alibi_slopes, "
           "bool deterministic=False) -> (Tensor, Tensor, Tensor)")
LIB.define("attention_varlen_paged(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor? cu_seqlens_k, "
           "Tensor block_table, Tensor? seqused_k, int? max_seqlen_q, int? max_seqlen_k, bool causal, str? alignment, "
           "float? scale, int[]? window, float? softcap, Tensor? alibi_slopes, Tensor? sinks) -> (Tensor, Tensor)")
LIB.define("attention_fp8(Tensor q, Tensor k, Tensor v_t, Tensor? q_descale, Tensor? k_descale, Tensor? v_descale, "
           "bool causal, str? alignment, float? scale, str layout) -> (Tensor, Tensor)")
LIB.define("attention_with_kvcache(Tensor q, Tensor k_cache, Tensor v_cache, Tensor? cache_seqlens, "
           "Tensor? block_table, bool causal, float? scale, int? num_splits, str layout) -> (Tensor, Tensor)")
LIB.define("merge_attention(Tensor[] outs, Tensor[] lses, str layout, ScalarType? out_dtype) -> (Tensor, Tensor)")
LIB.define("attention_with_kvcache_variant(Tensor q, Tensor k_cache, Tensor v_cache, Tensor? cache_seqlens, "
           "Tensor? block_table, bool causal, float? scale, int? num_splits, str layout, int[]? window, "
           "float? softcap, Tensor? alibi_slopes, Tensor? sinks=None) -> (Tensor, Tensor)")


def attention_cuda(q, k, v, causal, alignment, scale, layout):
    return forward(q, k, v, causal, alignment, scale, layout, True)


def attention_train_cuda(q, k, v, causal, alignment, scale, layout, deterministic=False):
    """The training forward of torch.compile's graphs (and of the op's eager calls): the shape's training
    step, as attention()'s eager calls take it (native once made, else prepared), or the full forward."""
    step = _plain_step(q, k, v, causal, alignment, scale, layout, deterministic)
    if step is None:
        return forward(q, k, v, causal, alignment, scale, layout, True)
    if step.native is not None:
        return _native_forward(q, k, v, step.native_address)
    return step.outputs(q, k, v)


def attention_backward_cuda(dout, q, k, v, out, lse, causal, alignment, scale, layout, deterministic=False):
    """The backward of torch.compile's graphs: the shape's training step where out and lse are its
    forward's (the prepared calls were laid out for their strides), else the full backward."""
    step = _plain_step(q, k, v, causal, alignment, scale, layout, deterministic, make=False)
    if step is not None and step.takes(out, lse):
        # the native step only where it replays without falling back to this op (its dout strides, every
        # pointer on 16 bytes): the native node's own fallback for a dout it cannot take comes here
        if step.native is not None and dout.stride() == step.dout_stride and not (
                q.data_ptr() | k.data_ptr() | v.data_ptr() | out.data_ptr() | dout.data_ptr()) % LOAD_BYTES:
            return _native_backward(dout, q, k, v, out, lse, step.native_address)
        return step.gradients(dout, q, k, v, out, lse)
    return backward(dout, q, k, v, out, lse, causal, alignment, scale, layout, deterministic=deterministic)


def attention_variant_cuda(q, k, v, causal, alignment, scale, layout, window, softcap, alibi_slopes, sinks=None):
    return forward_variant(q, k, v, causal, alignment, scale, layout, True, window, softcap, alibi_slopes, sinks)


def attention_variant_train_cuda(q, k, v, causal, alignment, scale, layout, window, softcap, alibi_slopes,
                                 deterministic=False, sinks=None):
    return forward_variant(q, k, v, causal, alignment, scale, layout, True, window, softcap, alibi_slopes, sinks)


def attention_variant_backward_cuda(dout, q, k, v, out, lse, causal, alignment, scale, layout, window, softcap,
                                    alibi_slopes, deterministic=False):
    return backward(dout, q, k, v, out, lse, causal, alignment, scale, layout, window, softcap, alibi_slopes,
                    deterministic)


def attention_varlen_cuda(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, alignment, scale):
    return varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, alignment, scale, True)


def attention_varlen_variant_cuda(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, alignment,
                                  scale, window, softcap, alibi_slopes, sinks):
    return varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, alignment, scale, True,
                  window, softcap, alibi_slopes, sinks)


def attention_varlen_paged_cuda(q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, seqused_k, max_seqlen_q, max_seqlen_k,
                                causal, alignment, scale, window, softcap, alibi_slopes, sinks):
    return paged_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, seqused_k, max_seqlen_q, max_seqlen_k, causal,
                        alignment, scale, True, window, softcap, alibi_slopes, sinks)


def attention_varlen_train_cuda(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, alignment,
                                scale, deterministic=False):
    return varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, alignment, scale, True)


def attention_varlen_backward_cuda(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                   causal, alignment, scale, deterministic=False):
    return varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                           alignment, scale, deterministic)


def attention_varlen_variant_train_cuda(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                                        alignment, scale, window, softcap, alibi_slopes, deterministic=False,
                                        sinks=None):
    return varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, alignment, scale, True,
                  window, softcap, alibi_slopes, sinks)


def attention_varlen_variant_backward_cuda(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                           max_seqlen_k, causal, alignment, scale, window, softcap, alibi_slopes,
                                           deterministic=False):
    return varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                           alignment, scale, deterministic, window, softcap, alibi_slopes)


def attention_with_kvcache_cuda(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits, layout):
    return kvcache(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits, layout, True)


def attention_with_kvcache_variant_cuda(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits,
                                        layout, window, softcap, alibi_slopes, sinks=None):
    return kvcache_variant(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits, layout, True,
                           window, softcap, alibi_slopes, sinks)


def attention_fp8_cuda(q, k, v_t, q_descale, k_descale, v_descale, causal, alignment, scale, layout):
    return forward_fp8(q, k, v_t, q_descale, k_descale, v_descale, causal, alignment, scale, layout, True)


def attention_fp8_fake(q, k, v_t, q_descale, k_descale, v_descale, causal, alignment, scale, layout):
    # the table's forward_fp8 specs write bf16 (ops/table.py OUT_DTYPE), contiguous in q's shape
    out = q.new_empty(q.shape, dtype=torch.bfloat16)
    return out, q.new_empty(_heads_seq(q, layout), dtype=torch.float32)


def _fake_output(q, v):
    """The output as the kernel makes it: like q, or q's shape with V's head dim (contiguous) where they differ."""
    return torch.empty_like(q) if v.shape[-1] == q.shape[-1] else q.new_empty(q.shape[:-1] + (v.shape[-1],))


def attention_fake(q, k, v, causal, alignment, scale, layout):
    out = _fake_output(q, v)
    return out, q.new_empty(_heads_seq(q, layout), dtype=torch.float32)


def attention_train_fake(q, k, v, causal, alignment, scale, layout, deterministic=False):
    return attention_fake(q, k, v, causal, alignment, scale, layout)


def attention_backward_fake(dout, q, k, v, out, lse, causal, alignment, scale, layout, deterministic=False):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def attention_variant_fake(q, k, v, causal, alignment, scale, layout, window, softcap, alibi_slopes, sinks=None):
    return attention_fake(q, k, v, causal, alignment, scale, layout)


def attention_variant_train_fake(q, k, v, causal, alignment, scale, layout, window, softcap, alibi_slopes,
                                 deterministic=False, sinks=None):
    return attention_fake(q, k, v, causal, alignment, scale, layout)


def attention_variant_backward_fake(dout, q, k, v, out, lse, causal, alignment, scale, layout, window, softcap,
                                    alibi_slopes, deterministic=False):
    return attention_backward_fake(dout, q, k, v, out, lse, causal, alignment, scale, layout)


def attention_varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, alignment, scale):
    out = _fake_output(q, v)
    return out, q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


def attention_varlen_variant_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, alignment,
                                  scale, window, softcap, alibi_slopes, sinks):
    return attention_varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, alignment,
                                 scale)


def attention_varlen_paged_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, seqused_k, max_seqlen_q, max_seqlen_k,
                                causal, alignment, scale, window, softcap, alibi_slopes, sinks):
    # k and v are page pools: the output's head dim is V's, as in the packed call
    return attention_varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, alignment,
                                 scale)


def attention_varlen_train_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, alignment,
                                scale, deterministic=False):
    return attention_varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, alignment,
                                 scale)


def attention_varlen_backward_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                   causal, alignment, scale, deterministic=False):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def attention_varlen_variant_train_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                                        alignment, scale, window, softcap, alibi_slopes, deterministic=False,
                                        sinks=None):
    return attention_varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, alignment,
                                 scale)


def attention_varlen_variant_backward_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                           max_seqlen_k, causal, alignment, scale, window, softcap, alibi_slopes,
                                           deterministic=False):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def attention_with_kvcache_fake(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits, layout):
    out = _fake_output(q, v_cache)
    return out, q.new_empty(_heads_seq(q, layout), dtype=torch.float32)


def attention_with_kvcache_variant_fake(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits,
                                        layout, window, softcap, alibi_slopes, sinks=None):
    return attention_with_kvcache_fake(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits,
                                       layout)


def merge_attention_cuda(outs, lses, layout, out_dtype):
    return merge(outs, lses, layout, out_dtype)


def merge_attention_fake(outs, lses, layout, out_dtype):
    # as the kernel makes them: a new contiguous output of the parts' shape, and a (B, H, S) fp32 LSE
    first = outs[0]
    return (first.new_empty(first.shape, dtype=out_dtype or first.dtype),
            first.new_empty(_heads_seq(first, layout), dtype=torch.float32))


def _register_fake(name: str, fake) -> None:
    """torch.library.register_fake(f"attngen::{name}", fake, lib=LIB), less its caller lookup.

    The public call names its caller's module and line through inspect (reading this file and
    scanning sys.modules): about half a millisecond an op, most of what binding the ops costs a
    process's first call. The fake goes into the same registry entry, the handle to LIB as the public
    call leaves it; a torch whose registry differs gets the public call."""
    qualname = f"attngen::{name}"
    try:
        entry = torch._library.simple_registry.singleton.find(qualname)
        handle = entry.fake_impl.register(fake, f"{__file__}:{name}_fake", lib=LIB)
        LIB._registration_handles.append(handle)
    except (AttributeError, TypeError):
        torch.library.register_fake(qualname, fake, lib=LIB)


for _name in ("attention", "attention_train", "attention_backward", "attention_variant", "attention_variant_train",
              "attention_variant_backward", "attention_varlen", "attention_varlen_variant", "attention_varlen_train",
              "attention_varlen_backward", "attention_varlen_variant_train", "attention_varlen_variant_backward",
              "attention_varlen_paged", "attention_with_kvcache", "attention_with_kvcache_variant", "attention_fp8",
              "merge_attention"):
    LIB.impl(_name, globals()[f"{_name}_cuda"], "CUDA")
    _register_fake(_name, globals()[f"{_name}_fake"])


# attention_train (attention_variant_train) is attention (attention_variant) with a backward, and
# `deterministic` for it: the same forward and fake.

def _attention_setup(ctx, inputs, output):
    q, k, v, causal, alignment, scale, layout, deterministic = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.call = (causal, alignment, scale, layout, deterministic)
    ctx.mark_non_differentiable(lse)   # as FlashAttention's: the LSE comes back with requires_grad False


# Each gradients function takes the backward call: the op (registered) or its CUDA body (eager, _EagerTrain).
def _attention_gradients(ctx, grad_o, grad_lse, backward_call=None):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = (backward_call or torch.ops.attngen.attention_backward)(grad_o, q, k, v, o, lse, *ctx.call)
    return dq, dk, dv, None, None, None, None, None


def refuse_joined_sinks_gradient(call: str, q, v, causal, window, softcap, alibi_slopes, sinks,
                                 paged: bool | None = None) -> None:
    """NotImplementedError for learned sinks that need a gradient where the call joins them after the
    kernel of its other modifiers (join_sinks): their gradient is taken from that output (rounded twice:
    the kernel's rounding, then the join's, the likely cause), and in the variant sweep on the H200 it
    missed FlashAttention's error rule in 2-4 of 72 calls a run (at most 1.63x the bound), where the sink
    kernels' missed none. q, k and v get their gradients with sinks that do not need one. `paged`: as the
    forward call asks the table (varlen: False, packed K/V)."""
    if sinks is None or not sinks.requires_grad or q.get_device() < 0:   # off the GPU: no table (the ops' tests)
        return
    mask, scores = call_mask(causal, window), call_scores(softcap, alibi_slopes, sinks)
    if DISPATCH.sinks_apart(call, q.get_device(), q.dtype, q.shape[-1], v.shape[-1], mask, scores, paged):
        others = "+".join(name for name in scores.split("+") if name != "sink")
        raise NotImplementedError(
            f"attngen has no kernel with learned sinks{f' and {others}' if others else ''} for this call: it joins "
            "the sinks after the kernel without them, and their gradient from that output is not yet within "
            "FlashAttention's error rule. Pass sinks that need no gradient (sinks.detach(); q, k and v still get "
            "theirs)" + (f", or train the sinks without {others}" if others else ""))


def _attention_variant_setup(ctx, inputs, output):
    q, k, v, causal, alignment, scale, layout, window, softcap, alibi_slopes, deterministic, *sinks = inputs
    refuse_joined_sinks_gradient("forward", q, v, causal, window, softcap, alibi_slopes, sinks[0] if sinks else None)
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, alibi_slopes, *sinks)
    ctx.call = (causal, alignment, scale, layout, window, softcap, deterministic)
    ctx.mark_non_differentiable(lse)


def _attention_variant_gradients(ctx, grad_o, grad_lse, backward_call=None):
    q, k, v, o, lse, alibi_slopes, *sinks = ctx.saved_tensors
    causal, alignment, scale, layout, window, softcap, deterministic = ctx.call
    dq, dk, dv = (backward_call or torch.ops.attngen.attention_variant_backward)(
        grad_o, q, k, v, o, lse, causal, alignment, scale, layout, window, softcap, alibi_slopes, deterministic)
    # the ALiBi slopes get none, as FlashAttention's; learned sinks get theirs (the backward kernel
    # needs nothing of them: the LSE it is given holds them)
    dsinks = [sink_gradient(grad_o, o, lse, s, layout) if s is not None and s.requires_grad else None for s in sinks]
    return (dq, dk, dv, None, None, None, None, None, None, None, None, *dsinks)


def _attention_varlen_setup(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, alignment, scale, deterministic = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k)
    ctx.call = (max_seqlen_q, max_seqlen_k, causal, alignment, scale, deterministic)
    ctx.mark_non_differentiable(lse)


def _attention_varlen_gradients(ctx, grad_o, grad_lse, backward_call=None):
    q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
    dq, dk, dv = (backward_call or torch.ops.attngen.attention_varlen_backward)(
        grad_o, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, *ctx.call)
    return dq, dk, dv, None, None, None, None, None, None, None, None   # none for the offsets and options


def _attention_varlen_variant_setup(ctx, inputs, output):
    (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, alignment, scale, window, softcap,
     alibi_slopes, deterministic, *sinks) = inputs
    refuse_joined_sinks_gradient("varlen", q, v, causal, window, softcap, alibi_slopes, sinks[0] if sinks else None,
                                 paged=False)
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, *sinks)
    ctx.call = (max_seqlen_q, max_seqlen_k, causal, alignment, scale, window, softcap)
    ctx.deterministic = deterministic
    ctx.mark_non_differentiable(lse)


def _attention_varlen_variant_gradients(ctx, grad_o, grad_lse, backward_call=None):
    q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, *sinks = ctx.saved_tensors
    max_seqlen_q, max_seqlen_k, causal, alignment, scale, window, softcap = ctx.call
    dq, dk, dv = (backward_call or torch.ops.attngen.attention_varlen_variant_backward)(
        grad_o, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, alignment, scale,
        window, softcap, alibi_slopes, ctx.deterministic)
    dsinks = [varlen_sink_gradient(grad_o, o, lse, s) if s is not None and s.requires_grad else None for s in sinks]
    # none for the offsets, lengths and options (11 of them), the sinks their own
    return (dq, dk, dv, None, None, None, None, None, None, None, None, None, None, None, *dsinks)


torch.library.register_autograd("attngen::attention_train", _attention_gradients, setup_context=_attention_setup,
                                lib=LIB)
torch.library.register_autograd("attngen::attention_variant_train", _attention_variant_gradients,
                                setup_context=_attention_variant_setup, lib=LIB)
torch.library.register_autograd("attngen::attention_varlen_train", _attention_varlen_gradients,
                                setup_context=_attention_varlen_setup, lib=LIB)
torch.library.register_autograd("attngen::attention_varlen_variant_train", _attention_varlen_variant_gradients,
                                setup_context=_attention_varlen_variant_setup, lib=LIB)

# the native library loaded now where it is built (no build is started here; ATTNGEN_NATIVE_OPS=0: not), so that its
# kernels stand in front of attention_train's and attention_backward's before any thread calls them (take_ops)
if _native.ops_enabled():
    _native.load_built(torch)



# The eager training calls: the same forward, saved tensors and backward as the registered ops, as a
# torch.autograd.Function called directly. Through the op, register_autograd's wrapper refills the
# schema's defaults on every call (it builds the op's argument list anew for each argument) and the
# dispatcher redispatches twice: a training step's host time was 1.4-1.6x this path's (552-643 against
# 350-446 CPU µs, H200 host, docs/backward-h200/train_step_host.py; docs/performance.md, "Backward"). torch.compile
# traces the ops (attention() takes them while compiling), and tensors off the GPU take them too.
# attention() takes _PreparedTrain and _PreparedVariantTrain instead, prepared once per shape; its calls
# whose sinks are joined after the kernel (join_sinks) take this path.
_EAGER = {   # call -> (forward, save, gradients, backward)
    "attention_variant": (attention_variant_train_cuda, _attention_variant_setup, _attention_variant_gradients,
                          attention_variant_backward_cuda),
    "attention_varlen": (attention_varlen_train_cuda, _attention_varlen_setup, _attention_varlen_gradients,
                         attention_varlen_backward_cuda),
    "attention_varlen_variant": (attention_varlen_variant_train_cuda, _attention_varlen_variant_setup,
                                 _attention_varlen_variant_gradients, attention_varlen_variant_backward_cuda),
}


class _EagerTrain(torch.autograd.Function):
    @staticmethod
    def forward(ctx, call, *inputs):
        run, save, _, _ = _EAGER[call]
        output = run(*inputs)
        save(ctx, inputs, output)
        ctx.eager_call = call
        return output

    @staticmethod
    def backward(ctx, grad_o, grad_lse):
        _, _, gradients, backward_call = _EAGER[ctx.eager_call]
        return (None, *gradients(ctx, grad_o, grad_lse, backward_call))


def train(call: str, *inputs):
    """The eager training call `call` (attention_variant, attention_varlen, attention_varlen_variant;
    attention off the GPU, whose GPU calls take train_attention) on the inputs of its
    attngen::<call>_train op: (o, lse), differentiable in q, k and v. Tensors off the GPU take the op
    itself (the CPU stand-ins of the ops' tests implement it)."""
    if not inputs[0].is_cuda:
        return getattr(torch.ops.attngen, f"{call}_train")(*inputs)
    return _EagerTrain.apply(call, *inputs)


# attention()'s eager training call, prepared once per shape in both directions: a step makes one key (the
# forward's) and one dict get, and its backward, on autograd's device thread, no table lookup, key or
# argument check. Python's host time counts twice there: on the H200 host a backward body that took 42 us
# on the calling thread took 71 us on autograd's thread (out of the calling thread's caches), and a step
# 230 us against SDPA's 138 (docs/backward-h200/train_step_host_pieces.py; docs/performance/backward.md,
# "The eager training call prepared once per shape").
_TRAIN: dict = {}    # call_key with `deterministic` in return_lse's place -> _PreparedStep


class _PreparedStep:
    """One shape's training call: the backward's kernel (the table's, looked up once) and, from the first
    call on, the forward's and the backward's prepared calls, with the dout strides the backward's was
    laid out for. What a prepared call cannot take (a pointer off 16 bytes, a dout in other strides: a
    sum's gradient is expanded) takes the full call, as the first step did. Head dims padded to a served
    one (the kernels see padded copies) always take the full calls. `variants`: a call's window (a
    tuple) and softcap, or None for a call without variants; its ALiBi slopes and learned sinks come
    with each call (the step's key holds their addresses, which the prepared calls read them at; the
    step keeps no tensor). `native`: the C++ step (attngen/runtime/native: the same prepared calls
    replayed from a C++ autograd node, the sinks' gradient from delta there too) once its library is
    loaded, else None (the ops take it by `native_address`, an int: cheaper to pass than the object);
    `native_pending`: whether one may still be made."""

    __slots__ = ("forward_kernel", "forward_prepared", "gradient_kernel", "gradient_prepared", "dout_stride",
                 "options", "prepares", "variants", "native", "native_address", "native_pending",
                 "output_strides")

    def __init__(self, gradient_kernel, options, prepares: bool, variants=None):
        self.forward_kernel = self.forward_prepared = self.gradient_prepared = self.dout_stride = None
        self.native = self.native_address = self.output_strides = None
        self.native_pending = prepares
        self.gradient_kernel = gradient_kernel
        self.options = options     # causal, alignment, scale, layout, deterministic
        self.prepares = prepares   # the kernels take the call's own tensors (no padding)
        self.variants = variants

    def outputs(self, q, k, v, alibi_slopes=None, sinks=None):
        """(o, lse): the prepared forward, or the full one (remembering its prepared call)."""
        if self.forward_prepared is not None:
            result = self.forward_kernel.run_prepared(self.forward_prepared, q, k, v, True)
            if result is not None:
                return result
        causal, alignment, scale, layout, _ = self.options
        if self.variants is None:
            result = forward(q, k, v, causal, alignment, scale, layout, True)
            hit = _PREPARED.get(call_key(q, k, v, causal, alignment, scale, True, layout)) if self.prepares else None
        else:
            window, softcap = self.variants
            result = forward_variant(q, k, v, causal, alignment, scale, layout, True, window, softcap, alibi_slopes,
                                     sinks)
            hit = self._variant_forward(q, k, v, alibi_slopes, sinks) if self.prepares else None
        if hit is not None and self.forward_prepared is None:
            self.forward_kernel, self.forward_prepared = hit
            self.output_strides = (result[0].stride(), result[1].stride())
        return result

    def takes(self, out, lse) -> bool:
        """Whether a backward of this step may replay its prepared call on `out` and `lse` (those of
        the prepared forward's strides; a compiled graph's backward gets them from its forward)."""
        return self.output_strides is not None and (out.stride(), lse.stride()) == self.output_strides

    def _variant_forward(self, q, k, v, alibi_slopes, sinks):
        """(kernel, prepared call) of the variant forward just made, or None (sinks joined apart, a padded
        call: no kernel of the call's own tensors)."""
        causal, alignment, scale, layout, _ = self.options
        window, softcap = self.variants
        kernel = _VARIANT.get(_variant_kernel_key(q, k, v, causal, layout, window, softcap, alibi_slopes, sinks,
                                                  alignment))
        if kernel is None or kernel is _SINKS_APART or kernel is ONE_ROW_DECODE_VARIANT:
            return None
        prepared = kernel.prepared(call_key(q, k, v, causal, alignment, scale, True, layout,
                                            variant_key(window, softcap, alibi_slopes, sinks=sinks)))
        return None if prepared is None else (kernel, prepared)

    def gradients(self, dout, q, k, v, o, lse, hooked: bool = False, alibi_slopes=None, return_delta=False):
        """(dq, dk, dv): the prepared backward, or the full one (remembering its prepared call when it
        read dout in place). `hooked`: saved-tensor hooks were active when the forward saved q, k, v, o
        and lse, so these may be other tensors than those (torch.autograd.graph.save_on_cpu gives
        contiguous copies; checkpointing recomputes them), in layouts the prepared call was not made
        for: the full call checks them. return_delta: (dq, dk, dv, delta) (the backward's)."""
        if dout.stride() == self.dout_stride and not hooked:
            result = self.gradient_kernel.run_prepared(self.gradient_prepared, q, k, v, o, lse, dout, return_delta)
            if result is not None:
                if self.native_pending:
                    self._make_native(q, k, v, o, lse, dout)
                return result
        causal, alignment, scale, layout, deterministic = self.options
        window, softcap = self.variants or (None, None)
        result = backward(dout, q, k, v, o, lse, causal, alignment, scale, layout, window, softcap, alibi_slopes,
                          deterministic=deterministic, return_delta=return_delta)
        if self.prepares and self.dout_stride is None and not hooked and _vector_ready(dout):
            variants = {} if self.variants is None else {"window": window, "softcap": softcap,
                                                         "alibi_slopes": alibi_slopes}
            prepared = self.gradient_kernel.prepared_call(q, k, v, o, lse, dout, causal=causal, alignment=alignment,
                                                          scale=scale, layout=layout, deterministic=deterministic,
                                                          **variants)
            if prepared is not None:
                self.gradient_prepared, self.dout_stride = prepared, dout.stride()
        return result

    def _make_native(self, q, k, v, o, lse, dout) -> None:
        """The native step from the two prepared calls (made on these tensors), once its library is
        loaded (native.ready: built before, or being built in the background); none, for good, where
        a kernel takes no native replay or the library cannot be had. One thread at a time decides
        (_native_making): the ops take a step by its address, so a step, once made, is never replaced
        (replacing it would free the one another thread's call may be reading)."""
        with _native_making:
            if not self.native_pending or self.native is not None:
                return
            self._make_native_once(q, k, v, o, lse, dout)

    def _make_native_once(self, q, k, v, o, lse, dout) -> None:
        if self.forward_prepared is None or not q.is_cuda or _native.unavailable():
            self.native_pending = False
            return
        if not _native.ready(torch):
            self.native_pending = not _native.unavailable()
            return
        self.native_pending = False
        try:
            forward = self.forward_kernel.native_forward(self.forward_prepared, q, k, v, o)
            backward = self.gradient_kernel.native_backward(self.gradient_prepared, q, k, v, o, lse, dout)
            step = None if forward is None or backward is None else _native.make_step(
                torch, self.forward_prepared, forward, self.gradient_prepared, backward, self.options, self.variants)
            if step is not None:
                self.native_address, self.native = step.address(), step
        except Exception as exc:    # the shape keeps the Python node; the step itself never fails for this
            warnings.warn(f"attngen: no native training step for this shape ({type(exc).__name__}: {exc}); "
                          f"it keeps the Python autograd node", RuntimeWarning, stacklevel=2)
            return
        if self.native is not None and self._serves_ops(q, k, v):   # the ops' native kernels too
            try:
                _native.register_step(torch, self.native, q, k, v, self.output_strides)
            except Exception as exc:   # the ops keep their Python kernels for this shape
                warnings.warn(f"attngen: the native op kernels do not serve this shape ({type(exc).__name__}: "
                              f"{exc}); attngen's ops keep their Python kernels for it", RuntimeWarning, stacklevel=2)

    def _serves_ops(self, q, k, v) -> bool:
        """Whether the ops' native kernels may replay this step: a plain call's, whose options are of the
        types the ops pass (the C++ key holds them as the step does: bool, float, str), and the step _TRAIN
        holds for its key (not one a cleared cache left to an autograd node, or a twin another thread made)."""
        causal, alignment, scale, layout, deterministic = self.options
        if self.variants is not None or type(causal) is not bool or type(deterministic) is not bool:
            return False
        if not (scale is None or type(scale) is float) or not (alignment is None or type(alignment) is str):
            return False
        try:
            return _TRAIN.get(call_key(q, k, v, causal, alignment, scale, deterministic, layout)) is self
        except (AttributeError, TypeError):
            return False


_native_making = threading.Lock()   # _PreparedStep._make_native: one thread at a time


_top_saved_tensor_hooks = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)


_tracing_state = torch._C._get_tracing_state


def _native_allowed() -> bool:
    """Whether a call may take its shape's native step: not under saved-tensor hooks (the Python node
    checks what they give back), and not while torch.jit.trace records the call (the trace would keep
    the step's address as a constant, past the step's life)."""
    return not _saved_tensor_hooks_active() and _tracing_state() is None


def _saved_tensor_hooks_active() -> bool:
    """Whether saved-tensor hooks are in force (torch.autograd.graph.saved_tensors_hooks: offloading,
    checkpointing): torch's own private query (torch 2.8 on; aot_autograd asks it too). Where it is
    missing or takes other arguments, assume they are: every backward then takes the full call."""
    try:
        return _top_saved_tensor_hooks(False) is not None
    except TypeError:
        return True


class _PreparedTrain(torch.autograd.Function):
    """attention()'s eager training call: what attngen::attention_train saves (_attention_setup) and
    runs, through one _PreparedStep."""

    @staticmethod
    def forward(ctx, step, q, k, v):
        output = step.outputs(q, k, v)
        _attention_setup(ctx, (q, k, v, *step.options), output)
        ctx.step, ctx.hooked = step, _saved_tensor_hooks_active()
        # the LSE takes no gradient: autograd would otherwise make a tensor of zeros for it each step
        ctx.set_materialize_grads(False)
        return output

    @staticmethod
    def backward(ctx, grad_o, grad_lse):
        if grad_o is None:   # no gradient reached o (an op after it gave none): none for q, k and v
            return None, None, None, None
        return (None, *ctx.step.gradients(grad_o, *ctx.saved_tensors, ctx.hooked))


class _PreparedVariantTrain(torch.autograd.Function):
    """_PreparedTrain for a call with a window, softcap, ALiBi slopes or learned sinks: the slopes and
    sinks are saved with the tensors (autograd then refuses a backward after they changed in place, as
    for the op). The sinks' gradient comes from the backward's delta (sink_gradient_from_delta)."""

    @staticmethod
    def forward(ctx, step, q, k, v, alibi_slopes, sinks):
        o, lse = output = step.outputs(q, k, v, alibi_slopes, sinks)
        ctx.save_for_backward(q, k, v, o, lse, alibi_slopes, sinks)
        ctx.mark_non_differentiable(lse)
        ctx.step, ctx.hooked = step, _saved_tensor_hooks_active()
        ctx.set_materialize_grads(False)   # as _PreparedTrain's
        return output

    @staticmethod
    def backward(ctx, grad_o, grad_lse):
        if grad_o is None:   # as _PreparedTrain's
            return (None,) * 6
        q, k, v, o, lse, alibi_slopes, sinks = ctx.saved_tensors
        if sinks is None or not ctx.needs_input_grad[5]:
            return (None, *ctx.step.gradients(grad_o, q, k, v, o, lse, ctx.hooked, alibi_slopes), None, None)
        dq, dk, dv, delta = ctx.step.gradients(grad_o, q, k, v, o, lse, ctx.hooked, alibi_slopes, True)
        return None, dq, dk, dv, None, sink_gradient_from_delta(delta, lse, sinks)


# torch.autograd.Function.apply is a Python wrapper whose work (binding defaults, unwrapping dead
# functorch wrappers) only functorch's transforms need; outside them its C++ base takes the call
# directly (about 7 us of a step less on the H200 host). Inside them the wrapper says what is unsupported.
_apply_prepared_train = super(torch.autograd.Function, _PreparedTrain).apply
_apply_prepared_variant_train = super(torch.autograd.Function, _PreparedVariantTrain).apply
_functorch_active = torch._C._are_functorch_transforms_active


# The native ops take a step by its address (_PreparedStep.native_address); the caller holds the
# _PreparedStep, and with it the step, for the call, and the autograd node keeps a reference of its own.
def _native_train(q, k, v, alibi_slopes, sinks, address):
    """attngen_native::train: the step's forward, its backward a C++ autograd node (the sinks' gradient
    from the backward's delta where they need one)."""
    return torch.ops.attngen_native.train.default(q, k, v, alibi_slopes, sinks, address)


def _native_forward(q, k, v, address):
    """attngen_native::forward: the step's forward alone (no autograd node: a compiled graph's)."""
    return torch.ops.attngen_native.forward.default(q, k, v, address)


def _native_backward(dout, q, k, v, out, lse, address):
    """attngen_native::backward: the step's backward alone."""
    return torch.ops.attngen_native.backward.default(dout, q, k, v, out, lse, address)


def _plain_step(q, k, v, causal, alignment, scale, layout, deterministic, make: bool = True):
    """The _PreparedStep of a training call without variants (made and remembered when `make`), or None
    where it has none: an argument no key can hold, tensors off the GPU, no backward spec (the full
    calls then say so)."""
    try:
        key = call_key(q, k, v, causal, alignment, scale, deterministic, layout)
        step = _TRAIN.get(key)
    except (AttributeError, TypeError):
        return None
    if step is not None or not make:
        return step if step is not _JOINED else None
    if not q.is_cuda:
        return None
    try:
        kernel = backward_kernel(q, k, v, causal, layout)
    except NotImplementedError:
        return None
    step = _new_step(kernel, q, v, (causal, alignment, scale, layout, deterministic))
    _remember_step(key, step)
    return step


_JOINED = object()   # a _TRAIN entry that says: the sinks are joined after the kernel (join_sinks), take train()


def train_attention(q, k, v, causal, alignment, scale, layout, deterministic, window=None, softcap=None,
                    alibi_slopes=None, sinks=None):
    """attention()'s eager call on tensors that need gradients: (o, lse), differentiable in q, k and v
    (and learned sinks that need one); with a window, softcap, ALiBi slopes or sinks the variant call.
    A new shape first makes sure a backward spec serves it (NotImplementedError before the forward
    runs); tensors off the GPU take the op (train), and so do sinks that no kernel of the call's other
    modifiers takes (joined after it: train refuses their gradient). Arguments no key can hold (a list
    for scale) get a step of their own, whose full calls say what is wrong."""
    plain = window is None and softcap is None and alibi_slopes is None and sinks is None
    try:
        variants = () if plain else variant_key(window, softcap, alibi_slopes, sinks=sinks)
        key = call_key(q, k, v, causal, alignment, scale, deterministic, layout, variants)
        if not (plain or _keyable_variants(window, softcap)):
            key = None     # keys would equate it with a checked call: full calls, which check it
        step = _TRAIN.get(key)
    except (AttributeError, TypeError):
        key = step = None
    if step is None:
        kernel = backward_kernel(q, k, v, causal, layout, window, softcap, alibi_slopes)
        if not q.is_cuda or (sinks is not None and _sinks_joined(q, v, causal, window, softcap, alibi_slopes)):
            if plain:
                return train("attention", q, k, v, causal, alignment, scale, layout, deterministic)
            if q.is_cuda:
                _remember_step(key, _JOINED)
            return _train_variant_op(q, k, v, causal, alignment, scale, layout, deterministic, window, softcap,
                                     alibi_slopes, sinks)
        step = _new_step(kernel, q, v, (causal, alignment, scale, layout, deterministic), key is not None,
                         None if plain else (None if window is None else tuple(window), softcap))
        _remember_step(key, step)
    elif step is _JOINED:
        return _train_variant_op(q, k, v, causal, alignment, scale, layout, deterministic, window, softcap,
                                 alibi_slopes, sinks)
    if plain:
        if _functorch_active():
            return _PreparedTrain.apply(step, q, k, v)
        if step.native is not None and _native_allowed():
            return _native_train(q, k, v, None, None, step.native_address)
        return _apply_prepared_train(step, q, k, v)
    if _functorch_active():
        return _PreparedVariantTrain.apply(step, q, k, v, alibi_slopes, sinks)
    if step.native is not None and _native_allowed():
        return _native_train(q, k, v, alibi_slopes, sinks, step.native_address)
    return _apply_prepared_variant_train(step, q, k, v, alibi_slopes, sinks)


def _new_step(kernel, q, v, options, keyed: bool = True, variants=None) -> _PreparedStep:
    """A shape's new _PreparedStep: it prepares its calls where it is kept under a key and the kernels
    take the call's own tensors (the spec's head dims are the call's: no padded copies)."""
    own_dims = (kernel.plan.head_dim, kernel.plan.v_dim) == (q.shape[-1], v.shape[-1])
    return _PreparedStep(kernel, options, keyed and own_dims, variants)


def _remember_step(key, step) -> None:
    """_TRAIN[key] = step (a key of None is not kept), the cache emptied first when it holds 4096."""
    if key is None:
        return
    if len(_TRAIN) >= 4096:
        forget_training_steps()
    _TRAIN[key] = step


def forget_training_steps() -> None:
    """Forget every shape's training step: _TRAIN and the native op kernels' registry alike."""
    _TRAIN.clear()
    _native.forget_steps(torch)


def _sinks_joined(q, v, causal, window, softcap, alibi_slopes) -> bool:
    """Whether the table joins learned sinks after the kernel of the call's other modifiers (no kernel
    has them all): the forward's choice (forward_variant)."""
    mask, scores = call_mask(causal, window), call_scores(softcap, alibi_slopes, True)
    return DISPATCH.sinks_apart("forward", q.get_device(), q.dtype, q.shape[-1], v.shape[-1], mask, scores)


def _train_variant_op(q, k, v, causal, alignment, scale, layout, deterministic, window, softcap, alibi_slopes, sinks):
    """train() of the variant op's inputs (its forward and backward calls, not prepared)."""
    return train("attention_variant", q, k, v, causal, alignment, scale, layout,
                 None if window is None else list(window), softcap, alibi_slopes, deterministic,
                 *(() if sinks is None else (sinks,)))


def _keyable_variants(window, softcap) -> bool:
    """Whether a call's window and softcap are of the types the full call accepts and a key tells apart:
    a window of two Python ints, a softcap a float or an int but no bool. Others (2.0 for 2, numpy ints,
    True for 1) compare equal to accepted ones in a key, so they take the full calls, which say what is
    wrong with them or run them."""
    return ((window is None or (len(window) == 2 and all(type(side) is int for side in window)))
            and (softcap is None or type(softcap) in (int, float)))


__all__ = ["LIB", "backward", "backward_kernel", "call_scores", "forward", "forward_variant", "kvcache", "kvcache_append",
           "kvcache_e4m3",
           "kvcache_variant",
           "train", "train_attention", "varlen", "varlen_backward", "varlen_backward_kernel"]
