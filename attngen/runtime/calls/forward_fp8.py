"""The e4m3 forward call convention: ``kernel(q, k, v_t, q_descale=..., k_descale=..., v_descale=...,
causal=...)`` on fp8 tensors, one launch, a fp16/bf16 output.

V comes transposed, (batch, kv_heads, head_dim, seqlen_k) with keys contiguous, whatever the layout of
q and k: the B operand of an 8-bit mma is K-major. `quantize_fp8` makes all of it from fp16/bf16/fp32
q, k and v: e4m3 tensors, V transposed, and FlashAttention-3's descale factors, fp32 (batch,
kv_heads)."""
from __future__ import annotations

from ...core.constants import LOG2E
from ..kernel import LAYOUTS, LOAD_BYTES, MAX_GRID_X, Kernel, Prepared
from .shared import bhsd_strides, mask_fields, layout_key, shape_maps, tensor_key

E4M3_MAX = 448.0            # the largest finite e4m3 value
DESCALES = ("q_descale", "k_descale", "v_descale")
POINTERS = ("q", "k", "v", "o", "lse") + DESCALES
PER_CALL = POINTERS + tuple(f"{t}_{d}_stride" for t in ("q", "k", "v", "o") for d in ("batch", "head", "row")) + (
    "lse_batch_stride", "lse_head_stride", "batch", "heads", "kv_heads", "seqlen_q", "seqlen_k", "scale_log2")
OUT_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}


def descale_key(t) -> tuple | None:
    """A descale argument as part of a call's key: its layout, not its address (each call patches it)."""
    return None if t is None else tensor_key(t)[1:]


class Fp8ForwardKernel(Kernel):
    """An e4m3 forward spec, callable on torch float8_e4m3fn tensors.

    ``kernel(q, k, v_t, q_descale=None, k_descale=None, v_descale=None, causal=False, scale=None,
    return_lse=False, layout="bhsd")`` returns o in the spec's out_dtype, or (o, lse) with lse fp32
    (batch, heads, seqlen_q), natural log. attention = softmax(scale * q_descale * k_descale * q k^T)
    (v_descale * v).
    """

    def _setup(self) -> None:
        self._mask_fields = mask_fields(self.plan)
        self._map_fields = tuple(m.abi_field for m in self.plan.tensor_maps)   # Hopper: TMA maps of q, k, v^T
        self._forward = self.plan.abi.packer(PER_CALL + tuple(f.name for f in self._mask_fields) + self._map_fields)
        self._pointers = self.plan.abi.patch(POINTERS + self._map_fields)
        self._fp32 = self._torch.float32
        self.out_dtype = getattr(self._torch, OUT_DTYPES[self.plan.spec.out_dtype])

    def __call__(self, q, k, v_t, *, q_descale=None, k_descale=None, v_descale=None, causal: bool = False,
                 alignment: str | None = None, scale: float | None = None, return_lse: bool = False,
                 layout: str = "bhsd", out=None, lse_out=None):
        """Attention of e4m3 q (B, Hq, Sq, D) and k (B, Hkv, Sk, D) (layout "bshd": (B, S, H, D)) with
        v_t, V transposed: (B, Hkv, D, Sk) in either layout, keys contiguous, other strides multiples
        of 16. Descales: fp32 (B, Hkv) tensors on the GPU (None: 1); each call reads them, so new
        values need no new call. `causal`, `alignment`, `scale`, `out`, `lse_out` as the fp16 call
        (kernel.__call__ of a forward spec)."""
        descales = (q_descale, k_descale, v_descale)
        key = None
        if lse_out is None:
            try:
                key = (q.shape, k.shape, v_t.shape, q.stride(), k.stride(), v_t.stride(), q.dtype, k.dtype,
                       v_t.dtype, q.get_device(), k.get_device(), v_t.get_device(), causal, alignment, scale,
                       return_lse, layout, tuple(descale_key(d) for d in descales))
                if out is not None:   # by its layout, as the fp16 call's
                    key += (layout_key(out),)
                prepared = self._prepared.get(key)
            except (AttributeError, TypeError):
                key = prepared = None
            if prepared is not None:
                result = self._run_fp8(prepared, q, k, v_t, descales, return_lse, out)
                if result is not None:
                    return result
        return self._first_fp8_call(q, k, v_t, descales, causal, alignment, scale, return_lse, layout, out,
                                    lse_out, key)

    def _run_fp8(self, prepared, q, k, v_t, descales, return_lse: bool, out=None):
        """A prepared call on new tensors of its shape (into `out` when given, of the prepared layout);
        None when a pointer is not 16-byte aligned."""
        qp, kp, vp = q.data_ptr(), k.data_ptr(), v_t.data_ptr()
        if (qp | kp | vp | (0 if out is None else out.data_ptr())) % LOAD_BYTES:
            return None
        if out is None:
            out = q.new_empty(q.shape, dtype=self.out_dtype)
        op = out.data_ptr()
        lse = q.new_empty(prepared.extra[0], dtype=self._fp32) if return_lse else None
        pointers = (qp, kp, vp, op, lse.data_ptr() if return_lse else 0,
                    *(0 if d is None else d.data_ptr() for d in descales))
        if self._map_fields:
            pointers += prepared.extra[1].values((qp, kp, vp, op))
        self._run(prepared, pointers)
        return (out, lse) if return_lse else out

    def _check_vt(self, v_t, batch: int, kv_heads: int, seqlen_k: int, index: int) -> None:
        """V transposed: e4m3 (batch, kv_heads, head_dim, seqlen_k), keys contiguous, 16-byte rows."""
        if not isinstance(v_t, self._tensor_type):
            raise TypeError(f"v_t must be a torch.Tensor (got {type(v_t).__name__})")
        want = (batch, kv_heads, self.plan.head_dim, seqlen_k)
        if tuple(v_t.shape) != want:
            raise ValueError(f"v_t must be V transposed, (batch, kv_heads, head_dim, seqlen_k) = {want} in every "
                             f"layout (got {tuple(v_t.shape)}); quantize_fp8 makes it from v")
        if v_t.dtype is not self.dtype:
            raise TypeError(f"v_t is {v_t.dtype} but {self.label} takes {self.dtype}")
        if v_t.get_device() != index:
            raise ValueError(f"v_t is on {v_t.device} but q is on cuda:{index}: every tensor of a call must be on one GPU")
        stride = v_t.stride()
        if stride[-1] != 1 or any(n > 1 and s % LOAD_BYTES for n, s in zip(v_t.shape[:-1], stride[:-1])):
            raise ValueError(f"v_t's keys must be contiguous and its other strides multiples of {LOAD_BYTES} (got "
                             f"{tuple(stride)}); pad seqlen_k to a multiple of {LOAD_BYTES} in its storage "
                             f"(quantize_fp8 does)")
        if v_t.data_ptr() % LOAD_BYTES:
            raise ValueError(f"v_t's data pointer is not {LOAD_BYTES}-byte aligned (offset view?); pass v_t.clone()")

    def _check_descale(self, name: str, t, batch: int, kv_heads: int, index: int) -> None:
        torch = self._torch
        if not isinstance(t, self._tensor_type):
            raise TypeError(f"{name} must be None or a torch.Tensor (got {type(t).__name__})")
        if t.dtype != torch.float32 or tuple(t.shape) != (batch, kv_heads) or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous fp32 tensor of shape (batch, kv_heads) = {(batch, kv_heads)} "
                             f"(got {t.dtype}, {tuple(t.shape)}, strides {tuple(t.stride())})")
        if t.get_device() != index:
            raise ValueError(f"{name} is on {t.device} but q is on cuda:{index}")

    def _first_fp8_call(self, q, k, v_t, descales, causal, alignment, scale, return_lse, layout, out, lse_out, key):
        """Every check, the grid and the Params of a call; remembered under `key` for later calls."""
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)} (got {layout!r})")
        index = self._device_index(q)
        qs = self._check_tensor("q", q, layout, index)
        ks = self._check_tensor("k", k, layout, index)
        bhsd = layout == "bhsd"
        batch, heads, seqlen_q = (qs[0], qs[1], qs[2]) if bhsd else (qs[0], qs[2], qs[1])
        kv_heads, seqlen_k = (ks[1], ks[2]) if bhsd else (ks[2], ks[1])
        if ks[0] != batch:
            raise ValueError(f"q and k must have the same batch size (got {batch}, {ks[0]})")
        self._check_heads(heads, kv_heads, heads=heads, batch=batch)
        self._check_vt(v_t, batch, kv_heads, seqlen_k, index)
        for name, t in zip(DESCALES, descales):
            if t is not None:
                self._check_descale(name, t, batch, kv_heads, index)
        mask = self._check_mask(causal)
        scale = self._check_scale(scale)
        mask_values = self._variant_values(mask, causal, alignment, None, seqlen_q, seqlen_k, scale, {},
                                           {"batch": batch, "heads": heads, "device": index})
        if out is None:
            out = q.new_empty(q.shape, dtype=self.out_dtype)
        elif tuple(self._check_tensor("out", out, layout, index, dtype=self.out_dtype)) != tuple(qs):
            raise ValueError(f"out must have q's shape {tuple(qs)} (got {tuple(out.shape)})")
        lse_shape = (batch, heads, seqlen_q)
        lse_out, return_lse = self._lse_output(lse_out, return_lse, lse_shape, index)
        done = self._without_launch(out, lse_out, return_lse, batch, seqlen_q, seqlen_k)
        if done is not None:
            return done

        info = self._device(index)
        grid = self.plan.grid(batch, heads, seqlen_q, info.sm_count)
        if grid[0] > MAX_GRID_X:
            raise ValueError(f"seqlen_q {seqlen_q} needs more than {MAX_GRID_X} blocks")
        pointers = (q.data_ptr(), k.data_ptr(), v_t.data_ptr(), out.data_ptr(), lse_out.data_ptr() if return_lse else 0,
                    *(0 if d is None else d.data_ptr() for d in descales))
        values = [*pointers, *bhsd_strides(q.stride(), layout), *bhsd_strides(k.stride(), layout),
                  *v_t.stride()[:3], *bhsd_strides(out.stride(), layout),
                  heads * seqlen_q, seqlen_q, batch, heads, kv_heads, seqlen_q, seqlen_k, scale * LOG2E]
        for f in self._mask_fields:
            values.append(mask_values.get(f.name, f.default))
        maps = shape_maps(self.plan, q, k, v_t, out, layout, v_transposed=True) if self._map_fields else None
        map_values = maps.values(pointers[:4]) if maps else ()
        values.extend(map_values)
        function = self._forward_entry(mask, batch, heads, seqlen_q, seqlen_k)
        prepared = Prepared(info, self._launches(info, (function, grid)), self._forward.pack(values),
                            self._pointers, (lse_shape, maps))
        self._remember(key, prepared)
        self._run(prepared, pointers + map_values)
        return (out, lse_out) if return_lse else out


def quantize_fp8(q, k, v, *, layout: str = "bhsd"):
    """(q8, k8, v_t8, q_descale, k_descale, v_descale): e4m3 copies of q, k and v scaled per (batch, kv
    head) so that each one's largest magnitude maps to 448, V transposed to (B, Hkv, D, Sk) with its
    key stride padded to 16, and the fp32 (B, Hkv) factors that undo the scaling (FlashAttention-3's
    descales; q's are per kv head too, over the query heads of its group). Inputs (B, H, S, D), or
    (B, S, H, D) with layout "bshd"; q8 and k8 keep the layout."""
    import torch
    if layout not in ("bhsd", "bshd"):
        raise ValueError(f"layout must be bhsd or bshd (got {layout!r})")
    qb, kb, vb = ((t if layout == "bhsd" else t.transpose(1, 2)) for t in (q, k, v))
    batch, kv_heads = kb.shape[0], kb.shape[1]

    def amax_per_kv_head(t):     # (B, H, S, D) -> (B, Hkv): max |x| over each kv head's group of heads
        return t.float().abs().reshape(batch, kv_heads, -1).amax(dim=-1).clamp_min(1e-12)

    def quantize(t, amax):        # t (B, H, S, D) with its (B, Hkv) amax -> e4m3 and descale
        group = t.shape[1] // kv_heads
        factor = (E4M3_MAX / amax).repeat_interleave(group, dim=1)[:, :, None, None]
        return (t.float() * factor).to(torch.float8_e4m3fn), (amax / E4M3_MAX).contiguous()

    q8, q_descale = quantize(qb, amax_per_kv_head(qb))
    k8, k_descale = quantize(kb, amax_per_kv_head(kb))
    v8, v_descale = quantize(vb, amax_per_kv_head(vb))
    seqlen_k = vb.shape[2]
    padded = -(-seqlen_k // LOAD_BYTES) * LOAD_BYTES
    storage = torch.zeros(vb.shape[0], vb.shape[1], vb.shape[3], padded, dtype=torch.float8_e4m3fn, device=v.device)
    storage[..., :seqlen_k] = v8.transpose(2, 3)
    v_t = storage[..., :seqlen_k]
    if layout == "bshd":
        q8, k8 = q8.transpose(1, 2).contiguous(), k8.transpose(1, 2).contiguous()
    else:
        q8, k8 = q8.contiguous(), k8.contiguous()
    return q8, k8, v_t, q_descale, k_descale, v_descale


__all__ = ["Fp8ForwardKernel", "quantize_fp8"]
