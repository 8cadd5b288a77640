"""What the call conventions share: the Params fields every attention call fills, the key of a
padded call, strides, the mask and score fields of a plan, TMA maps of a call's shape, and the
checks and longest-first order of varlen sequences (cu_seqlens) that the forward's and the
backward's varlen calls both take. No convention is named here; each imports what it needs."""
from __future__ import annotations

import numbers
import threading

from ..kernel import MAX_GRID_YZ, VARLEN_LAYOUT

INT32_MAX = 2**31 - 1

TENSORS = ("q", "k", "v", "o")
# The Params fields every attention call fills, in the order the calls list their values.
STRIDES = tuple(f"{t}_{d}_stride" for t in TENSORS for d in ("batch", "head", "row"))
ATTENTION_FIELDS = ("q", "k", "v", "o", "lse") + STRIDES + (
    "lse_batch_stride", "lse_head_stride", "batch", "heads", "kv_heads", "seqlen_q", "seqlen_k", "scale_log2")


def call_key(q, k, v, causal, alignment, scale, return_lse, layout, variants=()) -> tuple:
    """What decides a padded call's checks, grid and Params: shapes, strides, dtypes, devices and
    options (not the pointers); calls with one key share a prepared call. `variants`: the call's
    variant arguments (variant_key). AttributeError or TypeError when an input is not a tensor (the
    full path then says what is wrong)."""
    return (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype, v.dtype,
            q.get_device(), k.get_device(), v.get_device(), causal, alignment, scale, return_lse, layout, variants)


def tensor_key(t) -> tuple:
    """A tensor argument as part of a call's key: by address and layout (the kernel reads it at
    launch, so new values at the same address need no new Params)."""
    return (t.data_ptr(), t.shape, t.stride(), t.dtype, t.get_device())


def layout_key(t) -> tuple:
    """A tensor argument whose address each call patches (a caller's out, an append's new tokens) as part
    of a call's key: its layout (shape, strides, dtype, device), not its address. AttributeError when it
    is not a tensor."""
    return (t.shape, t.stride(), t.dtype, t.get_device())


def variant_key(window, softcap, alibi_slopes, params=None, sinks=None) -> tuple:
    """The variant arguments of a call as part of its key (tensors by tensor_key); params, an
    expression spec's dict, by name."""
    if window is None and softcap is None and alibi_slopes is None and params is None and sinks is None:
        return ()
    slopes = None if alibi_slopes is None else tensor_key(alibi_slopes)
    named = None if params is None else tuple(
        (n, tensor_key(v) if hasattr(v, "data_ptr") else (type(v), v)) for n, v in sorted(params.items()))
    return (None if window is None else tuple(window), softcap, slopes, named,
            None if sinks is None else tensor_key(sinks))


def bhsd_strides(stride, layout: str) -> tuple[int, int, int]:
    """(batch, head, row) element strides of a 4-D tensor given in `layout`."""
    return (stride[0], stride[1], stride[2]) if layout == "bhsd" else (stride[0], stride[2], stride[1])


def shape_maps(plan, q, k, v, out, layout: str, v_transposed: bool = False):
    """The TMA tensor maps of a call's shape: each tensor as its (B, H, S, D) view; v_transposed: v
    is V^T, (B, H, D, S) in every layout, mapped as it is."""
    from ..tma import ShapeMaps   # only kernels that load through TMA maps need the encoder
    views = {"q": q, "k": k, "v": v, "o": out}
    if layout != "bhsd":
        views = {name: t if name == "v" and v_transposed else t.permute(0, 2, 1, 3) for name, t in views.items()}
    return ShapeMaps(plan.tensor_maps, views)


def mask_fields(plan) -> tuple:
    """The Params fields of every mask variant and score modifier the plan's functions use, each
    with its default."""
    return tuple(f for m in plan.mask_variants for f in m.abi_fields) + tuple(
        f for s in plan.score_variants for f in s.abi_fields)


# -- varlen sequences -----------------------------------------------------------------------------

def check_sequences(kernel, q, k, v, cu_seqlens_q, cu_seqlens_k) -> tuple[int, int, int, int, int, int]:
    """The checks every varlen call makes of its tensors and offsets (without reading the offsets
    back): (device index, total_q, heads, total_k, kv_heads, sequences)."""
    index = kernel._device_index(q)
    qs = kernel._check_tensor("q", q, VARLEN_LAYOUT, index)
    ks = kernel._check_tensor("k", k, VARLEN_LAYOUT, index)
    vs = kernel._check_tensor("v", v, VARLEN_LAYOUT, index, v_dim=True)   # V's head dim: the spec's head_dim_v
    total_q, heads, _ = qs
    total_k, kv_heads, _ = ks
    if ks[:-1] != vs[:-1]:
        raise ValueError(f"k and v must have the same shape but for the head dim (got {tuple(ks)} and {tuple(vs)})")
    kernel._check_heads(heads, kv_heads, heads=heads)
    if max(total_q, total_k) > INT32_MAX:
        raise ValueError(f"varlen tensors of more than {INT32_MAX} rows do not fit int32 offsets")
    if not kernel.varlen_masks:
        raise ValueError(f"{kernel.label} has no varlen functions: add `varlen: true` to its spec")
    batch = check_offsets(kernel._torch, "cu_seqlens_q", cu_seqlens_q, index)
    if check_offsets(kernel._torch, "cu_seqlens_k", cu_seqlens_k, index) != batch:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must list the same sequences (got {cu_seqlens_q.numel()} "
                         f"and {cu_seqlens_k.numel()} offsets)")
    if batch > MAX_GRID_YZ:
        raise ValueError(f"{batch} sequences exceed {MAX_GRID_YZ} (grid z limit)")
    return index, total_q, heads, total_k, kv_heads, batch


class SequenceOrders:
    """The longest-first order of a cu_seqlens_k, computed once per table on the default stream: every
    layer of a model passes the same cu_seqlens_k, so one argsort serves them all. Keyed by the
    tensor's address, version counter (bumped by any in-place write), size and the stream (the order is
    computed on the stream that reads it, so it is ready before the kernel does). A stale entry could
    only give a permutation of the same batch: the order changes the schedule, never the result."""

    ENTRIES = 64

    def __init__(self):
        self._cache: dict = {}
        self._lock = threading.Lock()

    def longest_first(self, torch, cu_seqlens_k, batch: int, index: int, counts: bool = False):
        """The order of the sequences of cu_seqlens_k (offsets, batch + 1), or with `counts` of a
        seqused_k (each sequence's key count, batch), longest first."""
        order_of = longest_first_by_count if counts else longest_first
        stream = torch._C._cuda_getCurrentRawStream(index)
        if stream or torch._C._cuda_isCurrentStreamCapturing():
            # Kept only for calls on the device's default stream: a CUDA graph's capture (its order
            # would only be computed when the graph replays) and torch.compile's CUDA-graph warm-up (its
            # allocations go to the graph's pool, which must hold nothing past the call) run on
            # streams of their own, and so may a caller's; those compute the order per call.
            return order_of(torch, cu_seqlens_k)
        key = (cu_seqlens_k.data_ptr(), cu_seqlens_k._version, batch, index, stream, counts)
        order = self._cache.get(key)
        if order is None:
            order = order_of(torch, cu_seqlens_k)
            with self._lock:
                if len(self._cache) >= self.ENTRIES:
                    self._cache.clear()
                self._cache[key] = (order, cu_seqlens_k)   # holds the table: its address is not reused meanwhile
            return order
        return order[0]


ORDERS = SequenceOrders()     # one per process: the calls of every kernel share a table's order


def longest_first(torch, cu_seqlens_k):
    """The sequences by key count, longest first (int32, on the GPU, no host sync): a block's work
    grows with its sequence's keys, and blocks taken longest first leave short ones for the tail of
    the grid. Measured on the H200 (16 sequences of 1-4096 tokens, 16 heads, d128, 128x32 tiles):
    without it 1360 us in ascending and 1277 us in descending order; with it 1302 and 1301 us."""
    return torch.argsort(cu_seqlens_k[1:] - cu_seqlens_k[:-1], descending=True, stable=True).to(torch.int32)


def longest_first_by_count(torch, seqused_k):
    """longest_first of key counts given per sequence (a paged call's seqused_k)."""
    return torch.argsort(seqused_k, descending=True, stable=True).to(torch.int32)


def check_offsets(torch, name: str, cu, index: int) -> int:
    """Type, shape and device of a cu_seqlens tensor; returns the number of sequences."""
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of int32 (got {type(cu).__name__})")
    if cu.dtype != torch.int32:
        raise TypeError(f"{name} must be int32 (got {cu.dtype}); pass {name}.int()")
    if cu.dim() != 1 or cu.numel() < 2 or not cu.is_contiguous():
        raise ValueError(f"{name} must be a contiguous 1-D tensor of batch + 1 >= 2 offsets (got shape "
                         f"{tuple(cu.shape)})")
    if cu.get_device() != index:
        raise ValueError(f"{name} is on {cu.device} but q is on cuda:{index}")
    return cu.numel() - 1


def offsets_on_host(name: str, cu, total: int, where: str) -> list[int]:
    """The sequence lengths of a cu_seqlens tensor, read back and checked: offsets from 0 or more,
    never decreasing, the last within the `total` rows of the varlen tensor."""
    offsets = cu.tolist()
    if offsets[0] < 0:
        raise ValueError(f"{name}[0] is {offsets[0]}; offsets are row numbers, 0 or more")
    for b in range(len(offsets) - 1):
        if offsets[b + 1] < offsets[b]:
            raise ValueError(f"{name} decreases at sequence {b}: {offsets[b]} then {offsets[b + 1]} (offsets must "
                             f"be cumulative lengths, non-decreasing)")
    if offsets[-1] > total:
        raise ValueError(f"{name}[-1] is {offsets[-1]} but the varlen tensor has {total} rows ({where})")
    return [offsets[b + 1] - offsets[b] for b in range(len(offsets) - 1)]


def check_page_ids(torch, table, lens, num_pages: int, page: int) -> None:
    """Every page a sequence uses (its first ceil(len / page) entries of `table`; lens a tensor of key
    counts on the table's device) is a page of the pool; entries past a sequence's pages are never read
    and may hold anything (e.g. -1). One read back; a paged call's validate=True."""
    used = torch.arange(table.shape[1], device=table.device)[None, :] < ((lens + page - 1) // page)[:, None]
    ids = table[used]
    if ids.numel():
        lo, hi = (int(x) for x in torch.aminmax(ids))
        if lo < 0 or hi >= num_pages:
            raise ValueError(f"block_table holds page id {lo if lo < 0 else hi} for a key of some sequence; "
                             f"the pools have pages 0..{num_pages - 1}")


def check_max_seqlen_q(max_seqlen_q) -> None:
    """A varlen call's max_seqlen_q: None or a non-negative integer."""
    if max_seqlen_q is not None and (isinstance(max_seqlen_q, bool) or not isinstance(max_seqlen_q, numbers.Integral)
                                     or max_seqlen_q < 0):
        raise ValueError(f"max_seqlen_q must be a non-negative integer (got {max_seqlen_q!r})")


def query_rows(max_seqlen_q, total_q: int, longest: int | None = None) -> int:
    """The query rows a varlen grid covers per sequence: max_seqlen_q, checked against the longest query
    sequence where it was read back (validate=True; unset: the longest), else at most total_q (unset: total_q,
    which covers any sequence; blocks past a sequence's end return at once)."""
    if longest is not None:
        if max_seqlen_q is not None and max_seqlen_q < longest:
            raise ValueError(f"max_seqlen_q is {max_seqlen_q} but a query sequence has {longest} rows; pass at least "
                             f"{longest} (or leave it unset)")
        return longest if max_seqlen_q is None else int(max_seqlen_q)
    return total_q if max_seqlen_q is None else min(int(max_seqlen_q), total_q)


__all__ = ["ATTENTION_FIELDS", "INT32_MAX", "ORDERS", "SequenceOrders", "bhsd_strides", "call_key", "check_max_seqlen_q",
           "check_offsets", "check_page_ids", "check_sequences", "longest_first", "longest_first_by_count", "mask_fields", "offsets_on_host", "query_rows", "shape_maps", "tensor_key",
           "variant_key"]
