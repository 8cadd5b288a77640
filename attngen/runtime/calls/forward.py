"""The forward call convention: ``kernel(q, k, v, causal=..., ...)`` on padded (B, H, S, D) or
(B, S, H, D) tensors, one launch. A forward spec with `varlen: true` also takes packed sequences
through ``kernel.varlen(...)`` (attngen/runtime/calls/varlen.py)."""
from __future__ import annotations

from ...core.forward import LOG2E
from ...core.varlen import is_packed, mask_of
from ..kernel import LAYOUTS, MAX_GRID_X, MAX_GRID_YZ, Kernel

TENSORS = ("q", "k", "v", "o")
STRIDES = tuple(f"{t}_{d}_stride" for t in TENSORS for d in ("batch", "head", "row"))
PER_CALL = ("q", "k", "v", "o", "lse") + STRIDES + (
    "lse_batch_stride", "lse_head_stride", "batch", "heads", "kv_heads", "seqlen_q", "seqlen_k", "scale_log2")


def bhsd_strides(stride, layout: str) -> tuple[int, int, int]:
    """(batch, head, row) element strides of a 4-D tensor given in `layout`."""
    return (stride[0], stride[1], stride[2]) if layout == "bhsd" else (stride[0], stride[2], stride[1])


def mask_fields(plan) -> tuple:
    """The Params fields of every mask variant the plan's functions use, each with its default."""
    return tuple(f for m in plan.mask_variants for f in m.abi_fields)


class ForwardKernel(Kernel):
    """A forward spec, callable on torch tensors.

    ``kernel(q, k, v, causal=False, scale=None, return_lse=False, layout="bhsd")`` returns o, or
    (o, lse) with lse of shape (batch, heads, seqlen_q), fp32, natural log.
    """

    def _setup(self) -> None:
        plan = self.plan
        self._mask_fields = mask_fields(plan)
        self._map_fields = tuple(m.abi_field for m in plan.tensor_maps)
        self._forward = plan.abi.packer(PER_CALL + tuple(f.name for f in self._mask_fields) + self._map_fields)
        self._varlen_packer = None          # made by the varlen call on first use

    @property
    def varlen_masks(self) -> tuple[str, ...]:
        """The masks of the packed-sequence call (kernel.varlen(...)); empty unless the spec sets varlen."""
        return tuple(mask_of(key) for key in self.entry if is_packed(key))

    def varlen(self, q, k, v, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q: int | None = None, causal: bool = False,
               alignment: str | None = None, scale: float | None = None, return_lse: bool = False, out=None,
               lse_out=None, validate: bool = False):
        """Attention over packed sequences of different lengths (see attngen.runtime.calls.varlen.varlen_call):
        q (total_q, Hq, D), k and v (total_k, Hkv, D), cu_seqlens_q/k int32 (batch + 1); returns o
        shaped like q, or (o, lse) with lse fp32 (Hq, total_q)."""
        from .varlen import varlen_call
        return varlen_call(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=max_seqlen_q, causal=causal,
                           alignment=alignment, scale=scale, return_lse=return_lse, out=out, lse_out=lse_out,
                           validate=validate)

    def __call__(self, q, k, v, *, causal: bool = False, alignment: str | None = None, scale: float | None = None,
                 return_lse: bool = False, layout: str = "bhsd", out=None, lse_out=None):
        """Attention softmax(scale * q k^T) v of q (B, Hq, Sq, D), k and v (B, Hkv, Sk, D).

        layout "bshd" takes and returns (B, S, H, D) instead. Any strides work as long as the
        last dimension is contiguous and the others are multiples of 8 elements. `alignment` of a
        causal mask: "top_left" (default, torch SDPA is_causal: query i sees keys <= i) or
        "bottom_right" (FlashAttention >= 2.1: query i sees keys <= i + Sk - Sq; rows that see no
        key give zeros and LSE -inf). GQA/MQA: query head h reads kv head
        h // (Hq // Hkv). `out` (shaped like q) and `lse_out` (fp32 (B, Hq, Sq), contiguous)
        receive the results instead of new tensors; lse_out implies return_lse. No keys (Sk 0)
        gives zeros and LSE -inf, as FlashAttention does; no queries gives empty tensors.
        """
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)} (got {layout!r})")
        index = self._device_index(q)
        qs = self._check_tensor("q", q, layout, index)
        ks = self._check_tensor("k", k, layout, index)
        vs = self._check_tensor("v", v, layout, index)
        bhsd = layout == "bhsd"
        batch, heads, seqlen_q = (qs[0], qs[1], qs[2]) if bhsd else (qs[0], qs[2], qs[1])
        kv_heads, seqlen_k = (ks[1], ks[2]) if bhsd else (ks[2], ks[1])
        if ks[0] != batch or vs[0] != batch:
            raise ValueError(f"q, k and v must have the same batch size (got {batch}, {ks[0]}, {vs[0]})")
        if ks != vs:
            raise ValueError(f"k and v must have the same shape (got {tuple(ks)} and {tuple(vs)})")
        if not heads or not kv_heads or heads % kv_heads:
            raise ValueError(f"query heads ({heads}) must be a positive multiple of kv heads ({kv_heads}) for GQA/MQA")
        if heads > MAX_GRID_YZ or batch > MAX_GRID_YZ:
            raise ValueError(f"heads ({heads}) and batch ({batch}) must be at most {MAX_GRID_YZ} (grid y/z limit)")
        mask = self._check_mask(causal)
        variant = self._mask_variant(mask, causal, alignment)
        mask_values = variant.abi_values(alignment, seqlen_q, seqlen_k)
        scale = self._check_scale(scale)
        out = self._output(out, q, layout, index)
        torch = self._torch
        if lse_out is not None:
            self._check_lse(lse_out, (batch, heads, seqlen_q), index)
            return_lse = True
        elif return_lse:
            lse_out = torch.empty((batch, heads, seqlen_q), dtype=torch.float32, device=q.device)
        if not (batch and seqlen_q and seqlen_k):
            if batch and seqlen_q:   # no keys: FlashAttention's zeros and LSE -inf
                out.zero_()
                if return_lse:
                    lse_out.fill_(float("-inf"))
            return (out, lse_out) if return_lse else out

        info = self._device(index)
        plan = self.plan
        grid = plan.grid(batch, heads, seqlen_q, info.sm_count)
        if grid[0] > MAX_GRID_X:
            raise ValueError(f"seqlen_q {seqlen_q} needs more than {MAX_GRID_X} blocks")
        so = out.stride()
        values = [q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse_out.data_ptr() if return_lse else 0,
                  *bhsd_strides(q.stride(), layout), *bhsd_strides(k.stride(), layout),
                  *bhsd_strides(v.stride(), layout), *bhsd_strides(so, layout),
                  heads * seqlen_q, seqlen_q, batch, heads, kv_heads, seqlen_q, seqlen_k, scale * LOG2E]
        for f in self._mask_fields:
            values.append(mask_values.get(f.name, f.default))
        if self._map_fields:
            views = {"q": q, "k": k, "v": v, "o": out} if bhsd else \
                {"q": q.permute(0, 2, 1, 3), "k": k.permute(0, 2, 1, 3), "v": v.permute(0, 2, 1, 3),
                 "o": out.permute(0, 2, 1, 3)}
            maps = self._maps().fields(views)
            values.extend(maps[name] for name in self._map_fields)
        self._launch(self.functions[self.entry[mask]], self._forward, values, grid, info)
        return (out, lse_out) if return_lse else out


__all__ = ["ForwardKernel", "bhsd_strides", "mask_fields"]
