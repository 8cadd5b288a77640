"""The backward call convention: ``kernel(q, k, v, out, lse, dout, causal=...)`` returns (dq, dk, dv),
the gradients of attention softmax(scale q k^T) v at q, k and v given dout, the gradient of its
output. `out` and `lse` are the forward's (attngen's, or any FlashAttention-style forward: the output
and the natural-log LSE of the scaled scores, fp32 (B, H, Sq)). Three launches on one Params
(attngen/core/backward_plan.py): preprocess, main, convert."""
from __future__ import annotations

from ...core.backward_plan import deterministic_key, query_blocks, row_grid
from ...core.forward_plan import LOG2E
from ..kernel import MAX_GRID_YZ, Kernel, Prepared
from . import forward
from .forward import bhsd_strides, mask_fields

GRADIENTS = ("dout", "dq", "dk", "dv")
POINTERS = ("q", "k", "v", "o", "lse", "dout", "dq", "dk", "dv", "dq_accum", "delta", "dq_turns")   # in ABI order
# The forward call's fields, then the gradients' (in the order __call__ lists their values).
PER_CALL = (forward.PER_CALL + GRADIENTS + tuple(f"{t}_{d}_stride" for t in GRADIENTS for d in ("batch", "head", "row"))
            + ("dq_accum", "delta", "scale", "dq_turns"))


class BackwardKernel(Kernel):
    """A backward spec, callable on torch tensors.

    ``kernel(q, k, v, out, lse, dout, causal=False, alignment=None, scale=None, layout="bhsd")``
    returns (dq, dk, dv), each shaped (and strided) like q, k and v. A spec's variants add
    window=(left, right), softcap= and alibi_slopes=, as in the forward call. deterministic=True
    makes dq repeat bit for bit from call to call (the key blocks add it in turn; slower).
    """

    def _setup(self) -> None:
        plan = self.plan
        self._mask_fields = mask_fields(plan)
        self._packer = plan.abi.packer(PER_CALL + tuple(f.name for f in self._mask_fields))
        self._pointers = plan.abi.patch(POINTERS)
        self._fp32 = self._torch.float32
        self._functions = {part.name: dict(part.functions) for part in plan.parts}

    @property
    def varlen_masks(self) -> tuple[str, ...]:
        """Backward specs have no varlen call yet."""
        return ()

    def __call__(self, q, k, v, out, lse, dout, *, causal: bool = False, alignment: str | None = None,
                 scale: float | None = None, layout: str = "bhsd", dq=None, dk=None, dv=None, window=None,
                 softcap: float | None = None, alibi_slopes=None, deterministic: bool = False):
        """The gradients (dq, dk, dv) of attention at q (B, Hq, Sq, D), k and v (B, Hkv, Sk, D).

        out: the forward's output, shaped like q; lse: its natural-log LSE, contiguous fp32 (B, Hq, Sq)
        (-inf for rows that see no key); dout: the gradient of the output, shaped like q. causal,
        alignment, scale and layout mean what they mean in the forward call, and must be the ones
        the forward ran with; so must window, softcap and alibi_slopes (the spec's variants; see the
        forward call). GQA/MQA: dk and dv sum over the query heads that share a KV head. ALiBi's
        slopes get no gradient. deterministic: dq's fp32 sums are added in one order (dk and dv
        always are), so repeated calls give the same bits; it costs the waits of that order
        (docs/performance.md, "Backward").
        dq, dk, dv: tensors shaped like q, k and v to write the gradients into (default: new ones).
        """
        index, qs, ks, vs = self._padded_inputs(layout, ("q", "k", "v"), q, k, v)
        bhsd = layout == "bhsd"
        batch, heads, seqlen_q = (qs[0], qs[1], qs[2]) if bhsd else (qs[0], qs[2], qs[1])
        kv_heads, seqlen_k = (ks[1], ks[2]) if bhsd else (ks[2], ks[1])
        if ks[0] != batch or tuple(ks) != tuple(vs):
            raise ValueError(f"k and v must have one shape with q's batch size (got q {tuple(qs)}, k {tuple(ks)}, "
                             f"v {tuple(vs)})")
        if not heads or not kv_heads or heads % kv_heads:
            raise ValueError(f"query heads ({heads}) must be a positive multiple of kv heads ({kv_heads}) for GQA/MQA")
        if heads > MAX_GRID_YZ or batch > MAX_GRID_YZ:
            raise ValueError(f"heads ({heads}) and batch ({batch}) must be at most {MAX_GRID_YZ} (grid y/z limit)")
        for name, t in (("out", out), ("dout", dout)):
            if tuple(self._check_tensor(name, t, layout, index)) != tuple(qs):
                raise ValueError(f"{name} must have q's shape {tuple(qs)} (got {tuple(t.shape)})")
        self._check_lse(lse, (batch, heads, seqlen_q), index, "lse", "; the forward gives it with return_lse=True")
        mask = self._check_mask(causal, window)
        scale = self._check_scale(scale)
        values = self._variant_values(mask, causal, alignment, window, seqlen_q, seqlen_k, scale,
                                      {"softcap": softcap, "alibi_slopes": alibi_slopes},
                                      {"batch": batch, "heads": heads, "device": index})
        torch = self._torch
        dq, dk, dv = (self._gradient(name, g, t, layout, index) for name, g, t in (("dq", dq, q), ("dk", dk, k),
                                                                                     ("dv", dv, v)))
        if not (batch and seqlen_q and seqlen_k):
            # No query sees a key: every gradient is zero (FlashAttention's answer for empty inputs).
            for g in (dq, dk, dv):
                g.zero_()
            return dq, dk, dv
        dq_accum = torch.empty((batch, heads, seqlen_q, self.plan.head_dim), dtype=self._fp32, device=q.device)
        delta = torch.empty((batch, heads, seqlen_q), dtype=self._fp32, device=q.device)
        # zeroed by the preprocess kernel
        turns = (torch.empty((batch, heads, query_blocks(seqlen_q, self.plan.block_m)), dtype=torch.int32,
                             device=q.device) if deterministic else None)
        info = self._device(index)
        plan = self.plan
        pointers = (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(), dout.data_ptr(),
                    dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), dq_accum.data_ptr(), delta.data_ptr(),
                    0 if turns is None else turns.data_ptr())
        row = [*pointers[:5], *bhsd_strides(q.stride(), layout), *bhsd_strides(k.stride(), layout),
               *bhsd_strides(v.stride(), layout), *bhsd_strides(out.stride(), layout), heads * seqlen_q, seqlen_q,
               batch, heads, kv_heads, seqlen_q, seqlen_k, values.pop("scale_log2", scale * LOG2E), *pointers[5:9],
               *bhsd_strides(dout.stride(), layout), *bhsd_strides(dq.stride(), layout),
               *bhsd_strides(dk.stride(), layout), *bhsd_strides(dv.stride(), layout), *pointers[9:11], scale,
               pointers[11]]
        row += [values.get(f.name, f.default) for f in self._mask_fields]
        rows = row_grid(plan.head_dim, batch, heads, seqlen_q)
        main = (-(-seqlen_k // plan.block_n), kv_heads, batch)
        launches = self._launches(info, (self._functions["preprocess"]["preprocess"], rows),
                                  (self.entry[deterministic_key(mask) if deterministic else mask], main),
                                  (self._functions["convert"]["convert"], rows))
        prepared = Prepared(info, launches, self._packer.pack(row), self._pointers)
        self._run(prepared, pointers)
        return dq, dk, dv

    def _gradient(self, name: str, given, like, layout: str, index: int):
        """A new tensor like `like` (its strides too), or the caller's, checked against it."""
        if given is None:
            return self._torch.empty_like(like)
        if tuple(self._check_tensor(name, given, layout, index)) != tuple(like.shape):
            raise ValueError(f"{name} must have the shape {tuple(like.shape)} (got {tuple(given.shape)})")
        return given


__all__ = ["BackwardKernel"]
