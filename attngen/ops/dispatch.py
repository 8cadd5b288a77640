"""The dispatcher: the table's entry for a call, and its kernel, loaded lazily (through the cubin
cache) once per spec and GPU arch, from any thread. A call resolves once per (device, dtype, head
dim, mask, sequence length, ...) and remembers the kernel, so the lookup costs a dict get."""
from __future__ import annotations

import threading
from pathlib import Path

from ..core.calls import CALLS, HALF_DTYPES
from ..shipped import shipped

from .table import (candidates, load_table, padded_dims, padded_head_dim, select, serves_joining_sinks, sinks_apart,
                    table_path)

def specs_dir() -> Path:
    """The specs the library serves: attngen/specs in an installed wheel, else the repository's
    specs/ (a checkout or an editable install)."""
    return shipped("specs")


SPECS_DIR = specs_dir()
RESOLVED_ENTRIES = 4096
TORCH_DTYPES = {"torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float8_e4m3fn": "e4m3"}
CALL_DTYPES = {t.name: call.dtypes for call in CALLS for t in call.table}     # the element types of a call's inputs


class Dispatcher:
    def __init__(self, specs_dir=None):
        self.specs_dir = Path(specs_dir) if specs_dir else SPECS_DIR
        self._entries = None
        self._kernels: dict = {}            # (spec name, device index) -> Kernel
        self._resolved: dict = {}           # call key -> Kernel
        self._lock = threading.Lock()
        self._loading: dict = {}            # spec name -> lock, so one thread compiles and the others wait
        self._padded: dict = {}             # a call's key -> its padded head dim (0: none), ("dims", ...) its pair,
                                            # ("sinks", ...) whether its sinks are joined after the kernel
        self._served: dict = {}             # a call's key -> whether an entry serves it at its own head dim

    @property
    def entries(self):
        if self._entries is None:
            self._entries = load_table(table_path(self.specs_dir))
        return self._entries

    def entry(self, call: str, index: int, dtype, head_dim: int, mask: str, seqlen: int, *, paged: bool = False,
              group_rows: int = 1, head_dim_v: int = 0, scores: str = "", rows: int | None = None,
              window: int | None = None, page: int | None = None):
        """The table entry for a call on cuda:`index` (dtype: a torch dtype or fp16/bf16/e4m3; rows: the
        call's query rows, batch x heads x seqlen_q, where the table splits a bucket by grid size;
        window: the keys a row's window spans, core.variants.window_keys, where it splits one by width; page: a
        paged call's page size, where it splits one by pages)."""
        from ..runtime import device_info
        name = TORCH_DTYPES.get(str(dtype), dtype)
        if name not in CALL_DTYPES.get(call, HALF_DTYPES):
            taken = {"fp16": "float16", "bf16": "bfloat16", "e4m3": "float8_e4m3fn"}
            want = " or ".join(taken[d] for d in CALL_DTYPES.get(call, HALF_DTYPES))
            raise TypeError(f"attngen's {call} kernels take {want} tensors (got {dtype})")
        return select(self.entries, call, device_info(index).arch, name, head_dim, mask, seqlen,
                      paged=paged, group_rows=group_rows, head_dim_v=head_dim_v, scores=scores, rows=rows,
                      window=window, page=page)

    def kernel(self, call: str, index: int, dtype, head_dim: int, mask: str, seqlen: int, *, paged: bool = False,
               group_rows: int = 1, head_dim_v: int = 0, scores: str = "", rows: int | None = None,
               window: int | None = None, page: int | None = None):
        """The loaded kernel serving a call (see entry); `scores`: its score modifiers joined by "+"."""
        key = (call, index, dtype, head_dim, mask, seqlen, paged, group_rows, head_dim_v, scores, rows, window, page)
        kernel = self._resolved.get(key)
        if kernel is None:
            e = self.entry(call, index, dtype, head_dim, mask, seqlen, paged=paged, group_rows=group_rows,
                           head_dim_v=head_dim_v, scores=scores, rows=rows, window=window, page=page)
            kernel = self._load(e.spec, index)
            if len(self._resolved) >= RESOLVED_ENTRIES:
                self._resolved.clear()
            self._resolved[key] = kernel
        return kernel

    def padded_head_dim(self, call: str, index: int, dtype, head_dim: int, head_dim_v: int, mask: str | None = None,
                        scores: str = "", paged: bool | None = None) -> int:
        """The head dim a call of `head_dim` runs at when the table serves it (its mask and score
        modifiers, where given) at no kernel of that head dim on cuda:`index`'s arch and dtype: the
        smallest head dim above it that does (q, k and v are zero-padded to it, which changes no score
        and no output column below head_dim; 0 where the head dim serves it, V's differs, or nothing
        above it does; ops.table.padded_head_dim). Once per key."""
        key = (call, index, dtype, head_dim, head_dim_v, mask, scores, paged)
        to = self._padded.get(key)
        if to is None:
            from ..runtime import device_info
            to = padded_head_dim(self.entries, call, device_info(index).arch, TORCH_DTYPES.get(str(dtype), dtype),
                                 head_dim, head_dim_v, mask, scores, paged)
            self._padded[key] = to
        return to

    def padded_dims(self, call: str, index: int, dtype, head_dim: int, head_dim_v: int, mask: str | None = None,
                    scores: str = "", paged: bool | None = None) -> tuple[int, int] | None:
        """(q and k's head dim, V's) a call of head dims (head_dim, head_dim_v) runs at where the table
        serves neither its own pair nor, for one head dim, that head dim on cuda:`index`'s arch and dtype
        (ops.table.padded_dims); None where it runs as it is. Once per key."""
        return self._by_head_dims(padded_dims, "dims", call, index, dtype, head_dim, head_dim_v, mask, scores, paged)

    def sinks_apart(self, call: str, index: int, dtype, head_dim: int, head_dim_v: int, mask: str, scores: str,
                    paged: bool | None = None) -> bool:
        """Whether a call with learned sinks runs its kernel without them and joins them after (no
        kernel of its score modifiers has them; ops.table.sinks_apart). Once per key."""
        return self._by_head_dims(sinks_apart, "sinks", call, index, dtype, head_dim, head_dim_v, mask, scores, paged)

    def serves_joining_sinks(self, call: str, index: int, dtype, head_dim: int, mask: str, scores: str,
                             paged: bool = False) -> bool:
        """Whether the table runs the call at this head dim itself, learned sinks joined after the kernel of the
        other modifiers where none holds them (ops.table.serves_joining_sinks). Once per key."""
        return self._by_head_dims(serves_joining_sinks, "served", call, index, dtype, head_dim, 0, mask, scores, paged)

    def _by_head_dims(self, rule, what: str, call: str, index: int, dtype, head_dim: int, head_dim_v: int, mask,
                      scores: str, paged):
        """rule(entries, call, arch, dtype, head dims, mask, scores, paged) for cuda:`index`'s arch, once per key."""
        key = (what, call, index, dtype, head_dim, head_dim_v, mask, scores, paged)
        if key not in self._padded:
            from ..runtime import device_info
            self._padded[key] = rule(self.entries, call, device_info(index).arch, TORCH_DTYPES.get(str(dtype), dtype),
                                     head_dim, head_dim_v, mask, scores, paged)
        return self._padded[key]

    def serves(self, call: str, index: int, dtype, head_dim: int, mask: str, *, paged: bool = False,
               head_dim_v: int = 0, scores: str = "") -> bool:
        """Whether the table has an entry for this call's key on cuda:`index`'s arch at this head dim
        itself (no padding), so that kernel() finds one; a dtype the call does not take is False. Once
        per key."""
        key = (call, index, dtype, head_dim, mask, paged, head_dim_v, scores)
        hit = self._served.get(key)
        if hit is None:
            from ..runtime import device_info
            name = TORCH_DTYPES.get(str(dtype), dtype)
            hit = self._served[key] = name in CALL_DTYPES.get(call, HALF_DTYPES) and bool(candidates(
                self.entries, call, device_info(index).arch, name, head_dim, mask, paged, head_dim_v, scores))
        return hit

    def _load(self, spec: str, index: int):
        """The kernel of `spec` for cuda:`index`'s arch, loaded once by one thread (others wait)."""
        from ..runtime import device_info
        from ..runtime.calls import load_served
        arch = device_info(index).arch
        kernel = self._kernels.get((spec, arch))
        if kernel is not None:
            return kernel
        with self._lock:
            lock = self._loading.setdefault(spec, threading.Lock())
        with lock:
            kernel = self._kernels.get((spec, arch))
            if kernel is None:
                import torch
                with torch.cuda.device(index):
                    kernel = load_served(str(self.specs_dir / f"{spec}.yaml"))
                self._kernels[(spec, arch)] = kernel
        return kernel


DISPATCH = Dispatcher()

__all__ = ["DISPATCH", "Dispatcher", "SPECS_DIR", "specs_dir"]
