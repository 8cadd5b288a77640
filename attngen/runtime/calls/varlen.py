"""The varlen call of a forward kernel whose spec sets `varlen: true`:
``kernel.varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=...)`` on torch tensors.

q is (total_q, Hq, D), k and v are (total_k, Hkv, D): the rows of every sequence back to back, as
a ragged prefill batch arrives (a spec with head_dim_v: v is (total_k, Hkv, Dv), o (total_q, Hq,
Dv)). cu_seqlens_q/k (int32, (batch + 1,), on the GPU) hold where each
sequence starts, then the end of the last: sequence b is rows cu[b]..cu[b+1]. One launch covers
the batch; the grid is (ceil(max_seqlen_q / block_m), heads, batch) and a block past its
sequence's last row returns at once, so short sequences cost no padded work.
"""
from __future__ import annotations

import numbers

from ...core.constants import LOG2E
from ...core.varlen_plan import varlen_key
from ..gpu import error_word
from ..kernel import LOAD_BYTES, MAX_GRID_X, VARLEN_LAYOUT, Prepared
from .shared import ATTENTION_FIELDS, ORDERS, check_sequences, offsets_on_host, variant_key

PER_CALL = ATTENTION_FIELDS + ("cu_seqlens_q", "cu_seqlens_k", "seq_order", "total_q", "total_k", "errors")
POINTERS = ("q", "k", "v", "o", "lse", "cu_seqlens_q", "cu_seqlens_k", "seq_order")


def varlen_call(kernel, q, k, v, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q: int | None = None,
                causal: bool = False, alignment: str | None = None, scale: float | None = None,
                return_lse: bool = False, out=None, lse_out=None, validate: bool = False, window=None,
                softcap: float | None = None, alibi_slopes=None, params: dict | None = None, sinks=None):
    """Attention of each varlen sequence against its own keys.

    causal: query row i of a sequence sees its keys j <= i ("top_left", the default, as the padded
    call) or j <= i + len_k - len_q ("bottom_right", FlashAttention's varlen convention); the two
    agree when each sequence has as many queries as keys. A row that sees no key gives zeros and
    LSE -inf. Returns o (total_q, Hq, D; V's head dim where the spec has head_dim_v), or (o, lse)
    with lse fp32 (Hq, total_q); `out` and `lse_out` (contiguous) receive them instead of new tensors.

    Nothing waits for the GPU by default: the kernel clamps every offset to the tensors, so a
    malformed table gives wrong rows but never an access outside them. max_seqlen_q (the longest
    query sequence, as FlashAttention takes it) sizes the grid; without it the grid covers
    total_q rows per sequence and the blocks past each sequence return at once (correct, a few
    microseconds slower for long batches). validate=True reads cu_seqlens back (one small
    device-to-host copy, for debugging): offsets must start at 0 or more, never decrease, end
    within q/k, and q and k must list the same number of sequences; max_seqlen_q, when given,
    must cover the longest query sequence.

    window, softcap and alibi_slopes as in the padded call, per sequence (a window's bottom_right
    alignment and ALiBi's offset use each sequence's own lengths; (B, Hq) slopes are per sequence).
    An expression spec's params= likewise: its b is the sequence, [batch] tensors have one element
    per sequence.
    """
    variants = variant_key(window, softcap, alibi_slopes, params, sinks)
    key = None
    if out is None and lse_out is None and not validate:
        # A shape seen before: its checks passed and its Params are laid out; only the pointers
        # are new (and must be 16-byte aligned).
        try:
            key = (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype, v.dtype,
                   q.get_device(), k.get_device(), v.get_device(), cu_seqlens_q.shape, cu_seqlens_k.shape,
                   cu_seqlens_q.dtype, cu_seqlens_k.dtype, cu_seqlens_q.stride(), cu_seqlens_k.stride(),
                   cu_seqlens_q.get_device(), cu_seqlens_k.get_device(), max_seqlen_q, causal, alignment, scale,
                   return_lse, variants)
            prepared = kernel._prepared.get(key)
        except (AttributeError, TypeError):
            key = prepared = None
        if prepared is not None:
            qp, kp, vp = q.data_ptr(), k.data_ptr(), v.data_ptr()
            if not (qp | kp | vp) % LOAD_BYTES:
                torch = kernel._torch
                out = kernel._new_output(q)       # like q, with V's head dim where it differs
                lse_shape, shape_maps = prepared.extra
                lse = q.new_empty(lse_shape, dtype=torch.float32) if return_lse else None
                batch = cu_seqlens_k.shape[0] - 1
                order = ORDERS.longest_first(torch, cu_seqlens_k, batch, prepared.info.index) if batch > 1 else None
                op = out.data_ptr()
                pointers = (qp, kp, vp, op, lse.data_ptr() if return_lse else 0, cu_seqlens_q.data_ptr(),
                            cu_seqlens_k.data_ptr(), order.data_ptr() if order is not None else 0)
                if shape_maps is not None:
                    pointers += shape_maps.values((qp, kp, vp, op))
                kernel._run(prepared, pointers)
                return (out, lse) if return_lse else out
    index, total_q, heads, total_k, kv_heads, batch = check_sequences(kernel, q, k, v, cu_seqlens_q, cu_seqlens_k)
    mask = kernel._check_mask(causal, window)
    if max_seqlen_q is not None and (isinstance(max_seqlen_q, bool) or not isinstance(max_seqlen_q, numbers.Integral)
                                     or max_seqlen_q < 0):
        raise ValueError(f"max_seqlen_q must be a non-negative integer (got {max_seqlen_q!r})")
    if validate:
        longest = max(offsets_on_host("cu_seqlens_q", cu_seqlens_q, total_q, "q.shape[0]"))
        offsets_on_host("cu_seqlens_k", cu_seqlens_k, total_k, "k.shape[0]")
        if max_seqlen_q is not None and max_seqlen_q < longest:
            raise ValueError(f"max_seqlen_q is {max_seqlen_q} but a query sequence has {longest} rows; pass at least "
                             f"{longest} (or leave it unset)")
        max_seqlen_q = longest if max_seqlen_q is None else int(max_seqlen_q)
    elif max_seqlen_q is None:
        max_seqlen_q = total_q          # covers any sequence; blocks past a sequence's end return at once
    else:
        max_seqlen_q = min(int(max_seqlen_q), total_q)
    scale = kernel._check_scale(scale)

    out = kernel._output(out, q, VARLEN_LAYOUT, index)
    lse_out, return_lse = kernel._lse_output(lse_out, return_lse, (heads, total_q), index)
    if not max_seqlen_q:
        return (out, lse_out) if return_lse else out      # no query rows: nothing to write
    if not total_k:                                         # no keys at all
        return kernel._no_keys(out, lse_out, return_lse)
    info = kernel._device(index)
    plan = kernel.plan
    grid = plan.varlen_grid(batch, heads, max_seqlen_q)
    if grid[0] > MAX_GRID_X:
        raise ValueError(f"max_seqlen_q {max_seqlen_q} needs more than {MAX_GRID_X} blocks")
    packer = kernel._varlen_packer
    if packer is None:
        packer = kernel._varlen_packer = plan.abi.packer(PER_CALL + tuple(f.name for f in kernel._mask_fields) +
                                                         kernel._map_fields)
    sq, sk, sv, so = q.stride(), k.stride(), v.stride(), out.stride()
    order = ORDERS.longest_first(kernel._torch, cu_seqlens_k, batch, index) if batch > 1 else None
    values = [q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse_out.data_ptr() if return_lse else 0,
              0, sq[1], sq[0], 0, sk[1], sk[0], 0, sv[1], sv[0], 0, so[1], so[0],
              0, total_q, batch, heads, kv_heads, max_seqlen_q, 0, scale * LOG2E,
              cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr(), order.data_ptr() if order is not None else 0,
              total_q, total_k, error_word(index)]
    # Lengths 0: each sequence adds its own offsets (mask_for_sequence; ALiBi reads its lengths).
    mask_values = kernel._variant_values(mask, causal, alignment, window, 0, 0, scale,
                                         {"softcap": softcap, "alibi_slopes": alibi_slopes, "params": params,
                                          "sinks": sinks},
                                         {"batch": batch, "heads": heads, "device": index})
    values[PER_CALL.index("scale_log2")] = mask_values.pop("scale_log2", scale * LOG2E)
    for f in kernel._mask_fields:
        values.append(mask_values.get(f.name, f.default))
    shape_maps = packed_maps(kernel, q, k, v, out)
    maps = shape_maps.values(tuple(values[:4])) if shape_maps is not None else ()
    values.extend(maps)
    prepared = Prepared(info, kernel._launches(info, (kernel.entry[varlen_key(mask)], grid)), packer.pack(values),
                        _patch(kernel), ((heads, total_q), shape_maps))
    kernel._remember(key, prepared)   # no key when the caller gave out or lse_out, or validates
    kernel._run(prepared, tuple(values[:5]) + tuple(values[25:28]) + maps)
    return (out, lse_out) if return_lse else out


def _patch(kernel):
    """The pointer fields a varlen call patches: q, k, v, o, lse, the offsets and the order (and
    the tensor maps of a kernel that reads through them)."""
    patch = getattr(kernel, "_varlen_patch", None)
    if patch is None:
        patch = kernel._varlen_patch = kernel.plan.abi.patch(POINTERS + kernel._map_fields)
    return patch


def packed_maps(kernel, q, k, v, out):
    """The TMA tensor maps of a varlen call's shape, or None for a kernel without them: each packed
    (total, heads, dim) tensor seen as one batch of `total` rows per head, (1, heads, total, dim).
    A block addresses its sequence's rows by coordinates (the kind's MapOrigin); rows past the
    tensor's end load as zeros."""
    if not kernel._map_fields:
        return None
    from ..tma import ShapeMaps
    views = {name: t.unsqueeze(0).transpose(1, 2) for name, t in (("q", q), ("k", k), ("v", v), ("o", out))}
    return ShapeMaps(kernel.plan.tensor_maps, views)


def cu_seqlens(torch, lengths, device):
    """The int32 offsets (batch + 1,) of sequences of `lengths` packed back to back: 0, l0, l0 + l1, ..."""
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + int(n))
    return torch.tensor(offsets, dtype=torch.int32, device=device)


__all__ = ["cu_seqlens", "varlen_call"]
