"""The decode call convention (kinds with calls="decode"): `kernel(q, k_cache, v_cache,
cache_seqlens=..., causal=..., num_splits=...)` on torch tensors. A decode bundle has two parts:
the split kernel (parts[0], one function per mask) and the combine kernel (parts[1]); the call
launches the split kernel and, with more than one split, the combine kernel, on torch's current
stream. The fp32 workspace of the partial outputs comes from torch's allocator."""
from __future__ import annotations

import numbers

from .core.decode import num_splits, row_blocks
from .runtime import LOG2E, MAX_GRID_YZ, Kernel, LaunchConfig, pack_params


class DecodeKernel(Kernel):
    """A decode spec, callable on torch tensors.

    ``kernel(q, k_cache, v_cache, cache_seqlens=None, causal=False)`` returns o (shaped like q), or
    (o, lse) with return_lse. q is (B, Hq, Sq, D): the Sq new tokens of each sequence (1 for plain
    decode, up to a few for speculative decoding); k_cache and v_cache are (B, Hkv, capacity, D)
    ("bshd": (B, S, H, D) for all three). cache_seqlens (int32, (B,), on the GPU) gives the keys of
    each sequence, the new tokens included; None means every sequence fills the cache. causal: new
    token t sees the keys up to its own position, len - Sq + t (bottom-right). num_splits overrides
    the heuristic (1 to the spec's max_splits). validate=True reads the lengths back to check them
    (one small device-to-host copy); pass False inside CUDA graphs: the kernel then clamps a bad
    length to [0, capacity] rather than read outside the cache.

    Paged caches (the spec's page_size): k_cache and v_cache are pools of pages, (num_pages, Hkv,
    page_size, D) ("bshd": (num_pages, page_size, Hkv, D)), and block_table (int32, (B, max_pages))
    lists each sequence's pages in order; cache_seqlens is required. validate also checks that every
    page a sequence uses is in the pool (entries past its pages may hold anything); without it the
    kernel clamps page ids to the pool.
    """

    _sm_total = None   # SMs of the kernel's GPU, read on the first call that needs the heuristic

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._counter_buffers = {}   # stream -> zeroed int32 split counters (fused combine)

    def __call__(self, q, k_cache, v_cache, *, cache_seqlens=None, block_table=None, causal: bool = False,
                 scale: float | None = None, num_splits: int | None = None, return_lse: bool = False,
                 layout: str = "bhsd", out=None, validate: bool = True):
        import torch
        qb, kb, vb = self._views(layout, q=q, k_cache=k_cache, v_cache=v_cache)
        batch, heads, seqlen_q, _ = qb.shape
        pool, kv_heads, rows, _ = kb.shape
        paged = block_table is not None
        if tuple(kb.shape) != tuple(vb.shape) or (not paged and pool != batch):
            what = "(num_pages, kv_heads, page_size, head_dim) page pools" if paged else \
                f"(batch {batch}, kv_heads, capacity, head_dim)"
            raise ValueError(f"k_cache and v_cache must both be {what} (got {tuple(k_cache.shape)} and "
                             f"{tuple(v_cache.shape)})")
        capacity = self._check_table(block_table, cache_seqlens, batch, rows, layout) if paged else rows
        if heads % kv_heads:
            raise ValueError(f"query heads ({heads}) must be a multiple of kv heads ({kv_heads}) for GQA/MQA")
        if batch > MAX_GRID_YZ:
            raise ValueError(f"batch ({batch}) must be at most {MAX_GRID_YZ} (grid z limit)")
        mask = self._check_mask(causal)
        if cache_seqlens is not None:
            self._check_seqlens(cache_seqlens, batch, capacity, validate, layout, paged)
        if paged and validate:
            self._check_pages(block_table, cache_seqlens, pool)
        scale = self._check_scale(scale)
        blocks_per_row = row_blocks(self.plan, heads, kv_heads, seqlen_q)
        if kv_heads * blocks_per_row > MAX_GRID_YZ:
            raise ValueError(f"kv_heads x row blocks ({kv_heads} x {blocks_per_row}) exceed {MAX_GRID_YZ}")
        n_tiles = -(-capacity // self.plan.block_n)
        cap = self.plan.fragments.max_splits
        if num_splits is None:
            if self._sm_total is None:
                self._sm_total = torch.cuda.get_device_properties(q.device).multi_processor_count
            splits = num_splits_for(self.plan, batch * kv_heads * blocks_per_row, n_tiles, self._sm_total)
        else:
            if isinstance(num_splits, bool) or not isinstance(num_splits, numbers.Integral) or not 1 <= num_splits <= cap:
                raise ValueError(f"num_splits must be an integer from 1 to {cap} (the spec's max_splits; got "
                                 f"{num_splits!r})")
            splits = min(int(num_splits), n_tiles)
        tiles_per_split = -(-n_tiles // splits)
        splits = -(-n_tiles // tiles_per_split)   # no split left without a tile of the cache

        out, ob = self._output(out, q, layout)
        lse = torch.empty((batch, heads, seqlen_q), dtype=torch.float32, device=q.device) if return_lse else None
        o_accum = lse_accum = None
        if splits > 1:
            o_accum = torch.empty((splits, batch, heads, seqlen_q, self.plan.head_dim), dtype=torch.float32,
                                  device=q.device)
            lse_accum = torch.empty((splits, batch, heads, seqlen_q), dtype=torch.float32, device=q.device)
        params = pack_params(self.plan, q=q.data_ptr(), k=k_cache.data_ptr(), v=v_cache.data_ptr(), o=out.data_ptr(),
                             lse=lse.data_ptr() if lse is not None else 0, strides={"q": qb, "k": kb, "v": vb, "o": ob},
                             batch=batch, heads=heads, kv_heads=kv_heads, seqlen_q=seqlen_q, seqlen_k=capacity,
                             lse_batch_stride=heads * seqlen_q, lse_head_stride=seqlen_q, scale_log2=scale * LOG2E,
                             cache_seqlens=cache_seqlens.data_ptr() if cache_seqlens is not None else 0,
                             o_accum=o_accum.data_ptr() if o_accum is not None else 0,
                             lse_accum=lse_accum.data_ptr() if lse_accum is not None else 0,
                             num_splits=splits, tiles_per_split=tiles_per_split, row_blocks=blocks_per_row,
                             split_counters=(self._counters(batch * kv_heads * blocks_per_row)
                                             if splits > 1 and self.plan.fragments.fused_combine else 0),
                             block_table=block_table.data_ptr() if paged else 0,
                             table_stride=block_table.stride(0) if paged else 0, num_pages=pool if paged else 0)
        plan = self.plan
        self._launch_function(self.entry[mask], params, LaunchConfig(
            (splits, kv_heads * blocks_per_row, batch), (plan.threads, 1, 1), plan.smem_bytes if plan.smem_dynamic else 0))
        if splits > 1 and not plan.fragments.fused_combine:
            rows = batch * heads * seqlen_q
            combine = self.plan.parts[1]
            per_block = combine.threads // 32   # one output row per warp
            self._launch_function(combine.functions[0][1], params, LaunchConfig((-(-rows // per_block), 1, 1),
                                                                                (combine.threads, 1, 1), 0))
        self.last_splits = splits
        return (out, lse) if return_lse else out

    def _counters(self, n: int) -> int:
        """Address of n zeroed int32 split counters for a fused combine, one buffer per stream (the
        last block of each group resets its counter, so a buffer stays zero between calls; two
        streams at once must not share one)."""
        import torch
        stream = torch.cuda.current_stream(self.device).cuda_stream
        buf = self._counter_buffers.get(stream)
        if buf is None or buf.numel() < n:
            buf = torch.zeros(max(n, 1024), dtype=torch.int32, device=self.device)
            self._counter_buffers[stream] = buf
        return buf.data_ptr()

    def verify_cases(self, shapes, masks) -> list[tuple]:
        """`attngen verify`'s cases for this kernel: per-sequence lengths, GQA groups, splits."""
        from .eval.decode_verify import verify_cases
        return verify_cases(self, shapes, masks)

    def _check_table(self, table, lens, batch: int, page_rows: int, layout: str) -> int:
        """Shape checks of a paged call; returns the capacity of a sequence (pages per row x page size)."""
        import torch
        page = self.plan.fragments.page_size
        if not page:
            raise ValueError(f"{self.label} reads contiguous caches only: add page_size: N to its spec for a "
                             "paged cache (block_table)")
        if page_rows != page:
            raise ValueError(f"{self.label} is generated for pages of {page} keys; the pools hold pages of "
                             f"{page_rows} (k_cache.shape[{2 if layout == 'bhsd' else 1}])")
        if lens is None:
            raise ValueError("a paged cache needs cache_seqlens (int32, one length per sequence)")
        if not isinstance(table, torch.Tensor):
            raise TypeError(f"block_table must be a torch.Tensor of int32 (got {type(table).__name__})")
        if table.dtype != torch.int32:
            raise TypeError(f"block_table must be int32 (got {table.dtype}); pass block_table.int()")
        if table.dim() != 2 or table.shape[0] != batch or table.stride(1) != 1 or table.shape[1] < 1:
            raise ValueError(f"block_table must be ({batch}, max_pages) with contiguous rows (got shape "
                             f"{tuple(table.shape)}, strides {tuple(table.stride())})")
        if table.device != self.device:
            raise ValueError(f"block_table is on {table.device} but the kernel was loaded for {self.device}")
        return table.shape[1] * page

    def _check_pages(self, table, lens, pool: int) -> None:
        """Every page a sequence uses (its first ceil(len / page_size) entries) is a page of the pool;
        entries past a sequence's pages are never read and may hold anything (e.g. -1)."""
        import torch
        page = self.plan.fragments.page_size
        used = torch.arange(table.shape[1], device=table.device)[None, :] < ((lens + page - 1) // page)[:, None]
        ids = table[used]
        if ids.numel():
            lo, hi = (int(x) for x in torch.aminmax(ids))
            if lo < 0 or hi >= pool:
                raise ValueError(f"block_table holds page id {lo if lo < 0 else hi} for a key of some sequence; "
                                 f"the pools have pages 0..{pool - 1}")

    def _check_seqlens(self, lens, batch: int, capacity: int, validate: bool, layout: str, paged: bool) -> None:
        import torch
        if not isinstance(lens, torch.Tensor):
            raise TypeError(f"cache_seqlens must be a torch.Tensor of int32 (got {type(lens).__name__})")
        if lens.dtype != torch.int32:
            raise TypeError(f"cache_seqlens must be int32 (got {lens.dtype}); pass cache_seqlens.int()")
        if tuple(lens.shape) != (batch,) or not lens.is_contiguous():
            raise ValueError(f"cache_seqlens must be a contiguous ({batch},) tensor, one length per sequence "
                             f"(got shape {tuple(lens.shape)})")
        if lens.device != self.device:
            raise ValueError(f"cache_seqlens is on {lens.device} but the kernel was loaded for {self.device}")
        if validate:
            lo, hi = (int(x) for x in torch.aminmax(lens))
            if lo < 0 or hi > capacity:
                bad = lo if lo < 0 else hi
                where = ("block_table.shape[1] x page_size" if paged else
                         f"k_cache.shape[{2 if layout == 'bhsd' else 1}]")
                raise ValueError(f"cache_seqlens holds {bad}, outside [0, {capacity}] (the cache's capacity, {where})")


def num_splits_for(plan, blocks: int, n_tiles: int, sm_count: int) -> int:
    """The heuristic's split count on a GPU of `sm_count` SMs: one wave of one block per SM, even
    where two fit (d64): measured on the H200, 11-16 splits beat the 32 that two blocks per SM would
    take for 8 KV heads at batch 1 (14.3-14.7 vs 16.0 us at 8k keys), since every split adds a
    partial output to write and merge."""
    return num_splits(blocks, n_tiles, sm_count, 1, plan.fragments.max_splits)


__all__ = ["DecodeKernel", "num_splits_for"]
