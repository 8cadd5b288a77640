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

from operator import itemgetter

from ...core.constants import LOG2E
from ...core.launch_rules import page_box_rows, page_shift
from ...core.varlen_plan import MAX_PAGE_SIZE, PAGED_VARLEN_FIELDS, varlen_key
from ..gpu import error_word
from ..kernel import LOAD_BYTES, MAX_GRID_X, MAX_GRID_YZ, VARLEN_LAYOUT, Prepared
from .shared import (ATTENTION_FIELDS, INT32_MAX, ORDERS, check_max_seqlen_q, check_offsets, check_page_ids,
                     check_sequences, offsets_on_host, layout_key, query_rows, variant_key)

PER_CALL = ATTENTION_FIELDS + ("cu_seqlens_q", "cu_seqlens_k", "seq_order", "total_q", "total_k", "errors")
POINTERS = ("q", "k", "v", "o", "lse", "cu_seqlens_q", "cu_seqlens_k", "seq_order")
PAGED_POINTERS = POINTERS + ("block_table", "seqused_k")
# Each call's pointer values, picked from the values it packs by name: PER_CALL's first, then a paged call's
# page fields, which follow the mask fields (counted from the end of PAGED_VARLEN_FIELDS).
POINTER_VALUES = itemgetter(*(PER_CALL.index(n) for n in POINTERS))
PAGED_POINTER_VALUES = itemgetter(*(PER_CALL.index(n) for n in POINTERS),
                                  *(PAGED_VARLEN_FIELDS.index(n) - len(PAGED_VARLEN_FIELDS) for n in PAGED_POINTERS[len(POINTERS):]))


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
    if lse_out is None and not validate:
        # A shape seen before: its checks passed and its Params are laid out; only the pointers
        # are new (and must be 16-byte aligned). A caller's out joins the key by its layout.
        try:
            key = (layout_key(q), layout_key(k), layout_key(v), layout_key(cu_seqlens_q), layout_key(cu_seqlens_k),
                   max_seqlen_q, causal, alignment, scale, return_lse, variants) + (
                (layout_key(out),) if out is not None else ())
            prepared = kernel._prepared.get(key)
        except (AttributeError, TypeError):
            key = prepared = None
        if prepared is not None:
            qp, kp, vp = q.data_ptr(), k.data_ptr(), v.data_ptr()
            if not (qp | kp | vp | (0 if out is None else out.data_ptr())) % LOAD_BYTES:
                torch = kernel._torch
                if out is None:
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
    mask = kernel._check_mask(causal, window, varlen=True)
    check_max_seqlen_q(max_seqlen_q)
    longest = None
    if validate:
        longest = max(offsets_on_host("cu_seqlens_q", cu_seqlens_q, total_q, "q.shape[0]"))
        offsets_on_host("cu_seqlens_k", cu_seqlens_k, total_k, "k.shape[0]")
    max_seqlen_q = query_rows(max_seqlen_q, total_q, longest)
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
    kernel._remember(key, prepared)   # no key when the caller gave lse_out, or validates
    kernel._run(prepared, POINTER_VALUES(values) + maps)
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


def paged_varlen_call(kernel, q, k, v, cu_seqlens_q, block_table, *, seqused_k=None, cu_seqlens_k=None,
                      max_seqlen_q: int | None = None, causal: bool = False, alignment: str | None = None,
                      scale: float | None = None, return_lse: bool = False, out=None, lse_out=None,
                      validate: bool = False, window=None, softcap: float | None = None, alibi_slopes=None,
                      sinks=None, order_by=None, single_queries_apart: bool = False):
    """Varlen attention whose keys lie in page pools (a spec with `paged: true`), as FlashAttention's
    flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, ..., block_table=, seqused_k=).

    q (total_q, Hq, D) packed by cu_seqlens_q (int32, batch + 1). k and v are page pools in
    FlashAttention's layout, (num_pages, page_size, Hkv, D), any strides with the last dim contiguous
    (a decode pool (num_pages, Hkv, page_size, D) serves as pool.transpose(1, 2)); page_size a power of
    two from 1 to 512. block_table int32 (batch, max_pages), rows contiguous: key j of sequence b lies in
    page block_table[b, j // page_size], row j % page_size. seqused_k int32 (batch,) gives each
    sequence's keys; without it they are cu_seqlens_k[b + 1] - cu_seqlens_k[b] (one of the two is needed).
    A sequence's keys are clamped to max_pages x page_size and a page id to the pool (recorded as input
    errors, attngen.check_errors()). Causal "bottom_right" aligns each sequence's queries with the end of
    its keys (prefill chunks and single decode tokens in one call). validate=True reads the offsets,
    lengths and the pages they use back and refuses bad ones. causal or a window without an alignment is
    "bottom_right" here (FlashAttention's paged varlen call has no other); "top_left" may be asked for.
    window=(left, right) as in the packed varlen call, from each sequence's own key count (a spec whose
    masks include window); softcap, alibi_slopes and sinks as there, for a spec whose scores take them
    (ALiBi's offset from each sequence's own key count). order_by=(seqused_k, cu_seqlens_k): the key counts
    whose longest-first order the blocks take (default this call's; a serving step passes the caller's, which
    every layer shares, so one order serves them all); the order changes the schedule, never the result.
    single_queries_apart: the call's sequences of exactly one query are left alone (neither read nor written):
    a serving step's decode rows, which the paged decode kernel's rows call writes into the same out."""
    torch = kernel._torch
    order_seqused, order_cu = (seqused_k, cu_seqlens_k) if order_by is None else \
        order_by if isinstance(order_by, tuple) and len(order_by) == 2 else (None, None)   # refused below
    key = None
    if lse_out is None and not validate:
        # A layout seen before: its checks passed and its Params are laid out; only the pointers are new
        # (q, k, v and a caller's out must be 16-byte aligned). The table's and the lengths' values are
        # read by the kernel, never here, so they are not part of the key.
        try:
            key = ("paged", layout_key(q), layout_key(k), layout_key(v), layout_key(cu_seqlens_q),
                   layout_key(block_table), None if seqused_k is None else layout_key(seqused_k),
                   None if cu_seqlens_k is None else layout_key(cu_seqlens_k), max_seqlen_q, causal, alignment,
                   scale, return_lse, variant_key(window, softcap, alibi_slopes, None, sinks),
                   None if out is None else layout_key(out), bool(single_queries_apart))
            prepared = kernel._prepared.get(key)
        except (AttributeError, TypeError):
            key = prepared = None
        if prepared is not None:
            qp, kp, vp = q.data_ptr(), k.data_ptr(), v.data_ptr()
            if not (qp | kp | vp | (0 if out is None else out.data_ptr())) % LOAD_BYTES:
                if out is None:
                    out = kernel._new_output(q)
                lse_shape, batch, shape_maps = prepared.extra
                if order_by is not None:     # not in the key: checked on every call that gives it
                    check_order_by(torch, order_by, batch, prepared.info.index)
                lse = q.new_empty(lse_shape, dtype=torch.float32) if return_lse else None
                order = sequence_order(torch, order_seqused, order_cu, batch, prepared.info.index)
                op = out.data_ptr()
                pointers = (qp, kp, vp, op, lse.data_ptr() if return_lse else 0, cu_seqlens_q.data_ptr(),
                            0 if cu_seqlens_k is None else cu_seqlens_k.data_ptr(),
                            0 if order is None else order.data_ptr(), block_table.data_ptr(),
                            0 if seqused_k is None else seqused_k.data_ptr())
                if shape_maps is not None:
                    pointers += shape_maps.values((qp, kp, vp, op))
                kernel._run(prepared, pointers)
                return (out, lse) if return_lse else out
    if not getattr(kernel.plan, "paged", False):
        raise ValueError(f"{kernel.label} reads packed K/V only: block_table needs a spec with paged: true")
    index = kernel._device_index(q)
    total_q, heads, _ = kernel._check_tensor("q", q, VARLEN_LAYOUT, index)
    kernel._check_tensor("k", k, "bshd", index)
    kernel._check_tensor("v", v, "bshd", index, v_dim=True)
    num_pages, page, kv_heads, _ = k.shape
    if tuple(v.shape[:-1]) != tuple(k.shape[:-1]):
        raise ValueError(f"k and v must be page pools of one shape, (num_pages, page_size, kv_heads, head_dim) (got "
                         f"{tuple(k.shape)} and {tuple(v.shape)})")
    if num_pages < 1:
        raise ValueError("the page pools hold no page (k.shape[0] is 0); a paged call needs num_pages >= 1")
    shift = page_shift(page)
    if shift is None or page > MAX_PAGE_SIZE:
        raise ValueError(f"page_size must be a power of two from 1 to {MAX_PAGE_SIZE} (the pools hold pages of "
                         f"{page} keys: k.shape[1])")
    if num_pages > INT32_MAX:
        raise ValueError(f"{num_pages} pages exceed int32 page ids")
    kernel._check_heads(heads, kv_heads, heads=heads)
    if not kernel.varlen_masks:
        raise ValueError(f"{kernel.label} has no varlen functions: add `varlen: true` to its spec")
    if total_q > INT32_MAX:
        raise ValueError(f"varlen tensors of more than {INT32_MAX} rows do not fit int32 offsets")
    batch = check_offsets(torch, "cu_seqlens_q", cu_seqlens_q, index)
    if batch > MAX_GRID_YZ:
        raise ValueError(f"{batch} sequences exceed {MAX_GRID_YZ} (grid z limit)")
    if not isinstance(block_table, torch.Tensor):
        raise TypeError(f"block_table must be a torch.Tensor of int32 (got {type(block_table).__name__})")
    if block_table.dtype != torch.int32:
        raise TypeError(f"block_table must be int32 (got {block_table.dtype}); pass block_table.int()")
    if block_table.dim() != 2 or block_table.shape[0] != batch or block_table.shape[1] < 1 or \
            (block_table.shape[1] > 1 and block_table.stride(1) != 1):
        raise ValueError(f"block_table must be ({batch}, max_pages) int32, max_pages >= 1, with contiguous rows "
                         f"(got shape {tuple(block_table.shape)}, strides {tuple(block_table.stride())})")
    if block_table.get_device() != index:
        raise ValueError(f"block_table is on {block_table.device} but q is on cuda:{index}")
    if block_table.shape[1] * page > INT32_MAX or block_table.stride(0) > INT32_MAX:
        raise ValueError(f"block_table's {block_table.shape[1]} pages of {page} keys exceed {INT32_MAX} keys per "
                         "sequence")
    if seqused_k is not None:
        if not isinstance(seqused_k, torch.Tensor):
            raise TypeError(f"seqused_k must be a torch.Tensor of int32 (got {type(seqused_k).__name__})")
        if seqused_k.dtype != torch.int32:
            raise TypeError(f"seqused_k must be int32 (got {seqused_k.dtype}); pass seqused_k.int()")
        if seqused_k.dim() != 1 or seqused_k.shape[0] != batch or not seqused_k.is_contiguous():
            raise ValueError(f"seqused_k must be a contiguous ({batch},) tensor, one key count per sequence (got "
                             f"shape {tuple(seqused_k.shape)})")
        if seqused_k.get_device() != index:
            raise ValueError(f"seqused_k is on {seqused_k.device} but q is on cuda:{index}")
    elif cu_seqlens_k is None:
        raise ValueError("a paged varlen call needs seqused_k (int32, the keys of each sequence) or cu_seqlens_k")
    if cu_seqlens_k is not None and check_offsets(torch, "cu_seqlens_k", cu_seqlens_k, index) != batch:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must list the same sequences (got {cu_seqlens_q.numel()} "
                         f"and {cu_seqlens_k.numel()} offsets)")
    mask = kernel._check_mask(causal, window, varlen=True)
    if mask != "none" and alignment is None:
        alignment = "bottom_right"      # FlashAttention's varlen convention: the queries are a sequence's last keys
    check_max_seqlen_q(max_seqlen_q)
    longest = None
    if validate:
        longest = max(offsets_on_host("cu_seqlens_q", cu_seqlens_q, total_q, "q.shape[0]"))
        if seqused_k is not None:
            lens = seqused_k.tolist()
        else:
            lens = offsets_on_host("cu_seqlens_k", cu_seqlens_k, INT32_MAX, "int32")
        capacity = block_table.shape[1] * page
        for b, n in enumerate(lens):
            if not 0 <= n <= capacity:
                raise ValueError(f"sequence {b} has {n} keys; a row of block_table holds 0 to {capacity} "
                                 f"({block_table.shape[1]} pages of {page})")
        check_page_ids(torch, block_table, torch.tensor(lens, device=block_table.device), num_pages, page)
    max_seqlen_q = query_rows(max_seqlen_q, total_q, longest)
    scale = kernel._check_scale(scale)
    out = kernel._output(out, q, VARLEN_LAYOUT, index)
    lse_out, return_lse = kernel._lse_output(lse_out, return_lse, (heads, total_q), index)
    if not max_seqlen_q:
        return (out, lse_out) if return_lse else out
    info = kernel._device(index)
    plan = kernel.plan
    grid = plan.varlen_grid(batch, heads, max_seqlen_q)
    if grid[0] > MAX_GRID_X:
        raise ValueError(f"max_seqlen_q {max_seqlen_q} needs more than {MAX_GRID_X} blocks")
    packer = getattr(kernel, "_paged_varlen_packer", None)
    if packer is None:
        packer = kernel._paged_varlen_packer = plan.abi.packer(
            PER_CALL + tuple(f.name for f in kernel._mask_fields) + PAGED_VARLEN_FIELDS + kernel._map_fields)
    sq, sk, sv, so = q.stride(), k.stride(), v.stride(), out.stride()
    if order_by is not None:
        check_order_by(torch, order_by, batch, index)
    order = sequence_order(torch, order_seqused, order_cu, batch, index)
    # k and v: batch stride 0 (the pools' page 0), head stride sk[2], row stride sk[1]; pages by k_page_stride
    values = [q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse_out.data_ptr() if return_lse else 0,
              0, sq[1], sq[0], 0, sk[2], sk[1], 0, sv[2], sv[1], 0, so[1], so[0],
              0, total_q, batch, heads, kv_heads, max_seqlen_q, 0, scale * LOG2E,
              cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr() if cu_seqlens_k is not None else 0,
              order.data_ptr() if order is not None else 0, total_q, 0, error_word(index)]
    mask_values = kernel._variant_values(mask, causal, alignment, window, 0, 0, scale,
                                         {"softcap": softcap, "alibi_slopes": alibi_slopes, "params": None,
                                          "sinks": sinks},
                                         {"batch": batch, "heads": heads, "device": index})
    values[PER_CALL.index("scale_log2")] = mask_values.pop("scale_log2", scale * LOG2E)
    for f in kernel._mask_fields:
        values.append(mask_values.get(f.name, f.default))
    values += [block_table.data_ptr(), seqused_k.data_ptr() if seqused_k is not None else 0, sk[0], sv[0],
               block_table.stride(0), block_table.shape[1], num_pages, page, shift, int(bool(single_queries_apart))]
    shape_maps = paged_maps(kernel, q, k, v, out, page)
    maps = shape_maps.values(tuple(values[:4])) if shape_maps is not None else ()
    pointers = PAGED_POINTER_VALUES(values) + maps
    values.extend(maps)
    patch = getattr(kernel, "_paged_varlen_patch", None)
    if patch is None:
        patch = kernel._paged_varlen_patch = plan.abi.patch(PAGED_POINTERS + kernel._map_fields)
    prepared = Prepared(info, kernel._launches(info, (kernel.entry[varlen_key(mask)], grid)), packer.pack(values),
                        patch, ((heads, total_q), batch, shape_maps))
    kernel._remember(key, prepared)   # no key when the caller gave lse_out, or validates
    kernel._run(prepared, pointers)
    return (out, lse_out) if return_lse else out


def paged_maps(kernel, q, k, v, out, page: int):
    """The TMA tensor maps of a paged varlen call's shape, or None for a kernel without them: q and out as the
    packed call sees them, and each page pool (num_pages, page_size, heads, dim) as (num_pages, heads, page_size,
    dim), so a copy's coordinates are a page's rows, the head and the page id; a copy moves min(page_size, the
    block_n's page_box_rows) rows (the kernel's box_shift takes the same)."""
    if not kernel._map_fields:
        return None
    from ..tma import ShapeMaps
    box = min(page, page_box_rows(kernel.plan.block_n))
    specs = tuple(m._replace(box_rows=box) if m.tensor in ("k", "v") else m for m in kernel.plan.tensor_maps)
    views = {"q": q.unsqueeze(0).transpose(1, 2), "k": k.transpose(1, 2), "v": v.transpose(1, 2),
             "o": out.unsqueeze(0).transpose(1, 2)}
    return ShapeMaps(specs, views)


def check_order_by(torch, order_by, batch: int, index: int) -> None:
    """order_by=(seqused_k, cu_seqlens_k) of a paged call: an int32 (batch,) seqused_k, or else an int32
    (batch + 1,) cu_seqlens_k, on the call's GPU (the kernel reads the order's batch entries)."""
    seqused, cu = order_by if isinstance(order_by, tuple) and len(order_by) == 2 else (None, None)
    t, n = (seqused, batch) if seqused is not None else (cu, batch + 1)
    if not (isinstance(t, torch.Tensor) and t.dtype == torch.int32 and t.shape == (n,) and t.get_device() == index):
        raise ValueError(f"order_by must be (seqused_k, cu_seqlens_k) giving the key counts of the call's {batch} "
                         f"sequences: an int32 ({batch},) seqused_k or ({batch + 1},) cu_seqlens_k on cuda:{index}")


def sequence_order(torch, seqused_k, cu_seqlens_k, batch: int, index: int):
    """A paged call's sequences longest first by key count (seqused_k's where given, else cu_seqlens_k's);
    None for one sequence."""
    if batch < 2:
        return None
    if seqused_k is not None:
        return ORDERS.longest_first(torch, seqused_k, batch, index, counts=True)
    return ORDERS.longest_first(torch, cu_seqlens_k, batch, index)


__all__ = ["check_order_by", "cu_seqlens", "paged_varlen_call", "varlen_call"]
