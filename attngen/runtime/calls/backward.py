"""The backward call convention: ``kernel(q, k, v, out, lse, dout, causal=...)`` returns (dq, dk, dv),
the gradients of attention softmax(scale q k^T) v at q, k and v given dout, the gradient of its
output. `out` and `lse` are the forward's (attngen's, or any FlashAttention-style forward: the output
and the natural-log LSE of the scaled scores, fp32 (B, H, Sq)). Three launches on one Params
(attngen/core/backward_plan.py): preprocess, main, convert.

GQA/MQA (kv_heads < heads) on a spec with group-split functions (`group_split: true`): the main
kernel's grid is (key blocks, kv_heads x splits, batch), each block walking group / splits of its KV
head's query heads and adding its dK and dV into fp32 sums that follow the dQ accumulator in its
buffer (zeroed here); a fourth launch, kv_convert, writes dk and dv from them. The split count comes
from the shape (core.launch_rules.group_splits) or the call's group_splits=; 1 is the unsplit path.
The splits add dK and dV in any order, so those are repeatable only up to fp32 rounding (as dQ is);
deterministic=True keeps the unsplit path, whose dK and dV repeat bit for bit."""
from __future__ import annotations

import numbers

from ...core.launch_rules import (KV_CONVERT, accum_rows, deterministic_key, group_split_key, group_splits,
                                  kv_accum_floats, query_blocks, row_grid, varlen_accum_rows)
from ...core.constants import LOG2E
from ...core.varlen_plan import varlen_key
from ..gpu import error_word
from ..kernel import LOAD_BYTES, MAX_GRID_X, VARLEN_LAYOUT, Kernel, Prepared
from .shared import (ATTENTION_FIELDS, ORDERS, bhsd_strides, call_key, check_sequences, layout_key, mask_fields,
                     offsets_on_host, variant_key)

GRADIENTS = ("dout", "dq", "dk", "dv")
POINTERS = ("q", "k", "v", "o", "lse", "dout", "dq", "dk", "dv", "dq_accum", "delta", "dq_turns")   # in ABI order
# The forward call's fields, then the gradients' (in the order __call__ lists their values).
PER_CALL = (ATTENTION_FIELDS + GRADIENTS + tuple(f"{t}_{d}_stride" for t in GRADIENTS for d in ("batch", "head", "row"))
            + ("dq_accum", "delta", "scale", "dq_turns"))
VARLEN_PER_CALL = PER_CALL + ("cu_seqlens_q", "cu_seqlens_k", "seq_order", "total_q", "total_k", "errors")
VARLEN_POINTERS = ("cu_seqlens_q", "cu_seqlens_k", "seq_order")   # a varlen call's own (ABI: between lse and dout)


def scratch_layout(accum: int, sums: int, delta: int, turns) -> tuple:
    """A padded call's fp32 scratch in one buffer, [dQ accumulator | dK's and dV's sums (group-split
    calls; the kernels find them right after the accumulator) | delta], as (floats, where the sums
    start, where they end and delta starts), then the int32 turn counters' shape (deterministic calls,
    their own zeroed tensor) or None. One allocation, not
    two: a training step's backward runs on autograd's device thread, where each costs host time.
    Every part starts 16-byte aligned (the accumulator's and the sums' sizes are multiples of the head dim)."""
    return accum + sums + delta, accum, accum + sums, turns


class BackwardKernel(Kernel):
    """A backward spec, callable on torch tensors.

    ``kernel(q, k, v, out, lse, dout, causal=False, alignment=None, scale=None, layout="bhsd")``
    returns (dq, dk, dv), each shaped (and strided) like q, k and v (a spec with head_dim_v: v, out,
    dout and dv have that head dim, q and k head_dim). A spec's variants add
    window=(left, right), softcap= and alibi_slopes=, as in the forward call. deterministic=True
    makes dq repeat bit for bit from call to call (the key blocks add it in turn; slower).
    A spec with `varlen: true` adds ``kernel.varlen(q, k, v, out, lse, dout, cu_seqlens_q,
    cu_seqlens_k, ...)``, the gradients of the forward's varlen call.
    """

    def _setup(self) -> None:
        plan = self.plan
        self._mask_fields = mask_fields(plan)
        self._map_fields = tuple(m.abi_field for m in plan.tensor_maps)   # a kind that reads Q and dO by TMA
        self._packer = plan.abi.packer(PER_CALL + tuple(f.name for f in self._mask_fields) + self._map_fields)
        self._varlen_packer = (plan.abi.packer(VARLEN_PER_CALL + tuple(f.name for f in self._mask_fields)
                                               + self._map_fields) if self.varlen_masks else None)
        self._pointers = plan.abi.patch(POINTERS + self._map_fields)
        if self.varlen_masks:   # a varlen call passes POINTERS, VARLEN_POINTERS, then the maps
            self._varlen_pointers = plan.abi.patch(POINTERS + VARLEN_POINTERS + self._map_fields)
        self._fp32 = self._torch.float32
        self._functions = {part.name: dict(part.functions) for part in plan.parts}
        self.last_group_splits = None   # the split count of the last padded call (1: unsplit)

    def __call__(self, q, k, v, out, lse, dout, *, causal: bool = False, alignment: str | None = None,
                 scale: float | None = None, layout: str = "bhsd", dq=None, dk=None, dv=None, window=None,
                 softcap: float | None = None, alibi_slopes=None, params: dict | None = None,
                 deterministic: bool = False, group_splits: int | None = None, return_delta: bool = False):
        """The gradients (dq, dk, dv) of attention at q (B, Hq, Sq, D), k and v (B, Hkv, Sk, D).

        out: the forward's output, shaped like q; lse: its natural-log LSE, contiguous fp32 (B, Hq, Sq)
        (-inf for rows that see no key); dout: the gradient of the output, shaped like q. causal,
        alignment, scale and layout mean what they mean in the forward call, and must be the ones
        the forward ran with; so must window, softcap, alibi_slopes and an expression spec's params
        (the spec's variants; see the forward call). GQA/MQA: dk and dv sum over the query heads that share a KV head. ALiBi's
        slopes get no gradient. deterministic: dq's fp32 sums are added in one order (dk and dv
        always are), so repeated calls give the same bits; it costs the waits of that order
        (docs/performance.md, "Backward").
        dq, dk, dv: tensors shaped like q, k and v to write the gradients into (default: new ones).
        group_splits: GQA/MQA on a spec with group-split functions, how many blocks share each key
        block's query heads (a divisor of heads / kv_heads; default: chosen from the shape, see the
        module's text; 1: the unsplit path). The split count of the last call is `last_group_splits`.
        return_delta: also return delta, rowsum(dO * O) of every query row, fp32 like lse (B, Hq, Sq):
        the preprocess kernel's, which a learned sink's gradient reads; (dq, dk, dv, delta).
        """
        key = None
        if dq is None and dk is None and dv is None:
            # A call seen before (every training step of a model): its checks passed and its Params
            # are laid out; only the pointers are new.
            try:
                key = self._call_key(q, k, v, out, lse, dout, causal, alignment, scale, layout, deterministic,
                                     variant_key(window, softcap, alibi_slopes, params), group_splits)
                prepared = self._prepared.get(key)
            except (AttributeError, TypeError):
                key = prepared = None
            if prepared is not None:
                result = self.run_prepared(prepared, q, k, v, out, lse, dout, return_delta)
                if result is not None:
                    return result
        index, qs, ks, vs = self._padded_inputs(layout, ("q", "k", "v"), q, k, v)
        bhsd = layout == "bhsd"
        batch, heads, seqlen_q = (qs[0], qs[1], qs[2]) if bhsd else (qs[0], qs[2], qs[1])
        kv_heads, seqlen_k = (ks[1], ks[2]) if bhsd else (ks[2], ks[1])
        if ks[0] != batch or tuple(ks[:-1]) != tuple(vs[:-1]):
            raise ValueError(f"k and v must have one shape with q's batch size (got q {tuple(qs)}, k {tuple(ks)}, "
                             f"v {tuple(vs)})")
        self._check_heads(heads, kv_heads, heads=heads, batch=batch)
        like_out = tuple(qs[:-1]) + (self.plan.v_dim,)   # q's shape, with V's head dim
        for name, t in (("out", out), ("dout", dout)):
            if tuple(self._check_tensor(name, t, layout, index, v_dim=True)) != like_out:
                what = "q's shape" if self.plan.v_dim == self.plan.head_dim else "q's shape with head_dim_v columns"
                raise ValueError(f"{name} must have {what} {like_out} (got {tuple(t.shape)})")
        self._check_lse(lse, (batch, heads, seqlen_q), index, "lse", "; the forward gives it with return_lse=True")
        mask = self._check_mask(causal, window)
        scale = self._check_scale(scale)
        values = self._variant_values(mask, causal, alignment, window, seqlen_q, seqlen_k, scale,
                                      {"softcap": softcap, "alibi_slopes": alibi_slopes, "params": params},
                                      {"batch": batch, "heads": heads, "device": index})
        dq, dk, dv = (self._gradient(name, g, t, layout, index) for name, g, t in (("dq", dq, q), ("dk", dk, k),
                                                                                     ("dv", dv, v)))
        if not (batch and seqlen_q and seqlen_k):
            # No query sees a key: every gradient is zero (FlashAttention's answer for empty inputs).
            for g in (dq, dk, dv):
                g.zero_()
            if return_delta:   # O is zeros where no query sees a key
                return dq, dk, dv, self._torch.zeros_like(lse)
            return dq, dk, dv
        info = self._device(index)
        plan = self.plan
        key_blocks = -(-seqlen_k // plan.block_n)
        splits = self._group_splits(group_splits, mask, deterministic, heads // kv_heads, kv_heads, batch, seqlen_q,
                                    seqlen_k, info.sm_count)
        rows = accum_rows(self.plan, seqlen_q)
        scratch = scratch_layout(batch * heads * rows * plan.head_dim,
                                 kv_accum_floats(batch, kv_heads, seqlen_k, plan.head_dim) if splits > 1 else 0,
                                 batch * heads * seqlen_q,
                                 (batch, heads, query_blocks(seqlen_q, plan.block_m)) if deterministic else None)
        buffer, dq_accum, delta, turns = self._scratch(q, scratch)
        pointers = (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(), dout.data_ptr(),
                    dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), dq_accum, delta,
                    0 if turns is None else turns.data_ptr())
        row = [*pointers[:5], *bhsd_strides(q.stride(), layout), *bhsd_strides(k.stride(), layout),
               *bhsd_strides(v.stride(), layout), *bhsd_strides(out.stride(), layout), heads * seqlen_q, seqlen_q,
               batch, heads, kv_heads, seqlen_q, seqlen_k, values.pop("scale_log2", scale * LOG2E), *pointers[5:9],
               *bhsd_strides(dout.stride(), layout), *bhsd_strides(dq.stride(), layout),
               *bhsd_strides(dk.stride(), layout), *bhsd_strides(dv.stride(), layout), *pointers[9:11], scale,
               pointers[11]]
        row += [values.get(f.name, f.default) for f in self._mask_fields]
        views = {"q": q, "dout": dout} if bhsd else {"q": q.permute(0, 2, 1, 3), "dout": dout.permute(0, 2, 1, 3)}
        shape_maps = self._shape_maps(views)
        maps = shape_maps.values(pointers) if shape_maps else ()
        row += maps
        rows = row_grid(plan.head_dim, batch, heads, rows)
        if splits > 1:   # the group-split functions, then dk and dv from their sums
            named = ((self._functions["preprocess"]["preprocess"], rows),
                     (self.entry[group_split_key(mask)], (key_blocks, kv_heads * splits, batch)),
                     (self._functions["convert"][plan.dq_convert(mask)], rows),
                     (self._functions["convert"][KV_CONVERT], row_grid(plan.head_dim, batch, kv_heads, seqlen_k)))
        else:
            named = ((self._functions["preprocess"]["preprocess"], rows),
                     (self.entry[deterministic_key(mask) if deterministic else mask], (key_blocks, kv_heads, batch)),
                     (self._functions["convert"][plan.dq_convert(mask)], rows))
        prepared = Prepared(info, self._launches(info, *named), self._packer.pack(row), self._pointers,
                            (scratch, shape_maps, splits))
        self._remember(key, prepared)
        self.last_group_splits = splits
        self._run(prepared, pointers + maps)
        if return_delta:
            return dq, dk, dv, buffer[scratch[2]:].view(lse.shape)
        return dq, dk, dv

    def _group_splits(self, given, mask: str, deterministic: bool, group: int, kv_heads: int, batch: int,
                      seqlen_q: int, seqlen_k: int, sm_count: int) -> int:
        """The call's split count: the caller's (checked), or group_splits' choice where the spec has a
        group-split function for the mask and the call is GQA/MQA and not deterministic; else 1."""
        available = group > 1 and not deterministic and group_split_key(mask) in self.entry
        if given is None:
            plan = self.plan
            return group_splits(group, kv_heads, batch, seqlen_q, seqlen_k, sm_count, block_m=plan.block_m,
                                block_n=plan.block_n, head_dim=plan.head_dim, uneven=mask != "none") \
                if available else 1
        if isinstance(given, bool) or not isinstance(given, numbers.Integral) or given < 1 or group % given:
            raise ValueError(f"group_splits must be a positive divisor of heads / kv_heads = {group} (got {given!r})")
        if given > 1 and not available:
            why = ("deterministic calls take the unsplit path" if deterministic else
                   f"{self.plan.spec.name} has no group-split function for mask {mask}")
            raise ValueError(f"group_splits={given}: {why}; use 1 or leave it unset")
        return int(given)

    def _shape_maps(self, views):
        """The TMA tensor maps of a call's shape (views: q and dout as (B, H, S, D)), or None for a
        kind that reads them through pointers."""
        if not self._map_fields:
            return None
        from ..tma import ShapeMaps
        return ShapeMaps(self.plan.tensor_maps, views, POINTERS)

    def _call_key(self, q, k, v, out, lse, dout, causal, alignment, scale, layout, deterministic, variants,
                  group_splits) -> tuple:
        """What decides a call's checks, grid and Params (not its pointers): the forward's call_key
        with out's, dout's and lse's layouts; AttributeError or TypeError for an input that is not a tensor."""
        return (call_key(q, k, v, causal, alignment, scale, deterministic, layout, variants),
                out.shape, out.stride(), out.dtype, out.get_device(), dout.shape, dout.stride(), dout.dtype,
                dout.get_device(), lse.shape, lse.stride(), lse.dtype, lse.get_device(), group_splits)

    def prepared_call(self, q, k, v, out, lse, dout, *, causal: bool = False, alignment: str | None = None,
                      scale: float | None = None, layout: str = "bhsd", deterministic: bool = False, window=None,
                      softcap: float | None = None, alibi_slopes=None):
        """The prepared call of a call made before with these arguments (the spec's variants, no
        expression params, the default split count, new gradients), for run_prepared; None if there
        is none."""
        return self._prepared.get(self._call_key(q, k, v, out, lse, dout, causal, alignment, scale, layout,
                                                 deterministic, variant_key(window, softcap, alibi_slopes), None))

    def _scratch(self, q, scratch):
        """The call's fp32 scratch as one allocation (scratch: scratch_layout's tuple): (the buffer,
        the dQ accumulator's address, delta's address, the turn counters or None). The group-split sums
        are zeroed here, the turn counters are new zeros; the preprocess kernel zeroes the accumulator
        and writes delta."""
        floats, sums_from, sums_to, turns = scratch
        torch = self._torch
        buffer = torch.empty(floats, dtype=self._fp32, device=q.device)
        if sums_to > sums_from:
            buffer[sums_from:sums_to].zero_()
        base = buffer.data_ptr()
        return (buffer, base, base + 4 * sums_to,
                None if turns is None else torch.zeros(turns, dtype=torch.int32, device=q.device))

    def run_prepared(self, prepared, q, k, v, out, lse, dout, return_delta: bool = False):
        """A prepared call on new tensors of its shapes: new gradients and scratch, the pointers
        patched in; None when a 16-byte row pointer is not aligned (the full path says why).
        return_delta: (dq, dk, dv, delta), as the full call's (delta: the scratch's last part, which
        the preprocess kernel writes at (b * Hq + h) * Sq + s)."""
        qp, kp, vp, op, dp = q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), dout.data_ptr()
        if (qp | kp | vp | op | dp) % LOAD_BYTES:
            return None
        torch = self._torch
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        scratch, shape_maps, self.last_group_splits = prepared.extra
        buffer, dq_accum, delta, turns = self._scratch(q, scratch)
        pointers = (qp, kp, vp, op, lse.data_ptr(), dp, dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), dq_accum, delta,
                    0 if turns is None else turns.data_ptr())
        self._run(prepared, pointers + (shape_maps.values(pointers) if shape_maps else ()))
        if return_delta:
            return dq, dk, dv, buffer[scratch[2]:].view(lse.shape)
        return dq, dk, dv

    def native_backward(self, prepared, q, k, v, out, lse, dout):
        """set_backward's arguments of the native step (attngen/runtime/native) for a prepared call made
        on these tensors (dout in the layout it was prepared for); None where the kernel takes no
        native replay. The scratch is (floats, where the group-split sums start, where they end)."""
        (floats, sums_from, sums_to, turns), shape_maps, _ = prepared.extra
        at = q.data_ptr()    # the gradients' and scratch's pointers: any aligned one, no map names them
        pointers = (at, k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(), dout.data_ptr()) + (at,) * 6
        maps = shape_maps.values(pointers) if shape_maps else ()
        program = self.native_program(prepared, POINTERS, maps, shape_maps.order if shape_maps else ())
        if program is None:
            return None
        return (*program, [floats, sums_from, sums_to], list(turns or ()), list(dout.stride()))

    def varlen(self, q, k, v, out, lse, dout, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q: int | None = None,
               max_seqlen_k: int | None = None, causal: bool = False, alignment: str | None = None,
               scale: float | None = None, dq=None, dk=None, dv=None, deterministic: bool = False,
               validate: bool = False, window=None, softcap: float | None = None, alibi_slopes=None):
        """The gradients (dq, dk, dv) of the forward's varlen call: q (total_q, Hq, D), k and v
        (total_k, Hkv, D), every sequence's rows back to back at cu_seqlens_q/k (int32 (batch + 1,),
        on the GPU), out and dout shaped like q, lse fp32 (Hq, total_q) as the forward's varlen call
        returns it. causal, alignment and scale as that call had them (bottom_right: FlashAttention's
        varlen convention, per sequence), and so window, softcap and alibi_slopes (the spec's
        variants; a window's alignment and ALiBi's offset per sequence, (B, Hq) slopes per sequence,
        as in the forward's varlen call). GQA/MQA: dk and dv sum over each group.

        Nothing waits for the GPU by default: the kernels clamp every offset to the tensors.
        max_seqlen_k (the longest key sequence) sizes the grid; without it the grid covers total_k
        keys per sequence and the blocks past each sequence's keys return at once (correct, slower
        for long batches). A key sequence longer than max_seqlen_k is recorded as an input error
        (attngen.check_errors()). max_seqlen_q is not needed (the blocks walk each sequence's own
        query rows); it is taken so the forward's arguments pass unchanged, and checked with
        validate=True, which reads cu_seqlens back (offsets as the forward's varlen call checks
        them; max_seqlen_q/k, when given, must cover the longest sequences). deterministic: as the
        padded call's.
        """
        key = None
        if dq is None and dk is None and dv is None and not validate:
            # A layout seen before (every training step of a varlen model): its checks passed and its Params
            # are laid out; only the pointers are new. The offsets' values are read by the kernels, never here.
            try:
                key = ("varlen", layout_key(q), layout_key(k), layout_key(v), layout_key(out), layout_key(lse),
                       layout_key(dout), layout_key(cu_seqlens_q), layout_key(cu_seqlens_k), max_seqlen_q,
                       max_seqlen_k, causal, alignment, scale, deterministic,
                       variant_key(window, softcap, alibi_slopes))
                prepared = self._prepared.get(key)
            except (AttributeError, TypeError):
                key = prepared = None
            if prepared is not None:
                result = self._run_varlen_prepared(prepared, q, k, v, out, lse, dout, cu_seqlens_q, cu_seqlens_k)
                if result is not None:
                    return result
        index, total_q, heads, total_k, kv_heads, batch = check_sequences(self, q, k, v, cu_seqlens_q, cu_seqlens_k)
        for name, t in (("out", out), ("dout", dout)):
            if tuple(self._check_tensor(name, t, VARLEN_LAYOUT, index)) != (total_q, heads, q.shape[2]):
                raise ValueError(f"{name} must have q's shape {tuple(q.shape)} (got {tuple(t.shape)})")
        self._check_lse(lse, (heads, total_q), index, "lse", "; the forward's varlen call gives it with return_lse=True")
        for name, given in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
            if given is not None and (isinstance(given, bool) or not isinstance(given, numbers.Integral) or given < 0):
                raise ValueError(f"{name} must be a non-negative integer (got {given!r})")
        if validate:
            for name, cu, total, where, given in (
                    ("cu_seqlens_q", cu_seqlens_q, total_q, "q.shape[0]", max_seqlen_q),
                    ("cu_seqlens_k", cu_seqlens_k, total_k, "k.shape[0]", max_seqlen_k)):
                longest = max(offsets_on_host(name, cu, total, where))
                if given is not None and given < longest:
                    raise ValueError(f"{name.replace('cu_seqlens', 'max_seqlen')} is {given} but a sequence has "
                                     f"{longest} rows; pass at least {longest} (or leave it unset)")
        mask = self._check_mask(causal, window, varlen=True)
        scale = self._check_scale(scale)
        # Lengths 0: each sequence adds its own offsets (mask_for_sequence; ALiBi reads its lengths).
        values = self._variant_values(mask, causal, alignment, window, 0, 0, scale,
                                      {"softcap": softcap, "alibi_slopes": alibi_slopes},
                                      {"batch": batch, "heads": heads, "device": index})
        dq, dk, dv = (self._gradient(name, g, t, VARLEN_LAYOUT, index) for name, g, t in (("dq", dq, q), ("dk", dk, k),
                                                                                            ("dv", dv, v)))
        if not (total_q and total_k):
            for g in (dq, dk, dv):
                g.zero_()
            return dq, dk, dv
        keys = total_k if max_seqlen_k is None else min(int(max_seqlen_k), total_k)
        plan = self.plan
        main = (-(-keys // plan.block_n), kv_heads, batch)
        if main[0] > MAX_GRID_X:
            raise ValueError(f"max_seqlen_k {keys} needs more than {MAX_GRID_X} blocks")
        torch = self._torch
        accum = varlen_accum_rows(plan, total_q, batch)   # total_q, or whole blocks per sequence
        # a run of heads x query blocks per sequence, from heads x (its first row's block + its index)
        scratch = ((heads, accum, plan.head_dim), (heads, total_q),
                   heads * (query_blocks(total_q, plan.block_m) + batch) if deterministic else 0, batch)
        dq_accum, delta, turns, order = self._varlen_scratch(q, cu_seqlens_k, scratch, index)
        pointers = (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(), dout.data_ptr(),
                    dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), dq_accum.data_ptr(), delta.data_ptr(),
                    0 if turns is None else turns.data_ptr())

        def strides(t):   # (total, heads, dim): batch stride 0
            return (0, t.stride(1), t.stride(0))
        row = [*pointers[:5], *strides(q), *strides(k), *strides(v), *strides(out), 0, total_q,
               batch, heads, kv_heads, total_q, total_k, values.pop("scale_log2", scale * LOG2E), *pointers[5:9],
               *strides(dout), *strides(dq), *strides(dk), *strides(dv), *pointers[9:11], scale, pointers[11],
               cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr(), 0 if order is None else order.data_ptr(), total_q,
               total_k, error_word(index)]
        row += [values.get(f.name, f.default) for f in self._mask_fields]
        # Maps: each packed (total, heads, dim) tensor as one batch of total rows per head; a block's
        # copies start at its sequence's first rows (coordinates), rows past the tensor read as zeros.
        shape_maps = self._shape_maps({"q": q.unsqueeze(0).transpose(1, 2), "dout": dout.unsqueeze(0).transpose(1, 2)})
        maps = shape_maps.values(pointers) if shape_maps else ()
        row += maps
        info = self._device(index)
        # The row kernels take every row as one batch; the preprocess's grid covers the accumulator's
        # rows (at least total_q), which it zeroes.
        function = varlen_key(mask)
        launches = self._launches(info, (self._functions["preprocess"]["preprocess"],
                                         row_grid(plan.head_dim, 1, heads, accum)),
                                  (self.entry[deterministic_key(function) if deterministic else function], main),
                                  (self._functions["convert"][plan.dq_convert(mask)],
                                   row_grid(plan.head_dim, 1, heads, total_q)))
        self.last_group_splits = 1   # varlen calls never split
        prepared = Prepared(info, launches, self._varlen_packer.pack(row), self._varlen_pointers, (scratch, shape_maps))
        self._remember(key, prepared)
        self._run(prepared, pointers + (cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr(),
                                        0 if order is None else order.data_ptr()) + maps)
        return dq, dk, dv

    def _varlen_scratch(self, q, cu_seqlens_k, scratch, index: int):
        """A varlen call's fp32 dQ accumulator and delta, its turn counters (new zeros, deterministic calls)
        or None, and its sequences' longest-first order or None; scratch: (accumulator shape, delta's shape,
        turn counters or 0, batch)."""
        accum_shape, delta_shape, turns, batch = scratch
        torch = self._torch
        return (torch.empty(accum_shape, dtype=self._fp32, device=q.device),
                torch.empty(delta_shape, dtype=self._fp32, device=q.device),
                torch.zeros(turns, dtype=torch.int32, device=q.device) if turns else None,
                ORDERS.longest_first(torch, cu_seqlens_k, batch, index) if batch > 1 else None)

    def _run_varlen_prepared(self, prepared, q, k, v, out, lse, dout, cu_seqlens_q, cu_seqlens_k):
        """A prepared varlen call on new tensors of its layouts: new gradients and scratch, the pointers
        patched in; None when a 16-byte row pointer is not aligned (the full path says why)."""
        qp, kp, vp, op, dp = q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), dout.data_ptr()
        if (qp | kp | vp | op | dp) % LOAD_BYTES:
            return None
        torch = self._torch
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        scratch, shape_maps = prepared.extra
        dq_accum, delta, turns, order = self._varlen_scratch(q, cu_seqlens_k, scratch, prepared.info.index)
        pointers = (qp, kp, vp, op, lse.data_ptr(), dp, dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                    dq_accum.data_ptr(), delta.data_ptr(), 0 if turns is None else turns.data_ptr())
        maps = shape_maps.values(pointers) if shape_maps else ()
        self.last_group_splits = 1
        self._run(prepared, pointers + (cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr(),
                                        0 if order is None else order.data_ptr()) + maps)
        return dq, dk, dv

    def _gradient(self, name: str, given, like, layout: str, index: int):
        """A new tensor like `like` (its strides too), or the caller's, checked against it (dv: V's head dim)."""
        if given is None:
            return self._torch.empty_like(like)
        if tuple(self._check_tensor(name, given, layout, index, v_dim=name == "dv")) != tuple(like.shape):
            raise ValueError(f"{name} must have the shape {tuple(like.shape)} (got {tuple(given.shape)})")
        return given


__all__ = ["BackwardKernel"]
