"""The merge call convention (kinds with calls="merge"): `kernel(outs, lses, layout=..., out_dtype=...)`
merges partial attention results on torch tensors. Part i is attention over a subset of the keys: its
output outs[i], (B, H, S, D) ("bhsd") or (B, S, H, D) ("bshd"), and its natural-log LSE lses[i], fp32
(B, H, S) in either layout (as attngen's forward returns it). The call returns (out, lse): out =
sum_i exp(lse_i - lse) outs[i] and lse = logsumexp_i lse_i; a part with LSE -inf weighs 0 and is not
read, a row where every part is -inf is 0 with LSE -inf. One launch merges up to the spec's max_parts
parts; more are merged in rounds through fp32 partials. Launches on torch's current stream, never
waits. A call whose parts are laid out as an earlier call's (a ring's every step, a cascade's every layer)
takes that call's Params and patches the addresses."""
from __future__ import annotations

from ...core.abi import array_bytes
from ...core.merge_plan import form_key, max_parts_of
from ..kernel import LAYOUTS, LOAD_BYTES, MAX_GRID_X, Kernel, Prepared
from .shared import layout_key

POINTERS = ("o", "lse", "part_o", "part_lse")
PER_CALL = POINTERS + ("o_batch_stride", "o_head_stride", "o_row_stride", "part_o_strides", "part_lse_strides",
                       "batch", "heads", "seqlen", "num_parts")
MAX_ROWS = 2 ** 31 - 1          # rows (batch x heads x seqlen) are 32-bit in the kernel


class MergeKernel(Kernel):
    """A merge spec, callable on torch tensors.

    ``kernel(outs, lses, layout="bhsd", out_dtype=None, out=None, lse_out=None)`` -> (out, lse).
    outs: a list of parts' outputs, all of one shape, dtype (the spec's fp16 / bf16, or fp32) and GPU,
    each with a contiguous last dimension and 16-byte aligned rows (any other strides, each part its
    own); lses: their fp32 LSEs (B, H, S), rows contiguous. out_dtype: the output's element type (the
    parts' by default; fp32, or the spec's dtype for fp32 parts). out / lse_out: write there instead of
    new tensors (out may be one of the parts: each row is read before it is written)."""

    def _setup(self) -> None:
        self._max_parts = max_parts_of(self.plan)
        fields = {f.name: f for f in self.plan.abi.fields}
        self._arrays = {name: fields[name] for name in ("part_o", "part_lse", "part_o_strides", "part_lse_strides")}
        self._packer = self.plan.abi.packer(PER_CALL)
        self._patch = self.plan.abi.patch(("o",))
        self._pointer_patch = self.plan.abi.patch(POINTERS)     # a prepared call's: the parts' addresses too
        self._rows_per_block = self.plan.block_m
        self.last_rounds = None      # launches the last call took (more than one: merged in rounds)

    def __call__(self, outs, lses, *, layout: str = "bhsd", out_dtype=None, out=None, lse_out=None):
        key = None
        if out is None and lse_out is None and type(outs) in (list, tuple) and type(lses) in (list, tuple):
            # Parts laid out as before: their checks passed and the Params are laid out; only the addresses are
            # new. The key holds every part's layout (shape, strides, dtype, device), so a key found is a call
            # the full path took in one launch.
            try:
                key = (layout, out_dtype, tuple(map(layout_key, outs)), tuple(map(layout_key, lses)))
                prepared = self._prepared.get(key)
            except (AttributeError, TypeError):
                key = prepared = None
            if prepared is not None:
                result = self._run_prepared_merge(prepared, outs, lses)
                if result is not None:
                    return result
        torch = self._torch
        outs, lses = self._check_lists(outs, lses)
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)} (got {layout!r})")
        first = outs[0]
        index = self._device_index(first, "outs[0]")
        parts_dtype = self._check_parts(outs, layout, index)
        shape = tuple(first.shape)
        batch, heads, seqlen = (shape[0], shape[1], shape[2]) if layout == "bhsd" else (shape[0], shape[2], shape[1])
        self._check_lses(lses, (batch, heads, seqlen), index)
        out_dtype = parts_dtype if out_dtype is None else out_dtype
        if out_dtype not in (self.dtype, torch.float32):
            raise TypeError(f"out_dtype must be {self.dtype} or torch.float32 for {self.label} (got {out_dtype})")
        out = self._merge_output(out, shape, out_dtype, layout, index)
        lse_out = self._merge_lse(lse_out, (batch, heads, seqlen), index)
        if batch * heads * seqlen > MAX_ROWS:
            raise ValueError(f"batch x heads x seqlen ({batch * heads * seqlen}) exceeds {MAX_ROWS} rows")
        self.last_rounds = 0
        if batch * heads * seqlen:
            prepared = self._merge(outs, lses, out, lse_out, layout, index, (batch, heads, seqlen))
            if key is not None and self.last_rounds == 1:
                self._remember(key, prepared._replace(patch=self._pointer_patch,
                                                      extra=(shape, out_dtype, (batch, heads, seqlen))))
        return out, lse_out

    def _run_prepared_merge(self, prepared: Prepared, outs, lses):
        """A call of a prepared layout: new outputs, the parts' addresses patched in; None when a part is not
        16-byte aligned (the full path says so)."""
        parts = [t.data_ptr() for t in outs]
        if any(p % LOAD_BYTES for p in parts):
            return None
        torch = self._torch
        shape, dtype, lse_shape = prepared.extra
        device = outs[0].device
        out = torch.empty(shape, dtype=dtype, device=device)
        lse = torch.empty(lse_shape, dtype=torch.float32, device=device)
        arrays = self._arrays
        self._run(prepared, (out.data_ptr(), lse.data_ptr(), array_bytes(arrays["part_o"], "Q", parts),
                             array_bytes(arrays["part_lse"], "Q", (t.data_ptr() for t in lses))))
        self.last_rounds = 1
        return out, lse

    # -- checks ------------------------------------------------------------------------------------
    def _check_lists(self, outs, lses):
        if not isinstance(outs, (list, tuple)) or not isinstance(lses, (list, tuple)):
            raise TypeError(f"outs and lses must be lists of tensors (got {type(outs).__name__} and "
                            f"{type(lses).__name__})")
        if not outs:
            raise ValueError("outs must hold at least one part")
        if len(outs) != len(lses):
            raise ValueError(f"outs and lses must hold one entry per part (got {len(outs)} outputs and {len(lses)} "
                             "LSEs)")
        return list(outs), list(lses)

    def _check_rows(self, name: str, t, index: int, dim: int) -> None:
        """A 4-D output tensor's device, last dimension and 16-byte rows."""
        if not isinstance(t, self._tensor_type):
            raise TypeError(f"{name} must be a torch.Tensor (got {type(t).__name__})")
        if t.get_device() != index:
            raise ValueError(f"{name} is on {t.device} but outs[0] is on cuda:{index}: every tensor of a merge must "
                             "be on one GPU")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (got shape {tuple(t.shape)})")
        if t.shape[-1] != dim:
            raise ValueError(f"{name} has head_dim {t.shape[-1]} but {self.label} is generated for head_dim {dim}")
        stride = t.stride()
        if stride[-1] != 1:
            raise ValueError(f"{name}'s last dimension must be contiguous (stride 1, got {stride[-1]}); pass "
                             f"{name}.contiguous()")
        unit = 16 // t.element_size()
        if any(t.shape[d] > 1 and stride[d] % unit for d in range(3)) or t.data_ptr() % 16:
            raise ValueError(f"{name} must have 16-byte aligned rows (strides {tuple(stride)} multiples of {unit} "
                             f"elements, an aligned pointer); pass {name}.contiguous()")

    def _check_parts(self, outs, layout: str, index: int):
        """Every part of one shape, dtype and GPU; their dtype (the spec's or fp32)."""
        torch = self._torch
        first = outs[0]
        for i, t in enumerate(outs):
            self._check_rows(f"outs[{i}]", t, index, self.plan.head_dim)
            if t.dtype != first.dtype:
                raise TypeError(f"outs[{i}] is {t.dtype} but outs[0] is {first.dtype}: every part of a merge has one "
                                "dtype")
            if t.shape != first.shape:
                raise ValueError(f"outs[{i}] has shape {tuple(t.shape)} but outs[0] {tuple(first.shape)}: every part "
                                 f"is ({'batch, heads, seq' if layout == 'bhsd' else 'batch, seq, heads'}, head_dim)")
        if first.dtype not in (self.dtype, torch.float32):
            raise TypeError(f"outs are {first.dtype} but {self.label} merges {self.dtype} or float32 parts")
        return first.dtype

    def _check_lses(self, lses, shape: tuple, index: int) -> None:
        torch = self._torch
        for i, t in enumerate(lses):
            name = f"lses[{i}]"
            if not isinstance(t, self._tensor_type):
                raise TypeError(f"{name} must be a torch.Tensor (got {type(t).__name__})")
            if t.get_device() != index:
                raise ValueError(f"{name} is on {t.device} but outs[0] is on cuda:{index}: every tensor of a merge "
                                 "must be on one GPU")
            if t.dtype != torch.float32:
                raise TypeError(f"{name} must be float32 (got {t.dtype}): the LSE attngen's forward returns")
            if tuple(t.shape) != shape:
                raise ValueError(f"{name} must be (batch, heads, seqlen) = {shape}, as the parts' outputs (got "
                                 f"{tuple(t.shape)})")
            if shape[2] > 1 and t.stride(2) != 1:
                raise ValueError(f"{name}'s rows must be contiguous (stride 1 along seqlen, got {t.stride(2)})")

    def _merge_output(self, out, shape: tuple, dtype, layout: str, index: int):
        torch = self._torch
        if out is None:
            return torch.empty(shape, dtype=dtype, device=torch.device("cuda", index))
        self._check_rows("out", out, index, self.plan.head_dim)
        if out.dtype != dtype or tuple(out.shape) != shape:
            raise ValueError(f"out must be {dtype} of the parts' shape {shape} (got {out.dtype}, {tuple(out.shape)})")
        return out

    def _merge_lse(self, lse, shape: tuple, index: int):
        torch = self._torch
        if lse is None:
            return torch.empty(shape, dtype=torch.float32, device=torch.device("cuda", index))
        self._check_lse(lse, shape, index, name="lse_out")
        return lse

    # -- launches ----------------------------------------------------------------------------------
    def _merge(self, outs, lses, out, lse, layout: str, index: int, dims: tuple) -> Prepared:
        """One launch for up to max_parts parts; more merge per group into fp32 partials first. Returns the
        last launch's Prepared."""
        torch = self._torch
        cap = self._max_parts
        if len(outs) > cap:
            partials, partial_lses = [], []
            for at in range(0, len(outs), cap):
                o = torch.empty(out.shape, dtype=torch.float32, device=out.device)
                l_ = torch.empty(lse.shape, dtype=torch.float32, device=lse.device)
                self._merge(outs[at:at + cap], lses[at:at + cap], o, l_, layout, index, dims)
                partials.append(o)
                partial_lses.append(l_)
            outs, lses = partials, partial_lses
            if len(outs) > cap:
                return self._merge(outs, lses, out, lse, layout, index, dims)
        return self._launch(outs, lses, out, lse, layout, index, dims)

    def _launch(self, outs, lses, out, lse, layout: str, index: int, dims: tuple) -> Prepared:
        torch = self._torch
        batch, heads, seqlen = dims
        key = form_key(outs[0].dtype == torch.float32, out.dtype == torch.float32)

        def strides(t):
            s = t.stride()
            return (s[0], s[1], s[2]) if layout == "bhsd" else (s[0], s[2], s[1])
        arrays = self._arrays
        values = (out.data_ptr(), lse.data_ptr(),
                  array_bytes(arrays["part_o"], "Q", (t.data_ptr() for t in outs)),
                  array_bytes(arrays["part_lse"], "Q", (t.data_ptr() for t in lses)),
                  *strides(out),
                  array_bytes(arrays["part_o_strides"], "q", (s for t in outs for s in strides(t))),
                  array_bytes(arrays["part_lse_strides"], "q", (s for t in lses for s in t.stride()[:2])),
                  batch, heads, seqlen, len(outs))
        blocks = -(-batch * heads * seqlen // self._rows_per_block)
        if blocks > MAX_GRID_X:
            raise ValueError(f"{batch * heads * seqlen} rows need {blocks} blocks, over CUDA's {MAX_GRID_X}")
        info = self._device(index)
        prepared = Prepared(info, self._launches(info, (self.entry[key], (blocks, 1, 1))),
                            self._packer.pack(values), self._patch)
        self._run(prepared, (out.data_ptr(),))
        self.last_rounds += 1
        return prepared


__all__ = ["MergeKernel"]
