"""The forward call convention: ``kernel(q, k, v, causal=..., ...)`` on padded (B, H, S, D) or
(B, S, H, D) tensors, one launch. A forward spec with `varlen: true` also takes varlen sequences
through ``kernel.varlen(...)`` (attngen/runtime/calls/varlen.py)."""
from __future__ import annotations

from ...core.constants import LOG2E
from ..kernel import LOAD_BYTES, MAX_GRID_X, Kernel, Prepared
from .shared import ATTENTION_FIELDS, bhsd_strides, call_key, mask_fields, layout_key, shape_maps, variant_key
from .varlen import paged_varlen_call, varlen_call

POINTERS = ("q", "k", "v", "o", "lse")      # the fields every call of a prepared shape patches


class ForwardKernel(Kernel):
    """A forward spec, callable on torch tensors.

    ``kernel(q, k, v, causal=False, scale=None, return_lse=False, layout="bhsd")`` returns o, or
    (o, lse) with lse of shape (batch, heads, seqlen_q), fp32, natural log. A spec's variants add
    window=(left, right), softcap=, alibi_slopes= and an expression spec's params= (see __call__).
    """

    def _setup(self) -> None:
        plan = self.plan
        self._mask_fields = mask_fields(plan)
        self._map_fields = tuple(m.abi_field for m in plan.tensor_maps)
        self._forward = plan.abi.packer(ATTENTION_FIELDS + tuple(f.name for f in self._mask_fields) + self._map_fields)
        self._pointers = plan.abi.patch(POINTERS + self._map_fields)
        self._fp32 = self._torch.float32
        self._varlen_packer = None          # made by the varlen call on first use

    def varlen(self, q, k, v, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q: int | None = None, causal: bool = False,
               alignment: str | None = None, scale: float | None = None, return_lse: bool = False, out=None,
               lse_out=None, validate: bool = False, window=None, softcap: float | None = None, alibi_slopes=None,
               params: dict | None = None, sinks=None, block_table=None, seqused_k=None, order_by=None,
               single_queries_apart: bool = False):
        """Attention over varlen sequences of different lengths (see attngen.runtime.calls.varlen.varlen_call):
        q (total_q, Hq, D), k and v (total_k, Hkv, D), cu_seqlens_q/k int32 (batch + 1); returns o
        shaped like q, or (o, lse) with lse fp32 (Hq, total_q). With block_table (a spec with paged: true),
        k and v are page pools (num_pages, page_size, Hkv, D) and seqused_k (or cu_seqlens_k) gives each
        sequence's keys (attngen.runtime.calls.varlen.paged_varlen_call); single_queries_apart leaves its
        sequences of one query to the paged decode kernel (DecodeKernel.rows_call), which writes them into out."""
        if block_table is not None:
            if params:
                raise ValueError("a paged varlen call takes no expression params: paged specs have no expression "
                                 "variant")
            return paged_varlen_call(self, q, k, v, cu_seqlens_q, block_table, seqused_k=seqused_k,
                                     cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, causal=causal,
                                     alignment=alignment, scale=scale, return_lse=return_lse, out=out,
                                     lse_out=lse_out, validate=validate, window=window, softcap=softcap,
                                     alibi_slopes=alibi_slopes, sinks=sinks, order_by=order_by,
                                     single_queries_apart=single_queries_apart)
        if single_queries_apart:
            raise ValueError("single_queries_apart is read with block_table (paged K/V) only")
        if order_by is not None:
            raise ValueError("order_by is read with block_table (paged K/V) only")
        if seqused_k is not None:
            raise ValueError("seqused_k is read with block_table (paged K/V) only so far; packed K/V take each "
                             "sequence's keys from cu_seqlens_k")
        return varlen_call(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=max_seqlen_q, causal=causal,
                           alignment=alignment, scale=scale, return_lse=return_lse, out=out, lse_out=lse_out,
                           validate=validate, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                           params=params, sinks=sinks)

    def __call__(self, q, k, v, *, causal: bool = False, alignment: str | None = None, scale: float | None = None,
                 return_lse: bool = False, layout: str = "bhsd", out=None, lse_out=None, window=None,
                 softcap: float | None = None, alibi_slopes=None, params: dict | None = None, sinks=None):
        """Attention softmax(scale * q k^T) v of q (B, Hq, Sq, D), k and v (B, Hkv, Sk, D).

        layout "bshd" takes and returns (B, S, H, D) instead. Any strides work as long as the
        last dimension is contiguous and the others are multiples of 8 elements. `alignment` of a
        causal mask: "top_left" (default, torch SDPA is_causal: query i sees keys <= i) or
        "bottom_right" (FlashAttention >= 2.1: query i sees keys <= i + Sk - Sq; rows that see no
        key give zeros and LSE -inf). GQA/MQA: query head h reads kv head
        h // (Hq // Hkv). `out` (shaped like q) and `lse_out` (fp32 (B, Hq, Sq), contiguous)
        receive the results instead of new tensors; lse_out implies return_lse. No keys (Sk 0)
        gives zeros and LSE -inf, as FlashAttention does; no queries gives empty tensors.

        Variants (where the spec has them): window=(left, right), FlashAttention's window_size:
        query i sees keys i + offset - left .. i + offset + right (offset 0, or Sk - Sq with
        alignment "bottom_right"), -1 for an unbounded side; causal=True bounds the right side at 0.
        softcap=cap: scores become cap * tanh(scale * s / cap) (a spec with scores: [softcap]).
        alibi_slopes: fp32 (Hq,) or (B, Hq) on the GPU: -slope * |i + Sk - Sq - j| is added to the
        scaled score (a spec with scores: [alibi]).
        sinks: fp32 (Hq,) on the GPU, learned logits: head h's joins every row's softmax denominator
        as a key with no value (gpt-oss; a spec with scores: [sink]); LSE includes it.
        params={name: value}: the values of an expression spec's variant.params (int, float, or an
        int32 / fp32 tensor of one element per head or per batch on the GPU).
        """
        variants = variant_key(window, softcap, alibi_slopes, params, sinks)
        key = None
        if lse_out is None:
            # A shape seen before: its checks passed and its Params are laid out; only the
            # pointers are new (and must be 16-byte aligned). A caller's out joins the key by its
            # layout (its strides are in the Params), not its address.
            try:
                key = call_key(q, k, v, causal, alignment, scale, return_lse, layout, variants)
                if out is not None:
                    key += (layout_key(out),)
                prepared = self._prepared.get(key)
            except (AttributeError, TypeError):
                key = prepared = None
            if prepared is not None:
                result = self.run_prepared(prepared, q, k, v, return_lse, out)
                if result is not None:
                    return result
        return self._first_call(q, k, v, causal, alignment, scale, return_lse, layout, out, lse_out, key,
                                (window, softcap, alibi_slopes, params, sinks))

    def prepared(self, key):
        """The prepared call of `key` (call_key of a call made before), or None."""
        return self._prepared.get(key)

    def run_prepared(self, prepared, q, k, v, return_lse: bool, out=None):
        """Launch a prepared call on new tensors of its shape: a new output (or `out`, of the layout the
        call was prepared with) and lse, the pointers patched in; None when a pointer is not 16-byte
        aligned (the caller takes the full path)."""
        qp, kp, vp = q.data_ptr(), k.data_ptr(), v.data_ptr()
        if (qp | kp | vp | (0 if out is None else out.data_ptr())) % LOAD_BYTES:
            return None
        if out is None:
            out = self._new_output(q)
        op = out.data_ptr()
        lse = q.new_empty(prepared.extra[0], dtype=self._fp32) if return_lse else None
        pointers = (qp, kp, vp, op, lse.data_ptr() if return_lse else 0)
        if self._map_fields:
            pointers += prepared.extra[1].values((qp, kp, vp, op))
        self._run(prepared, pointers)
        return (out, lse) if return_lse else out

    def native_forward(self, prepared, q, k, v, out):
        """set_forward's arguments of the native step (attngen/runtime/native) for a prepared call with
        return_lse, made on these tensors; None where the kernel takes no native replay."""
        shape_maps = prepared.extra[1] if self._map_fields else None
        maps = shape_maps.values((q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr())) if shape_maps else ()
        program = self.native_program(prepared, POINTERS, maps, shape_maps.order if shape_maps else ())
        if program is None:
            return None
        return (*program, self.plan.v_dim == self.plan.head_dim, [*q.shape[:-1], self.plan.v_dim],
                list(prepared.extra[0]))

    def _shape_maps(self, q, k, v, out, layout: str):
        """The TMA tensor maps of this call's shape (core of a prepared call), or None."""
        return shape_maps(self.plan, q, k, v, out, layout) if self._map_fields else None

    def _first_call(self, q, k, v, causal, alignment, scale, return_lse, layout, out, lse_out, key, variants):
        """Every check, the grid and the Params of a call; remembered under `key` for later calls."""
        index, qs, ks, vs = self._padded_inputs(layout, ("q", "k", "v"), q, k, v)
        bhsd = layout == "bhsd"
        batch, heads, seqlen_q = (qs[0], qs[1], qs[2]) if bhsd else (qs[0], qs[2], qs[1])
        kv_heads, seqlen_k = (ks[1], ks[2]) if bhsd else (ks[2], ks[1])
        if ks[0] != batch or vs[0] != batch:
            raise ValueError(f"q, k and v must have the same batch size (got {batch}, {ks[0]}, {vs[0]})")
        if ks[:-1] != vs[:-1]:
            raise ValueError(f"k and v must have the same shape but for the head dim (got {tuple(ks)} and {tuple(vs)})")
        self._check_heads(heads, kv_heads, heads=heads, batch=batch)
        window, softcap, alibi_slopes, params, sinks = variants
        mask = self._check_mask(causal, window)
        scale = self._check_scale(scale)
        mask_values = self._variant_values(mask, causal, alignment, window, seqlen_q, seqlen_k, scale,
                                           {"softcap": softcap, "alibi_slopes": alibi_slopes, "params": params,
                                            "sinks": sinks},
                                           {"batch": batch, "heads": heads, "device": index})
        out = self._output(out, q, layout, index)
        lse_shape = (batch, heads, seqlen_q)
        lse_out, return_lse = self._lse_output(lse_out, return_lse, lse_shape, index)
        done = self._without_launch(out, lse_out, return_lse, batch, seqlen_q, seqlen_k)
        if done is not None:
            return done

        info = self._device(index)
        plan = self.plan
        grid = plan.grid(batch, heads, seqlen_q, info.sm_count)
        if grid[0] > MAX_GRID_X:
            raise ValueError(f"seqlen_q {seqlen_q} needs more than {MAX_GRID_X} blocks")
        values = [q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse_out.data_ptr() if return_lse else 0,
                  *bhsd_strides(q.stride(), layout), *bhsd_strides(k.stride(), layout),
                  *bhsd_strides(v.stride(), layout), *bhsd_strides(out.stride(), layout),
                  heads * seqlen_q, seqlen_q, batch, heads, kv_heads, seqlen_q, seqlen_k,
                  mask_values.pop("scale_log2", scale * LOG2E)]
        for f in self._mask_fields:
            values.append(mask_values.get(f.name, f.default))
        shape_maps = self._shape_maps(q, k, v, out, layout)
        maps = shape_maps.values(tuple(values[:4])) if shape_maps else ()
        values.extend(maps)
        function = self._forward_entry(mask, batch, heads, seqlen_q, seqlen_k)
        prepared = Prepared(info, self._launches(info, (function, grid)), self._forward.pack(values),
                            self._pointers, (lse_shape, shape_maps))
        self._remember(key, prepared)   # no key when the caller gave lse_out
        self._run(prepared, tuple(values[:5]) + maps)
        return (out, lse_out) if return_lse else out


__all__ = ["ForwardKernel"]
