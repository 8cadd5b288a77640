"""The decode call convention (kinds with calls="decode"): `kernel(q, k_cache, v_cache,
cache_seqlens=..., causal=..., num_splits=...)` on torch tensors. A decode bundle has two parts:
the split kernel (parts[0], one function per mask) and the combine kernel (parts[1]); the call
launches the split kernel and, with more than one split, the combine kernel, on torch's current
stream. The fp32 workspace of the partial outputs comes from torch's allocator."""
from __future__ import annotations

import functools
import math
import numbers
import threading

from ...core.append_abi import APPEND_FIELDS
from ...core.launch_rules import (COMBINE_KERNEL_MIN_SLICE_TILES, MAX_PAGE_SIZE, WIDE_COMBINE, WIDE_COMBINE_MIN_SPLITS,
                                  launches_alone, lone_block_smem, num_splits, page_shift, row_blocks, rows_key,
                                  split_blocks_per_sm, visited_tiles)
from ...core.constants import LOG2E
from ...core.variants import BOTTOM_RIGHT
from .. import driver
from ..gpu import error_word, persistent
from ..kernel import LOAD_BYTES, MAX_GRID_YZ, Kernel, Prepared
from .shared import ATTENTION_FIELDS, bhsd_strides, check_page_ids, layout_key, mask_fields, variant_key

WORKSPACES = 64                 # split-partial buffers kept (device x stream x thread)
POINTERS = ("q", "k", "v", "o", "lse", "cache_seqlens", "o_accum", "lse_accum", "block_table", "split_counters")
# A contiguous-only spec's Params has no block table (core.decode_plan.PAGE_FIELDS): its calls patch the others.
CONTIGUOUS_POINTERS = tuple(name for name in POINTERS if name != "block_table")
PER_CALL = ATTENTION_FIELDS + ("errors", "cache_seqlens", "o_accum", "lse_accum", "num_splits", "tiles_per_split",
                               "row_blocks", "split_counters", "block_table", "table_stride", "num_pages",
                               "page_size", "page_shift", "query_rows", "query_total") + APPEND_FIELDS
MAX_KEYS = 2 ** 31 - 1          # keys are 32-bit in the kernel: a paged cache's capacity (pages x page size)
# An e4m3 cache's spec (kv_dtype: e4m3) adds its scales (core.decode_plan.KV_SCALE_FIELDS) after these.
KV_SCALE_POINTERS = ("k_scale", "v_scale")
# An append spec's calls also patch the new tokens' and their arguments' addresses (in ABI order).
APPEND_POINTERS = ("k_new", "v_new", "cache_batch_idx", "cache_leftpad", "rotary_cos", "rotary_sin")
APPEND_POINTER_VALUES = tuple(APPEND_FIELDS.index(n) for n in APPEND_POINTERS)   # among _check_append's values
# A call's append arguments in the order __call__ gathers them (its 7th, rotary_interleaved, is no address), and
# where each of APPEND_POINTERS sits among them: a prepared call patches their addresses in ABI order.
APPEND_ARGUMENTS = ("k_new", "v_new", "rotary_cos", "rotary_sin", "cache_batch_idx", "cache_leftpad")
APPEND_POINTER_ARGUMENTS = tuple(APPEND_ARGUMENTS.index(n) for n in APPEND_POINTERS)


def cache_call_key(q, k_cache, v_cache, lens, table, causal, scale, num_splits, return_lse, layout, variants) -> tuple:
    """What decides a decode call's checks, split count and Params but its addresses: the layouts of q, the caches,
    the lengths and the table, and the options. The e4m3 and appending calls add their own arguments' to it.
    AttributeError or TypeError when an argument is not a tensor (the full path then says what is wrong)."""
    return (layout_key(q), layout_key(k_cache), layout_key(v_cache), None if lens is None else layout_key(lens),
            None if table is None else layout_key(table), causal, scale, num_splits, return_lse, layout, variants)


class DecodeKernel(Kernel):
    """A decode spec, callable on torch tensors.

    ``kernel(q, k_cache, v_cache, cache_seqlens=None, causal=False)`` returns o (shaped like q), or
    (o, lse) with return_lse. q is (B, Hq, Sq, D): the Sq new tokens of each sequence (1 for plain
    decode, up to a few for speculative decoding); k_cache and v_cache are (B, Hkv, capacity, D)
    ("bshd": (B, S, H, D) for all three). cache_seqlens (int32, (B,), on the GPU) gives the keys of
    each sequence, the new tokens included; None means every sequence fills the cache. causal: new
    token t sees the keys up to its own position, len - Sq + t (bottom-right). num_splits overrides
    the heuristic (1 to the spec's max_splits).

    Nothing waits for the GPU by default, so a call can be captured in a CUDA graph and replayed
    with new lengths: the kernel clamps a length to [0, capacity] and a page id to the pool rather
    than read outside them. validate=True reads the lengths (and the pages a sequence uses) back
    and refuses bad ones (one small device-to-host copy, for debugging).

    Variants (where the spec has them), as FlashAttention's flash_attn_with_kvcache takes them:
    window=(left, right): new token t sees keys len - Sq + t - left .. len - Sq + t + right (-1 an
    unbounded side; causal=True bounds the right side at 0); only the tiles from token 0's first
    visible key on are read, and the splits share those. softcap=cap and alibi_slopes (fp32 (Hq,)
    or (B, Hq)): as the forward call's, with each sequence's own length as Sk. sinks (fp32 (Hq,),
    gpt-oss's learned logits): head h's joins every row's softmax denominator as a key with no
    value, once per row however many splits the keys take (the combine adds it); LSE includes it.
    params={name: value}: an expression spec's variant.params; its q_idx is the new token (0 .. Sq -
    1), seqlen_k and causal_offset are the sequence's len and len - Sq.

    Paged caches (specs with paged: true): k_cache and v_cache are pools of pages, (num_pages, Hkv,
    page_size, D) ("bshd": (num_pages, page_size, Hkv, D)), of any page size that is a power of two
    from 1 to 512 (the kernel takes it as a parameter), and block_table (int32, (B, max_pages)) lists
    each sequence's pages in order; cache_seqlens is required. Entries past a sequence's pages may
    hold anything.

    e4m3 caches (specs with kv_dtype: e4m3): k_cache and v_cache are torch.float8_e4m3fn, q (and the
    output) the spec's fp16 or bf16. k_scale and v_scale (vLLM's convention: dequantised value =
    e4m3 x scale) are each a positive Python number, a one-element fp32 tensor on q's GPU (one scale
    per tensor), or an fp32 (Hkv,) tensor (one per KV head); None is 1. Tensors are read by the
    kernel at each launch, so new values need no new call (and a CUDA graph replays them).
    Appending (specs with append: true), as flash_attn_with_kvcache does: k and v (B, Snew, Hkv, D)
    in "bshd", (B, Hkv, Snew, D) in "bhsd", 1 <= Snew <= Sq, are the new tokens; cache_seqlens
    (required) then counts the keys before them, and they are written into the cache at keys
    cache_seqlens[b] .. cache_seqlens[b] + Snew - 1 (through block_table when paged) and attended with
    the rest, in the same launch. rotary_cos / rotary_sin ((seqlen_ro, rotary_dim / 2), q's dtype,
    seqlen_ro >= the capacity) rotate k at its positions and q at cache_seqlens + t (causal or window)
    or cache_seqlens (no mask); rotary_interleaved pairs dims (2i, 2i + 1), else (i, i + rotary_dim / 2).
    cache_batch_idx (int32 (B,)) names each sequence's row of a contiguous cache (which may have more
    rows than B); cache_leftpad (int32 (B,), contiguous caches) hides a row's first keys. Neither waits
    for the GPU: an index the host cannot see is clamped in the kernel (validate=True reads them back).
    """

    def _setup(self) -> None:
        self._mask_fields = mask_fields(self.plan)
        self._kv8 = self.plan.kv_dtype == "e4m3"
        scales = ("k_scale", "v_scale", "kv_scale_stride") if self._kv8 else ()
        self._decode = self.plan.abi.packer(PER_CALL + scales + tuple(f.name for f in self._mask_fields))
        self._paged = self.plan.paged
        self._append = self.plan.append
        self._pointers = self.plan.abi.patch((POINTERS if self._paged else CONTIGUOUS_POINTERS)
                                             + (KV_SCALE_POINTERS if self._kv8 else ())
                                             + (APPEND_POINTERS if self._append else ()))
        # a serving step's rows calls (plan.step_rows: paged, no e4m3 scales, no append) patch its offsets too
        self._rows_pointers = self.plan.abi.patch(POINTERS + ("query_rows",)) if self.plan.step_rows else None
        self._scale_tensors = {}     # (device, value) -> one-element fp32 tensor of a scale given as a number
        self._workspaces = {}        # (device, stream, thread) -> fp32 split partials
        self._counter_buffers = {}   # (device, stream) -> zeroed int32 split counters (fused combine)
        self._counter_lock = threading.Lock()
        plan = self.plan
        self._max_splits = plan.max_splits
        self._v_in_k = plan.v_in_k
        self.last_splits = None

    def __call__(self, q, k_cache, v_cache, *, cache_seqlens=None, block_table=None, causal: bool = False,
                 scale: float | None = None, num_splits: int | None = None, return_lse: bool = False,
                 layout: str = "bhsd", out=None, validate: bool = False, window=None, softcap: float | None = None,
                 alibi_slopes=None, params: dict | None = None, sinks=None, k_scale=None, v_scale=None, k=None, v=None,
                 rotary_cos=None, rotary_sin=None, cache_batch_idx=None, cache_leftpad=None,
                 rotary_interleaved: bool = True):
        variants = variant_key(window, softcap, alibi_slopes, params, sinks)
        key = None
        append = (k, v, rotary_cos, rotary_sin, cache_batch_idx, cache_leftpad, rotary_interleaved)   # APPEND_ARGUMENTS
        if any(t is not None for t in append[:6]) or self._append:
            return self._append_call(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits,
                                     return_lse, layout, out, validate, variants,
                                     (window, softcap, alibi_slopes, params, sinks), (k_scale, v_scale), append)
        if self._kv8:
            return self._e4m3_call(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits,
                                   return_lse, layout, out, validate, variants, (window, softcap, alibi_slopes, params,
                                                                                sinks), (k_scale, v_scale))
        if k_scale is not None or v_scale is not None:
            return self._first_call(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits,
                                    return_lse, layout, out, validate, key, (window, softcap, alibi_slopes, params,
                                                                             sinks), (k_scale, v_scale))
        if out is None and not validate:
            # A shape seen before: its checks passed and its Params are laid out; only the pointers
            # are new (and must be 16-byte aligned).
            try:
                key = cache_call_key(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits,
                                     return_lse, layout, variants)
                prepared = self._prepared.get(key)
            except (AttributeError, TypeError):
                key = prepared = None
            if prepared is not None:
                qp, kp, vp = q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr()
                if not (qp | kp | vp) % LOAD_BYTES:
                    return self._prepared_call(prepared, q, qp, kp, vp, cache_seqlens, block_table, return_lse)
        return self._first_call(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits,
                                return_lse, layout, out, validate, key, (window, softcap, alibi_slopes, params, sinks))

    def full_cache_prepared(self, q, k_cache, v_cache, scale, return_lse: bool, layout: str, causal: bool = False,
                            variants: tuple = ()):
        """The prepared call of a call on full caches (no cache_seqlens, no table; causal or not; `variants` the
        call's variant_key) made before with these arguments, or None (attention()'s one-row route keeps it:
        run_full_cache)."""
        return self._prepared.get(cache_call_key(q, k_cache, v_cache, None, None, causal, scale, None, return_lse,
                                                 layout, variants))

    def run_full_cache(self, prepared, q, k_cache, v_cache, return_lse: bool):
        """Launch full_cache_prepared's call on new tensors of its shape; None when a pointer is not 16-byte aligned
        (the caller takes the full path)."""
        qp, kp, vp = q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr()
        if (qp | kp | vp) % LOAD_BYTES:
            return None
        return self._prepared_call(prepared, q, qp, kp, vp, None, None, return_lse)

    def rows_call(self, q, k_cache, v_cache, cache_seqlens, block_table, query_rows, out, *, scale: float | None = None,
                  softcap: float | None = None, alibi_slopes=None, sinks=None) -> bool:
        """A serving step's decode rows, in place (a spec with step_rows): q (total_q, Hq, D) and out (total_q, Hq, Dv)
        are packed by query_rows (cu_seqlens_q, int32 (batch + 1,)); each sequence with exactly one query is decoded
        over its cache_seqlens[b] keys in block_table's pages (pools in FlashAttention's varlen layout, (num_pages,
        page_size, Hkv, D)) and its output written at its row of out. Rows of other sequences are neither read nor
        written: a paged varlen call with single_queries_apart writes them. No LSE. Returns False, launching nothing,
        where the call does not fit the rows functions (the caller then splits the step with tensor ops): no
        such functions, more sequences than rows, rows not 16-byte apart, a column stride or an address the kernel
        cannot read in 16-byte vectors, or lengths that are not contiguous (the split by tensor ops copies them)."""
        if self._rows_pointers is None:
            return False
        try:
            key = ("rows", layout_key(q), layout_key(out), layout_key(k_cache), layout_key(v_cache),
                   layout_key(cache_seqlens), layout_key(block_table), layout_key(query_rows), scale,
                   variant_key(None, softcap, alibi_slopes, None, sinks))
            prepared = self._prepared.get(key)
        except (AttributeError, TypeError):
            return False
        if prepared is not None:
            qp, kp, vp, op = q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr()
            if not (qp | kp | vp | op) % LOAD_BYTES:
                self._prepared_call(prepared, None, qp, kp, vp, cache_seqlens, block_table, False,
                                    (query_rows.data_ptr(),), out)
                return True
        tensor = self._tensor_type
        if not (isinstance(block_table, tensor) and block_table.dim() == 2 and q.dim() == 3
                and out.dim() == 3 and out.shape[:2] == q.shape[:2] and 1 <= block_table.shape[0] <= q.shape[0]
                and not any(n % 8 for n in q.stride()[:2] + out.stride()[:2]) and q.stride(-1) == out.stride(-1) == 1
                and not (q.data_ptr() | out.data_ptr()) % LOAD_BYTES and isinstance(query_rows, tensor)
                and query_rows.dtype == self._torch.int32 and query_rows.shape == (block_table.shape[0] + 1,)
                and query_rows.is_contiguous() and query_rows.device == q.device
                and isinstance(cache_seqlens, tensor) and cache_seqlens.is_contiguous()):
            return False
        # (batch, 1, Hq, D) views whose batch stride is the packed row stride: the rows functions address sequence
        # b's q and o at its row query_rows[b] (step_row), never at b; a view stays within q's and out's rows.
        batch = block_table.shape[0]
        qv = q.as_strided((batch, 1) + tuple(q.shape[1:]), (q.stride(0),) + tuple(q.stride()))
        ov = out.as_strided((batch, 1) + tuple(out.shape[1:]), (out.stride(0),) + tuple(out.stride()))
        self._first_call(qv, k_cache, v_cache, cache_seqlens, block_table, False, scale, None, False, "bshd", ov,
                         False, key, (None, softcap, alibi_slopes, None, sinks), step=(query_rows, q.shape[0]))
        return True

    def _append_call(self, q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits, return_lse,
                     layout, out, validate, variants, variant_values, kv_scales, append):
        """A call that may append new tokens (k, v, rotary_cos, ...): as __call__, its prepared-call key also
        holding the layout of each append argument (its address is patched on every call)."""
        key = None
        if out is None and not validate and self._append and kv_scales == (None, None):
            try:
                key = cache_call_key(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits,
                                     return_lse, layout, variants) + (
                    tuple(None if t is None else layout_key(t) for t in append[:6]), bool(append[6]))
                prepared = self._prepared.get(key)
            except (AttributeError, TypeError):
                key = prepared = None
            if prepared is not None:
                qp, kp, vp = q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr()
                new = tuple(0 if t is None else t.data_ptr() for t in append[:6])
                if not (qp | kp | vp | new[0] | new[1]) % LOAD_BYTES:
                    return self._prepared_call(prepared, q, qp, kp, vp, cache_seqlens, block_table, return_lse,
                                               tuple(new[i] for i in APPEND_POINTER_ARGUMENTS))
        return self._first_call(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits, return_lse,
                                layout, out, validate, key, variant_values, kv_scales, append)

    def _e4m3_call(self, q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits, return_lse, layout,
                   out, validate, variants, variant_values, kv_scales):
        """A call of an e4m3-cache spec: as __call__, its prepared-call key also holding what each scale is
        (a tensor's shape, dtype and device; a number's value), whose pointers are new on every call."""
        key = None
        if out is None and not validate:
            # spelled out for the two scales, no generators: this is every repeated call's host path
            k_scale, v_scale = kv_scales
            tensor = self._tensor_type
            try:
                key = cache_call_key(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits,
                                     return_lse, layout, variants) + (
                    (layout_key(k_scale) if isinstance(k_scale, tensor) else ("number", k_scale),
                     layout_key(v_scale) if isinstance(v_scale, tensor) else ("number", v_scale)),)
                prepared = self._prepared.get(key)   # hashing the key: TypeError for an unhashable argument
            except (AttributeError, TypeError):
                key = prepared = None
            if prepared is not None:
                qp, kp, vp = q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr()
                if not (qp | kp | vp) % LOAD_BYTES:
                    index = prepared.info.index
                    kptr, vptr = self._scale_pointer(k_scale, index), self._scale_pointer(v_scale, index)
                    if kptr is not None and vptr is not None:
                        return self._prepared_call(prepared, q, qp, kp, vp, cache_seqlens, block_table, return_lse,
                                                   (kptr, vptr))
        return self._first_call(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits, return_lse,
                                layout, out, validate, key, variant_values, kv_scales)

    def _scale_pointer(self, value, index: int):
        """The address a prepared e4m3 call passes for one scale: a tensor's own, 0 for None, and for a number
        the tensor its first call made; None where the full path must look: a number this device has no tensor for
        yet, or a value that is no real number."""
        if value is None:
            return 0
        if isinstance(value, self._tensor_type):
            return value.data_ptr()
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return None       # the full path refuses it in its words (True would otherwise pass as 1.0's key)
        held = self._scale_tensors.get((index, float(value)))
        return None if held is None else held.data_ptr()

    def _prepared_call(self, prepared, q, qp, kp, vp, cache_seqlens, block_table, return_lse, tail=(), out=None):
        """A prepared call's launch on these tensors; `tail`: the addresses its patch takes after the cache's (an e4m3
        cache's scales, an append's new tokens and arguments, or a rows call's offsets); out: a rows call's."""
        lse_shape, accum, counters, splits = prepared.extra
        index = prepared.info.index
        if self._v_in_k and vp != kp:
            self._check_v_in_k(kp, vp)
        if out is None:
            out = self._new_output(q)
        lse = q.new_empty(lse_shape, dtype=self._torch.float32) if return_lse else None
        o_accum = lse_accum = 0
        held = held_counters = None     # temporaries of a captured call, alive until its launches are queued
        if accum:
            o_accum, held = self._workspace(index, accum + accum // self.plan.v_dim)
            lse_accum = o_accum + 4 * accum
        lens = cache_seqlens.data_ptr() if cache_seqlens is not None else 0
        counted, held_counters = self._counters(counters, index) if counters else (0, None)
        if self._paged:
            self._run(prepared, (qp, kp, vp, out.data_ptr(), lse.data_ptr() if return_lse else 0, lens, o_accum,
                                 lse_accum, block_table.data_ptr() if block_table is not None else 0, counted) + tail)
        else:   # a contiguous-only spec: never a table (the first call refused one)
            self._run(prepared, (qp, kp, vp, out.data_ptr(), lse.data_ptr() if return_lse else 0, lens, o_accum,
                                 lse_accum, counted) + tail)
        del held, held_counters
        self.last_splits = splits
        return (out, lse) if return_lse else out

    def _first_call(self, q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits, return_lse,
                    layout, out, validate, key, variants, kv_scales=(None, None), append=(None,) * 6 + (True,),
                    step=None):
        """Every check, the split count and the Params of a call; remembered under `key`. step: (query_rows,
        total rows) of a rows call (rows_call), which launches the rows functions and is remembered with its out."""
        if self._kv8:
            index, qs, ks, vs = self._e4m3_inputs(layout, q, k_cache, v_cache)
        else:
            if kv_scales != (None, None):
                raise ValueError(f"k_scale and v_scale scale an e4m3 KV cache; {self.label} reads {self.plan.spec.dtype} "
                                 "caches (an e4m3 cache is served by a spec with kv_dtype: e4m3)")
            index, qs, ks, vs = self._padded_inputs(layout, ("q", "k_cache", "v_cache"), q, k_cache, v_cache)
        bhsd = layout == "bhsd"
        batch, heads, seqlen_q = (qs[0], qs[1], qs[2]) if bhsd else (qs[0], qs[2], qs[1])
        pool, kv_heads, rows = (ks[0], ks[1], ks[2]) if bhsd else (ks[0], ks[2], ks[1])
        paged = block_table is not None
        rows_free = append[4] is not None and not paged   # cache_batch_idx: the cache's rows need not be the batch
        if ks[:3] != vs[:3] or (not paged and pool != batch and not rows_free) or (paged and pool < 1):
            what = "(num_pages, kv_heads, page_size, head_dim) page pools" if paged else \
                f"(batch {batch}, kv_heads, capacity, head_dim)"
            raise ValueError(f"k_cache and v_cache must both be {what} (got {tuple(ks)} and {tuple(vs)})")
        if self._v_in_k:
            self._check_v_in_k(k_cache.data_ptr(), v_cache.data_ptr(), k_cache.stride(), v_cache.stride(), ks)
        capacity = self._check_table(block_table, cache_seqlens, batch, rows, layout, index) if paged else rows
        scale_values = self._kv_scales(kv_scales, kv_heads, index) if self._kv8 else ()
        page, shift = (rows, page_shift(rows)) if paged else (0, 0)
        self._check_heads(heads, kv_heads, batch=batch)
        window, softcap, alibi_slopes, params, sinks = variants
        mask = self._check_mask(causal, window)
        if cache_seqlens is not None:
            self._check_seqlens(cache_seqlens, batch, capacity, validate, layout, paged, index)
        if paged and validate:
            # an append call writes its new tokens at keys len .. len + Snew - 1: their pages too
            k_new = append[0] if self._append else None
            new_rows = 0 if k_new is None or k_new.dim() != 4 else k_new.shape[2 if layout == "bhsd" else 1]
            check_page_ids(self._torch, block_table, cache_seqlens + new_rows if new_rows else cache_seqlens, pool,
                           page)
        scale = self._check_scale(scale)
        appended = self._check_append(append, q, cache_seqlens, batch, kv_heads, seqlen_q, capacity, pool, paged,
                                      layout, index, validate)
        # A window counts from each new token's own position (bottom-right, offset 0 here; the kernel
        # adds each sequence's len - Sq).
        takes_window = mask == "window"
        mask_values = self._variant_values(mask, causal, BOTTOM_RIGHT if takes_window else None, window, seqlen_q,
                                           seqlen_q, scale,
                                           {"softcap": softcap, "alibi_slopes": alibi_slopes, "params": params,
                                            "sinks": sinks},
                                           {"batch": batch, "heads": heads, "device": index})
        torch = self._torch
        out_given = out
        out = self._output(out, q, layout, index)
        lse = torch.empty((batch, heads, seqlen_q), dtype=torch.float32, device=q.device) if return_lse else None
        if not (batch and seqlen_q and capacity):
            if batch and seqlen_q:
                return self._no_keys(out, lse, return_lse)
            return (out, lse) if return_lse else out
        blocks_per_row = row_blocks(self.plan, heads, kv_heads, seqlen_q)
        if kv_heads * blocks_per_row > MAX_GRID_YZ:
            raise ValueError(f"kv_heads x row blocks ({kv_heads} x {blocks_per_row}) exceed {MAX_GRID_YZ}")
        info = self._device(index)
        n_tiles = -(-capacity // self.plan.block_n)
        if takes_window and window[0] >= 0:   # the tiles a block visits: its new tokens' window
            n_tiles = visited_tiles(n_tiles, self.plan.block_n, seqlen_q, window[0])
        if num_splits is None:
            splits = num_splits_for(self.plan, batch * kv_heads * blocks_per_row, n_tiles, info.sm_count)
        else:
            cap = self._max_splits
            if isinstance(num_splits, bool) or not isinstance(num_splits, numbers.Integral) or not 1 <= num_splits <= cap:
                raise ValueError(f"num_splits must be an integer from 1 to {cap} (the spec's max_splits; got "
                                 f"{num_splits!r})")
            splits = min(int(num_splits), n_tiles)
        tiles_per_split = -(-n_tiles // splits)
        splits = -(-n_tiles // tiles_per_split)   # no split left without a tile of the cache

        accum = splits * batch * heads * seqlen_q * self.plan.v_dim if splits > 1 else 0
        o_accum = lse_accum = 0
        held = held_counters = None     # temporaries of a captured call, alive until its launches are queued
        if accum:   # (splits, B, H, Sq, Dv) partial outputs, then (splits, B, H, Sq) partial LSEs, fp32
            o_accum, held = self._workspace(index, accum + accum // self.plan.v_dim)
            lse_accum = o_accum + 4 * accum
        merges = self.plan.merges_in_kernel(splits)   # the split kernel merges the splits: no combine launch
        counters = batch * kv_heads * blocks_per_row if merges else 0
        lens_ptr = cache_seqlens.data_ptr() if cache_seqlens is not None else 0
        table_ptr = block_table.data_ptr() if paged else 0
        counters_ptr, held_counters = self._counters(counters, index) if counters else (0, None)
        values = [q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(),
                  lse.data_ptr() if lse is not None else 0,
                  *bhsd_strides(q.stride(), layout), *bhsd_strides(k_cache.stride(), layout),
                  *bhsd_strides(v_cache.stride(), layout), *bhsd_strides(out.stride(), layout),
                  heads * seqlen_q, seqlen_q, batch, heads, kv_heads, seqlen_q, capacity,
                  mask_values.pop("scale_log2", scale * LOG2E), error_word(index), lens_ptr, o_accum, lse_accum,
                  splits, tiles_per_split, blocks_per_row, counters_ptr, table_ptr,
                  block_table.stride(0) if paged else 0, pool if paged else 0, page, shift,
                  step[0].data_ptr() if step else 0, step[1] if step else 0, *appended]
        values += list(scale_values)
        values += [mask_values.get(f.name, f.default) for f in self._mask_fields]
        launches = [(self.entry[self.plan.split_key(mask, splits, step is not None)],
                     (splits, kv_heads * blocks_per_row, batch))]
        if splits > 1 and not merges:
            launches.append(self._combine_launch(splits, batch * heads * seqlen_q, step is not None))
        launched = self._alone(info, self._launches(info, *launches))
        prepared = Prepared(info, launched, self._decode.pack(values), self._pointers if step is None else
                            self._rows_pointers, ((batch, heads, seqlen_q), accum, counters, splits))
        if out_given is None or step is not None:
            self._remember(key, prepared)
        self._run(prepared, tuple(values[:5]) + ((lens_ptr, o_accum, lse_accum, table_ptr, counters_ptr) if self._paged
                                                 else (lens_ptr, o_accum, lse_accum, counters_ptr))
                  + tuple(scale_values[:2]) + (tuple(appended[i] for i in APPEND_POINTER_VALUES) if self._append else ())
                  + ((step[0].data_ptr(),) if step else ()))
        del held, held_counters
        self.last_splits = splits
        return (out, lse) if return_lse else out

    def _configure(self, fn, info) -> None:
        super()._configure(fn, info)
        alone = lone_block_smem(fn.smem_dynamic, info.smem_per_sm, info.smem_reserved, info.smem_optin)
        if fn.programmatic and driver.programmatic_launches(info.arch) and alone > fn.smem_dynamic:
            # a launch of this function may ask for a lone block's bytes (_alone)
            driver.set_kernel_attribute(fn.handle, driver.ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES, alone, info.handle)

    @staticmethod
    def _alone(info, launches: tuple) -> tuple:
        """The call's launches, the split kernel's asking for a lone block's shared memory where
        launch_rules.launches_alone holds (no two of its blocks on one SM)."""
        fn, handle, grid = launches[0]
        alone = lone_block_smem(fn.smem_dynamic, info.smem_per_sm, info.smem_reserved, info.smem_optin)
        if alone > fn.smem_dynamic and launches_alone(fn.programmatic, grid[0] * grid[1] * grid[2], info.sm_count):
            return ((fn._replace(smem_dynamic=alone), handle, grid),) + launches[1:]
        return launches

    def _combine_launch(self, splits: int, rows: int, step_rows: bool = False) -> tuple[str, tuple[int, int, int]]:
        """The combine function and grid that merge `splits` slices of `rows` output rows: the part's wide
        function from WIDE_COMBINE_MIN_SPLITS splits where it has one, else its first (step_rows: its rows
        function, a serving step's decode rows)."""
        wide = self.plan.combine_wide_slices and splits >= WIDE_COMBINE_MIN_SPLITS
        functions = dict(self.plan.combine_part.functions)
        combine = self.functions[functions[rows_key("combine")] if step_rows else functions[WIDE_COMBINE] if wide
                                 else self.plan.combine_part.functions[0][1]]
        per_block = combine.threads // 32   # one output row per warp
        return combine.name, (-(-rows // per_block), self.plan.combine_wide_slices if wide else self.plan.combine_slices, 1)

    def _check_v_in_k(self, k_ptr: int, v_ptr: int, k_strides=None, v_strides=None, shape=()) -> None:
        """A spec whose V is the first v_dim columns of each K row (plan.v_in_k, one latent cache) reads V
        from K's tiles: the call's v_cache must be that view of k_cache, or the kernel would ignore it. The
        strides of dimensions of one element say nothing (no second element is reached through them)."""
        if v_ptr != k_ptr or (k_strides is not None and any(
                n > 1 and a != b for n, a, b in zip(shape, k_strides[:3], v_strides[:3]))):
            d, dv = self.plan.head_dim, self.plan.v_dim
            raise ValueError(f"{self.label} reads V from the cache's rows (one latent cache of {d} columns, V its "
                             f"first {dv}): pass v_cache=k_cache[..., :{dv}] (the same tensor), not a cache of its own")

    def _e4m3_inputs(self, layout: str, q, k_cache, v_cache):
        """(device index, q's, k_cache's and v_cache's shapes) of a call of an e4m3-cache spec: q in the
        spec's dtype, the caches torch.float8_e4m3fn, each checked as _padded_inputs checks them."""
        from ..kernel import LAYOUTS
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)} (got {layout!r})")
        index = self._device_index(q)
        e4m3 = self._torch.float8_e4m3fn
        for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
            if isinstance(t, self._tensor_type) and t.dtype is not e4m3:
                hint = (f"; a cache of e4m3 bytes stored as uint8 is read as {name}.view(torch.float8_e4m3fn)"
                        if t.dtype is self._torch.uint8 else f"; a {t.dtype} cache is served by the spec without kv_dtype")
                raise TypeError(f"{name} is {t.dtype} but {self.label} reads an e4m3 KV cache (torch.float8_e4m3fn)"
                                + hint)
        if q.dtype is e4m3:
            raise TypeError(f"q is torch.float8_e4m3fn but {self.label} takes {self.dtype} queries (only the KV cache "
                            "is e4m3)")
        return (index, self._check_tensor("q", q, layout, index),
                self._check_tensor("k_cache", k_cache, layout, index, dtype=e4m3),
                self._check_tensor("v_cache", v_cache, layout, index, v_dim=True, dtype=e4m3))

    def _kv_scales(self, kv_scales, kv_heads: int, index: int) -> tuple:
        """(k_scale pointer, v_scale pointer, kv_scale_stride) of an e4m3 call's scales, each checked: None
        (1), a positive finite number, a one-element fp32 tensor, or an fp32 (kv_heads,) tensor; both
        tensors must share one layout (per tensor or per KV head)."""
        return kv_scale_values(self._torch, kv_scales, kv_heads, index, self._scale_tensors)

    def _check_append(self, append, q, lens, batch: int, kv_heads: int, seqlen_q: int, capacity: int, pool: int,
                      paged: bool, layout: str, index: int, validate: bool) -> list:
        """The values of the append fields (APPEND_FIELDS order) of a call, every argument checked: the new
        tokens k and v, rotary_cos / rotary_sin, cache_batch_idx and cache_leftpad (FlashAttention's rules)."""
        k, v, cos, sin, batch_idx, leftpad, interleaved = append
        given = [name for name, t in zip(("k", "v", "rotary_cos", "rotary_sin", "cache_batch_idx", "cache_leftpad"),
                                         append) if t is not None]
        if not self._append:
            if given:
                raise ValueError(f"{self.label} does not append new tokens ({', '.join(given)} given): a decode spec "
                                 "with append: true takes k, v, rotary_cos, rotary_sin, cache_batch_idx and "
                                 "cache_leftpad")
            return [0] * len(APPEND_FIELDS)   # the Params has none of them; their places in the values stay
        torch = self._torch
        if (k is None) != (v is None):
            raise ValueError("k and v (the new tokens) come together: pass both or neither")
        if (cos is None) != (sin is None):
            raise ValueError("rotary_cos and rotary_sin come together: pass both or neither")
        if cos is not None and k is None:
            raise ValueError("rotary_cos and rotary_sin rotate the new tokens: they need k and v")
        if lens is None:
            raise ValueError("an append call needs cache_seqlens (int32 (batch,)): the keys of each sequence before "
                             "its new tokens (and without k: all of them)")
        if paged and (batch_idx is not None or leftpad is not None):
            raise ValueError("cache_batch_idx and cache_leftpad are taken with contiguous caches only (as "
                             "FlashAttention); a paged cache's block_table already names each sequence's pages")
        bhsd = layout == "bhsd"
        new = 0
        strides = [0] * 6
        if k is not None:
            ks = self._check_tensor("k", k, layout, index)
            vs = self._check_tensor("v", v, layout, index, v_dim=True)
            b, h, new = (ks[0], ks[1], ks[2]) if bhsd else (ks[0], ks[2], ks[1])
            dims = "(batch, kv_heads, seqlen_new, head_dim)" if bhsd else "(batch, seqlen_new, kv_heads, head_dim)"
            if ks != vs or b != batch or h != kv_heads or not 1 <= new <= seqlen_q:
                raise ValueError(f"k and v (the new tokens) must both be {dims} with batch {batch}, kv_heads "
                                 f"{kv_heads} and 1 <= seqlen_new <= seqlen_q ({seqlen_q}) (got {tuple(ks)} and "
                                 f"{tuple(vs)})")
            if new > capacity:
                raise ValueError(f"the cache holds {capacity} keys per sequence, fewer than the {new} new tokens")
            strides = [*bhsd_strides(k.stride(), layout)[:3], *bhsd_strides(v.stride(), layout)[:3]]
        rotary = 0
        if cos is not None:
            for name, t in (("rotary_cos", cos), ("rotary_sin", sin)):
                if not isinstance(t, torch.Tensor):
                    raise TypeError(f"{name} must be a torch.Tensor (got {type(t).__name__})")
                if t.dtype != q.dtype:
                    raise TypeError(f"{name} must have q's dtype {q.dtype} (got {t.dtype})")
                if t.dim() != 2 or not t.is_contiguous() or t.shape[1] < 1:
                    raise ValueError(f"{name} must be a contiguous (seqlen_ro, rotary_dim / 2) tensor (got shape "
                                     f"{tuple(t.shape)})")
                if t.get_device() != index:
                    raise ValueError(f"{name} is on {t.device} but q is on cuda:{index}")
            if tuple(cos.shape) != tuple(sin.shape):
                raise ValueError(f"rotary_cos and rotary_sin must have one shape (got {tuple(cos.shape)} and "
                                 f"{tuple(sin.shape)})")
            rotary = 2 * cos.shape[1]
            if rotary > self.plan.head_dim:
                raise ValueError(f"rotary_dim ({rotary}: 2 x rotary_cos.shape[1]) must be at most head_dim "
                                 f"({self.plan.head_dim})")
            if cos.shape[0] < capacity:
                raise ValueError(f"rotary_cos and rotary_sin hold {cos.shape[0]} positions, fewer than the cache's "
                                 f"{capacity} keys per sequence (every key a new token may land on)")
        for name, t in (("cache_batch_idx", batch_idx), ("cache_leftpad", leftpad)):
            if t is None:
                continue
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor of int32 (got {type(t).__name__})")
            if t.dtype != torch.int32:
                raise TypeError(f"{name} must be int32 (got {t.dtype}); pass {name}.int()")
            if tuple(t.shape) != (batch,) or not t.is_contiguous():
                raise ValueError(f"{name} must be a contiguous ({batch},) tensor (got shape {tuple(t.shape)})")
            if t.get_device() != index:
                raise ValueError(f"{name} is on {t.device} but q is on cuda:{index}")
        if validate:
            self._check_room(lens, batch_idx, leftpad, new, capacity, pool)
        ptr = lambda t: 0 if t is None else t.data_ptr()   # noqa: E731
        return [ptr(k), ptr(v), *strides, ptr(batch_idx), ptr(leftpad), ptr(cos), ptr(sin),
                0 if paged else pool, new, rotary, 1 if interleaved else 0]

    def _check_room(self, lens, batch_idx, leftpad, new: int, capacity: int, pool: int) -> None:
        """validate=True of an append call: each sequence's keys and new tokens fit its cache row, its
        leftpad lies inside its keys, and its cache row exists (one read back)."""
        torch = self._torch
        end = lens + new
        lo, hi = int(torch.min(lens)), int(torch.max(end))
        if lo < 0 or hi > capacity:
            bad = lo if lo < 0 else hi - new
            raise ValueError(f"cache_seqlens holds {bad}: with the {new} new tokens a sequence needs room in "
                             f"[0, {capacity}] (the cache's keys per sequence)")
        if leftpad is not None and bool(((leftpad < 0) | (leftpad > lens)).any()):
            raise ValueError("cache_leftpad holds an entry outside [0, cache_seqlens] of its sequence")
        if batch_idx is not None:
            lo, hi = (int(x) for x in torch.aminmax(batch_idx))
            if lo < 0 or hi >= pool:
                raise ValueError(f"cache_batch_idx holds {lo if lo < 0 else hi}; the cache has rows 0..{pool - 1}")

    def _workspace(self, index: int, floats: int) -> tuple:
        """(address, holder) of `floats` fp32 elements of split partials, one buffer per device, stream and
        thread: calls on one stream run in order, and two threads sharing a stream (torch's
        default) must not overwrite each other's partials between their split and combine
        launches. Inside CUDA graph capture each call takes a temporary of the graph's pool, freed when
        the call returns, as any op's intermediate: the graph replays the split and the combine in
        stream order, and torch.compile's CUDA graphs (mode="reduce-overhead") refuse a live
        allocation of their pool that is not an output (the kept buffers are made outside it: _kept)."""
        torch = self._torch
        if torch._C._cuda_isCurrentStreamCapturing():
            buf = torch.empty(floats, dtype=torch.float32, device=f"cuda:{index}")
            return buf.data_ptr(), buf      # the caller holds buf until its launches are queued
        key = (index, torch._C._cuda_getCurrentRawStream(index), threading.get_ident())
        buf = self._workspaces.get(key)
        if buf is None or buf.numel() < floats:
            if len(self._workspaces) >= WORKSPACES:
                self._workspaces.clear()
            buf = self._kept(torch.empty, max(floats, 1 << 16), torch.float32, index)
            self._workspaces[key] = buf
        return buf.data_ptr(), None

    def _kept(self, make, n: int, dtype, index: int):
        """A buffer of n elements kept between calls on the current stream (gpu.persistent: outside the
        calling thread's memory pool), recorded on that stream, so that once replaced or dropped its
        memory waits for the calls queued there."""
        torch = self._torch
        buf = persistent(lambda: make(n, dtype=dtype, device=f"cuda:{index}"), index)
        buf.record_stream(torch.cuda.current_stream(index))
        return buf

    def _counters(self, n: int, index: int) -> tuple:
        """Address of n zeroed int32 split counters for a fused combine, one buffer per device and
        stream (the last block of each group resets its counter, so a buffer stays zero between
        calls; two streams at once must not share one, and calls on one stream run in order). Inside CUDA
        graph capture, a zeroed temporary as _workspace's (its zeroing is captured too): (address, holder)."""
        if self._torch._C._cuda_isCurrentStreamCapturing():
            buf = self._torch.zeros(n, dtype=self._torch.int32, device=f"cuda:{index}")
            return buf.data_ptr(), buf
        key = (index, self._torch._C._cuda_getCurrentRawStream(index))
        buf = self._counter_buffers.get(key)
        if buf is None or buf.numel() < n:
            with self._counter_lock:
                buf = self._counter_buffers.get(key)
                if buf is None or buf.numel() < n:
                    buf = self._kept(self._torch.zeros, max(n, 1024), self._torch.int32, index)
                    self._counter_buffers[key] = buf
        return buf.data_ptr(), None

    def _check_table(self, table, lens, batch: int, page_rows: int, layout: str, index: int) -> int:
        """Shape checks of a paged call; returns the capacity of a sequence (pages per row x page size)."""
        torch = self._torch
        if not self._paged:
            raise ValueError(f"{self.label} reads contiguous caches only: a spec with paged: true reads a paged "
                             "cache (block_table)")
        page = page_rows
        if page_shift(page) is None:
            raise ValueError(f"page_size must be a power of two from 1 to {MAX_PAGE_SIZE} (the pools hold pages of "
                             f"{page} keys: k_cache.shape[{2 if layout == 'bhsd' else 1}])")
        if lens is None:
            raise ValueError("a paged cache needs cache_seqlens (int32, one length per sequence)")
        if not isinstance(table, torch.Tensor):
            raise TypeError(f"block_table must be a torch.Tensor of int32 (got {type(table).__name__})")
        if table.dtype != torch.int32:
            raise TypeError(f"block_table must be int32 (got {table.dtype}); pass block_table.int()")
        if table.dim() != 2 or table.shape[0] != batch or table.stride(1) != 1 or table.shape[1] < 1:
            raise ValueError(f"block_table must be ({batch}, max_pages) with contiguous rows (got shape "
                             f"{tuple(table.shape)}, strides {tuple(table.stride())})")
        if table.get_device() != index:
            raise ValueError(f"block_table is on {table.device} but q is on cuda:{index}")
        if table.shape[1] * page > MAX_KEYS:
            raise ValueError(f"block_table's {table.shape[1]} pages of {page} keys exceed {MAX_KEYS} keys per "
                             "sequence")
        return table.shape[1] * page

    def _check_seqlens(self, lens, batch: int, capacity: int, validate: bool, layout: str, paged: bool,
                       index: int) -> None:
        torch = self._torch
        if not isinstance(lens, torch.Tensor):
            raise TypeError(f"cache_seqlens must be a torch.Tensor of int32 (got {type(lens).__name__})")
        if lens.dtype != torch.int32:
            raise TypeError(f"cache_seqlens must be int32 (got {lens.dtype}); pass cache_seqlens.int()")
        if tuple(lens.shape) != (batch,) or not lens.is_contiguous():
            raise ValueError(f"cache_seqlens must be a contiguous ({batch},) tensor, one length per sequence "
                             f"(got shape {tuple(lens.shape)})")
        if lens.get_device() != index:
            raise ValueError(f"cache_seqlens is on {lens.device} but q is on cuda:{index}")
        if validate:
            lo, hi = (int(x) for x in torch.aminmax(lens))
            if lo < 0 or hi > capacity:
                bad = lo if lo < 0 else hi
                where = ("block_table.shape[1] x page_size" if paged else
                         f"k_cache.shape[{2 if layout == 'bhsd' else 1}]")
                raise ValueError(f"cache_seqlens holds {bad}, outside [0, {capacity}] (the cache's capacity, {where})")


def kv_scale_values(torch, kv_scales, kv_heads: int, index: int, numbers_seen: dict, keep=persistent) -> tuple:
    """(k_scale pointer, v_scale pointer, kv_scale_stride) of an e4m3 call (DecodeKernel._kv_scales). A number
    becomes a one-element fp32 tensor on the GPU, made once per (device, value) by keep(make, index)
    (gpu.persistent) and kept in `numbers_seen`."""
    pointers, strides = [], set()
    for name, value in zip(("k_scale", "v_scale"), kv_scales):
        if value is None:
            pointers.append(0)
            continue
        if isinstance(value, torch.Tensor):
            if value.dtype != torch.float32:
                raise TypeError(f"{name} must be float32 (got {value.dtype}); pass {name}.float()")
            if value.get_device() != index:
                raise ValueError(f"{name} is on {value.device} but q is on cuda:{index}")
            if value.numel() == 1:
                strides.add(0)
            elif tuple(value.shape) == (kv_heads,) and value.stride(0) == 1:
                strides.add(1)
            else:
                raise ValueError(f"{name} must hold one scale (shape (), (1,)) or one per KV head (contiguous "
                                 f"({kv_heads},)); got shape {tuple(value.shape)}")
            pointers.append(value.data_ptr())
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name} must be a number or an fp32 tensor (got {type(value).__name__})")
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be positive and finite (got {value})")
        key = (index, float(value))
        held = numbers_seen.get(key)
        if held is None:
            # A number's tensor is made once and kept for the process (4 bytes a value; a model has a
            # few per layer): a captured graph may hold its pointer, so it is never freed. Under
            # capture a new one would be allocated but not filled until the graph replays.
            if torch.cuda.is_current_stream_capturing():
                raise ValueError(f"{name}={value} is a number first seen under CUDA graph capture: pass the scales "
                                 "as fp32 tensors, or make one uncaptured call with these numbers first")
            held = keep(lambda: torch.full((1,), float(value), dtype=torch.float32, device=f"cuda:{index}"), index)
            numbers_seen[key] = held
        strides.add(0)
        pointers.append(held.data_ptr())
    if len(strides) > 1:
        raise ValueError("k_scale and v_scale must both be per tensor or both per KV head (got one of each)")
    return (*pointers, strides.pop() if strides else 0)


def num_splits_for(plan, blocks: int, n_tiles: int, sm_count: int) -> int:
    kernel_combine = plan.combine == "kernel"
    per_sm = split_blocks_per_sm(plan.co_resident_blocks, blocks, n_tiles, kernel_combine, plan.co_resident_min_tiles)
    # the in-flight rule was measured with one block per SM: where two are counted it does not apply
    in_flight = plan.unsplit_in_flight if per_sm == 1 else 0
    slice_cost = not kernel_combine or 0 < plan.slice_cost_min_tiles <= n_tiles
    return _splits(blocks, n_tiles, sm_count, per_sm, plan.max_splits, in_flight,
                   COMBINE_KERNEL_MIN_SLICE_TILES if kernel_combine else 1, slice_cost)


@functools.lru_cache(maxsize=4096)
def _splits(blocks: int, n_tiles: int, sm_count: int, blocks_per_sm: int, max_splits: int, in_flight: int,
            min_slice_tiles: int, least_slice_cost: bool) -> int:
    """The heuristic's split count on a GPU of `sm_count` SMs, counting `blocks_per_sm` blocks per SM:
    one for 16-bit caches even where two fit (d64): measured on the H200, 11-16 splits beat the 32 that
    two blocks per SM would take for 8 KV heads at batch 1 (14.3-14.7 vs 16.0 us at 8k keys), since every
    split adds a partial output to write and merge."""
    return num_splits(blocks, n_tiles, sm_count, blocks_per_sm, max_splits, in_flight, min_slice_tiles,
                      least_slice_cost)


__all__ = ["DecodeKernel", "num_splits_for"]
