"""The decode call convention (kinds with calls="decode"): `kernel(q, k_cache, v_cache,
cache_seqlens=..., causal=..., num_splits=...)` on torch tensors. A decode bundle has two parts:
the split kernel (parts[0], one function per mask) and the combine kernel (parts[1]); the call
launches the split kernel and, with more than one split, the combine kernel, on torch's current
stream. The fp32 workspace of the partial outputs comes from torch's allocator."""
from __future__ import annotations

import functools
import numbers
import threading

from ...core.launch_rules import MAX_PAGE_SIZE, num_splits, page_shift, row_blocks, visited_tiles
from ...core.constants import LOG2E
from ...core.variants import BOTTOM_RIGHT
from ..gpu import error_word
from ..kernel import LOAD_BYTES, MAX_GRID_YZ, Kernel, Prepared
from .shared import ATTENTION_FIELDS, bhsd_strides, check_page_ids, mask_fields, variant_key

WORKSPACES = 64                 # split-partial buffers kept (device x stream x thread)
POINTERS = ("q", "k", "v", "o", "lse", "cache_seqlens", "o_accum", "lse_accum", "block_table", "split_counters")
# A contiguous-only spec's Params has no block table (core.decode_plan.PAGE_FIELDS): its calls patch the others.
CONTIGUOUS_POINTERS = tuple(name for name in POINTERS if name != "block_table")
PER_CALL = ATTENTION_FIELDS + ("errors", "cache_seqlens", "o_accum", "lse_accum", "num_splits", "tiles_per_split",
                               "row_blocks", "split_counters", "block_table", "table_stride", "num_pages",
                               "page_size", "page_shift")
MAX_KEYS = 2 ** 31 - 1          # keys are 32-bit in the kernel: a paged cache's capacity (pages x page size)


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
    """

    def _setup(self) -> None:
        self._mask_fields = mask_fields(self.plan)
        self._decode = self.plan.abi.packer(PER_CALL + tuple(f.name for f in self._mask_fields))
        self._paged = self.plan.paged
        self._pointers = self.plan.abi.patch(POINTERS if self._paged else CONTIGUOUS_POINTERS)
        self._workspaces = {}        # (device, stream, thread) -> fp32 split partials
        self._captured = []          # workspaces of calls captured in CUDA graphs (the graphs read them)
        self._counter_buffers = {}   # (device, stream) -> zeroed int32 split counters (fused combine)
        self._counter_lock = threading.Lock()
        plan = self.plan
        self._max_splits = plan.max_splits
        self.last_splits = None

    def __call__(self, q, k_cache, v_cache, *, cache_seqlens=None, block_table=None, causal: bool = False,
                 scale: float | None = None, num_splits: int | None = None, return_lse: bool = False,
                 layout: str = "bhsd", out=None, validate: bool = False, window=None, softcap: float | None = None,
                 alibi_slopes=None, params: dict | None = None, sinks=None):
        variants = variant_key(window, softcap, alibi_slopes, params, sinks)
        key = None
        if out is None and not validate:
            # A shape seen before: its checks passed and its Params are laid out; only the pointers
            # are new (and must be 16-byte aligned).
            try:
                lens, table = cache_seqlens, block_table
                key = (q.shape, k_cache.shape, v_cache.shape, q.stride(), k_cache.stride(), v_cache.stride(), q.dtype,
                       k_cache.dtype, v_cache.dtype, q.get_device(), k_cache.get_device(), v_cache.get_device(),
                       None if lens is None else (lens.shape, lens.dtype, lens.stride(), lens.get_device()),
                       None if table is None else (table.shape, table.dtype, table.stride(), table.get_device()),
                       causal, scale, num_splits, return_lse, layout, variants)
                prepared = self._prepared.get(key)
            except (AttributeError, TypeError):
                key = prepared = None
            if prepared is not None:
                qp, kp, vp = q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr()
                if not (qp | kp | vp) % LOAD_BYTES:
                    return self._prepared_call(prepared, q, qp, kp, vp, cache_seqlens, block_table, return_lse)
        return self._first_call(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits,
                                return_lse, layout, out, validate, key, (window, softcap, alibi_slopes, params, sinks))

    def _prepared_call(self, prepared, q, qp, kp, vp, cache_seqlens, block_table, return_lse):
        lse_shape, accum, counters, splits = prepared.extra
        index = prepared.info.index
        out = self._torch.empty_like(q)
        lse = q.new_empty(lse_shape, dtype=self._torch.float32) if return_lse else None
        o_accum = lse_accum = 0
        if accum:
            o_accum = self._workspace(index, accum + accum // q.shape[-1])
            lse_accum = o_accum + 4 * accum
        lens = cache_seqlens.data_ptr() if cache_seqlens is not None else 0
        counted = self._counters(counters, index) if counters else 0
        if self._paged:
            self._run(prepared, (qp, kp, vp, out.data_ptr(), lse.data_ptr() if return_lse else 0, lens, o_accum,
                                 lse_accum, block_table.data_ptr() if block_table is not None else 0, counted))
        else:   # a contiguous-only spec: never a table (the first call refused one)
            self._run(prepared, (qp, kp, vp, out.data_ptr(), lse.data_ptr() if return_lse else 0, lens, o_accum,
                                 lse_accum, counted))
        self.last_splits = splits
        return (out, lse) if return_lse else out

    def _first_call(self, q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits, return_lse,
                    layout, out, validate, key, variants):
        """Every check, the split count and the Params of a call; remembered under `key`."""
        index, qs, ks, vs = self._padded_inputs(layout, ("q", "k_cache", "v_cache"), q, k_cache, v_cache)
        bhsd = layout == "bhsd"
        batch, heads, seqlen_q = (qs[0], qs[1], qs[2]) if bhsd else (qs[0], qs[2], qs[1])
        pool, kv_heads, rows = (ks[0], ks[1], ks[2]) if bhsd else (ks[0], ks[2], ks[1])
        paged = block_table is not None
        if ks != vs or (not paged and pool != batch) or (paged and pool < 1):
            what = "(num_pages, kv_heads, page_size, head_dim) page pools" if paged else \
                f"(batch {batch}, kv_heads, capacity, head_dim)"
            raise ValueError(f"k_cache and v_cache must both be {what} (got {tuple(ks)} and {tuple(vs)})")
        capacity = self._check_table(block_table, cache_seqlens, batch, rows, layout, index) if paged else rows
        page, shift = (rows, page_shift(rows)) if paged else (0, 0)
        self._check_heads(heads, kv_heads, batch=batch)
        window, softcap, alibi_slopes, params, sinks = variants
        mask = self._check_mask(causal, window)
        if cache_seqlens is not None:
            self._check_seqlens(cache_seqlens, batch, capacity, validate, layout, paged, index)
        if paged and validate:
            check_page_ids(self._torch, block_table, cache_seqlens, pool, page)
        scale = self._check_scale(scale)
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

        accum = splits * batch * heads * seqlen_q * self.plan.head_dim if splits > 1 else 0
        o_accum = lse_accum = 0
        if accum:   # (splits, B, H, Sq, D) partial outputs, then (splits, B, H, Sq) partial LSEs, fp32
            o_accum = self._workspace(index, accum + accum // self.plan.head_dim)
            lse_accum = o_accum + 4 * accum
        merges = self.plan.merges_in_kernel(splits)   # the split kernel merges the splits: no combine launch
        counters = batch * kv_heads * blocks_per_row if merges else 0
        lens_ptr = cache_seqlens.data_ptr() if cache_seqlens is not None else 0
        table_ptr = block_table.data_ptr() if paged else 0
        counters_ptr = self._counters(counters, index) if counters else 0
        values = [q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(),
                  lse.data_ptr() if lse is not None else 0,
                  *bhsd_strides(q.stride(), layout), *bhsd_strides(k_cache.stride(), layout),
                  *bhsd_strides(v_cache.stride(), layout), *bhsd_strides(out.stride(), layout),
                  heads * seqlen_q, seqlen_q, batch, heads, kv_heads, seqlen_q, capacity,
                  mask_values.pop("scale_log2", scale * LOG2E), error_word(index), lens_ptr, o_accum, lse_accum,
                  splits, tiles_per_split, blocks_per_row, counters_ptr, table_ptr,
                  block_table.stride(0) if paged else 0, pool if paged else 0, page, shift]
        values += [mask_values.get(f.name, f.default) for f in self._mask_fields]
        launches = [(self.entry[self.plan.split_key(mask, splits)], (splits, kv_heads * blocks_per_row, batch))]
        if splits > 1 and not merges:
            combine = self.functions[self.plan.combine_part.functions[0][1]]
            per_block = combine.threads // 32   # one output row per warp
            launches.append((combine.name, (-(-batch * heads * seqlen_q // per_block), 1, 1)))
        prepared = Prepared(info, self._launches(info, *launches), self._decode.pack(values), self._pointers,
                            ((batch, heads, seqlen_q), accum, counters, splits))
        if out_given is None:
            self._remember(key, prepared)
        self._run(prepared, tuple(values[:5]) + ((lens_ptr, o_accum, lse_accum, table_ptr, counters_ptr) if self._paged
                                                 else (lens_ptr, o_accum, lse_accum, counters_ptr)))
        self.last_splits = splits
        return (out, lse) if return_lse else out

    def _workspace(self, index: int, floats: int) -> int:
        """Address of `floats` fp32 elements of split partials, one buffer per device, stream and
        thread: calls on one stream run in order, and two threads sharing a stream (torch's
        default) must not overwrite each other's partials between their split and combine
        launches. Inside CUDA graph capture each call gets its own (the graph keeps it)."""
        torch = self._torch
        if torch._C._cuda_isCurrentStreamCapturing():
            buf = torch.empty(floats, dtype=torch.float32, device=f"cuda:{index}")
            self._captured.append(buf)
            return buf.data_ptr()
        key = (index, torch._C._cuda_getCurrentRawStream(index), threading.get_ident())
        buf = self._workspaces.get(key)
        if buf is None or buf.numel() < floats:
            if len(self._workspaces) >= WORKSPACES:
                self._workspaces.clear()
            buf = torch.empty(max(floats, 1 << 16), dtype=torch.float32, device=f"cuda:{index}")
            self._workspaces[key] = buf
        return buf.data_ptr()

    def _counters(self, n: int, index: int) -> int:
        """Address of n zeroed int32 split counters for a fused combine, one buffer per device and
        stream (the last block of each group resets its counter, so a buffer stays zero between
        calls; two streams at once must not share one, and calls on one stream run in order)."""
        key = (index, self._torch._C._cuda_getCurrentRawStream(index))
        buf = self._counter_buffers.get(key)
        if buf is None or buf.numel() < n:
            with self._counter_lock:
                buf = self._counter_buffers.get(key)
                if buf is None or buf.numel() < n:
                    buf = self._torch.zeros(max(n, 1024), dtype=self._torch.int32, device=f"cuda:{index}")
                    self._counter_buffers[key] = buf
        return buf.data_ptr()

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


def num_splits_for(plan, blocks: int, n_tiles: int, sm_count: int) -> int:
    return _splits(blocks, n_tiles, sm_count, plan.max_splits, plan.unsplit_in_flight)


@functools.lru_cache(maxsize=4096)
def _splits(blocks: int, n_tiles: int, sm_count: int, max_splits: int, in_flight: int) -> int:
    """The heuristic's split count on a GPU of `sm_count` SMs: one wave of one block per SM, even
    where two fit (d64): measured on the H200, 11-16 splits beat the 32 that two blocks per SM would
    take for 8 KV heads at batch 1 (14.3-14.7 vs 16.0 us at 8k keys), since every split adds a
    partial output to write and merge."""
    return num_splits(blocks, n_tiles, sm_count, 1, max_splits, in_flight)


__all__ = ["DecodeKernel", "num_splits_for"]
