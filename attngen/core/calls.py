"""The call conventions, listed once: how each kernel is called and what serves it in every layer.

A kind names its convention (`Kind.calls`, checked against this list). Every other layer reads
the list instead of naming a convention: the runtime finds each convention's Kernel class in the
module named here (`runtime/calls`: CONVENTIONS), eval its verify cases and bench in its rooms
(`eval/verify/<call>.py`, `eval/bench/<call>.py`; gathered in `EVALS`), and the dispatch table the
calls each convention serves (`ops/table.py`: CALLS, CONVENTION, VARLEN_CALLS, OUT_DTYPE;
`ops/dispatch.py`: CALL_DTYPES). A convention's name may be compared
only here and in its own modules (`Call.modules`); tests/test_architecture.py checks it.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

HALF_DTYPES = ("fp16", "bf16")


class TableCall(NamedTuple):
    """A call the dispatch table serves (its entries' `call:`), one entry point of attngen.ops."""

    # A NamedTuple, not a frozen dataclass: a first call defines this class (core.frozen says why).
    name: str
    varlen: bool = False            # served by a spec's varlen functions (sequences back to back)
    paged: bool = False             # its entries also key on paged (a KV cache's pages) and group rows
    kv_dtype: str = ""              # the element type of the KV cache its specs read where not the queries'
                                    # (their plans' kv_dtype)
    appends: bool = False           # its calls write new tokens into the KV cache: served by append specs only
    one_row_call: str = ""          # the table call its calls of a few query rows take instead (attngen.attention's
                                    # decode steps: the decode call on the whole cache; no mask, or causal aligned
                                    # bottom-right; no input that requires a gradient)
    one_row_max_rows: int = 0       # the most query rows per head of such calls (speculative decoding's drafts)
    one_row_variants: tuple[str, ...] = ()   # the variants such calls may carry, one row only: score modifiers, and
                                             # "window" for a window (the row's own, bottom-right)
    one_row_variant_min_work: int = 0   # such a call with variants takes the route from batch x query heads x the keys
                                        # its row sees (a window's at most) up: below, the forward's kernel is the
                                        # faster eager call, unless the forward pads the call (then any work)


class Call(NamedTuple):
    """One call convention and what serves it in each layer (modules as attngen.<path>)."""

    # A NamedTuple, not a frozen dataclass: a first call defines this class (core.frozen says why).
    name: str                       # what a kind declares (Kind.calls)
    what: str                       # its specs, in messages
    kernel: str                     # the runtime module of its Kernel class
    verify: str                     # its room of eval.verify: the module of its verify cases (verify_cases)
    bench: str                      # its room of eval.bench: the module of its `attngen bench` (bench_specs, check_options)
    bench_options: tuple[str, ...]  # the BenchOptions only its bench reads
    table: tuple[TableCall, ...]    # the dispatch table's calls it serves
    more_modules: tuple[str, ...] = ()   # its other modules (the forward's varlen call)
    dtypes: tuple[str, ...] = HALF_DTYPES  # the element types of its inputs
    out_dtype: Optional[str] = None      # its output's element type where not the inputs'
    gradients: bool = False         # its kernels compute gradients (they walk query blocks per key block)

    @property
    def modules(self) -> tuple[str, ...]:
        """Its own modules: the only ones besides this list that may compare its names."""
        return tuple(m for m in (self.kernel, self.verify, self.bench, *self.more_modules) if m)


# one_row_max_rows 8: measured on the H200 at or below the forward's kernels' time, on the GPU and eager. Variants:
# the decode call is 2.2-12x faster on the GPU, but at 32/8 heads its eager call (two launches) took 3-11 us more
# where the forward's kernel is short: B1 and B2 at 1024 keys seen (32768 and 65536); from 131072 on (B1 at 4096
# keys, B8 at 1024) less (docs/decode-h200/one_row/README.md, "Variants through the prepared call"). A call the
# forward would pad to another head dim takes the route at any work (the same README, "Decode variant cells at d64
# and d96": padded, d96 B1 at 1k keys took 90-175 us eager).
ATTENTION = TableCall("forward", one_row_call="decode", one_row_max_rows=8,
                      one_row_variants=("softcap", "sink", "alibi", "window"), one_row_variant_min_work=131072)
ATTENTION_VARLEN = TableCall("varlen", varlen=True, paged=True)      # paged: block_table= (paged K/V)
ATTENTION_WITH_KVCACHE = TableCall("decode", paged=True)
# attention_with_kvcache on an e4m3 cache (torch.float8_e4m3fn) with fp16/bf16 queries: its own call name,
# so only such calls reach its entries (their dtype is the queries').
ATTENTION_WITH_KVCACHE_E4M3 = TableCall("decode_kv_e4m3", paged=True, kv_dtype="e4m3")
# attngen.attention_with_kvcache with k and v (or cache_batch_idx, cache_leftpad): the decode specs with
# append: true, and only those, so a call without them keeps the plain kernels.
ATTENTION_WITH_KVCACHE_APPEND = TableCall("decode_append", paged=True, appends=True)
ATTENTION_BACKWARD = TableCall("backward")                          # the gradients of attngen.attention
ATTENTION_VARLEN_BACKWARD = TableCall("varlen_backward", varlen=True)   # those of attngen.attention_varlen
ATTENTION_FP8 = TableCall("forward_fp8")
MERGE_ATTENTION = TableCall("merge")                                # attngen.merge_attention(_list)

FORWARD = Call("forward", "forward specs", "attngen.runtime.calls.forward", "attngen.eval.verify.forward",
               "attngen.eval.bench.forward", ("shapes", "varlen", "lengths", "heads", "plot_file"),
               (ATTENTION, ATTENTION_VARLEN),
               more_modules=("attngen.runtime.calls.varlen", "attngen.eval.verify.varlen", "attngen.eval.bench.varlen"))
DECODE = Call("decode", "decode specs (decode: split_kv)", "attngen.runtime.calls.decode", "attngen.eval.verify.decode",
              "attngen.eval.bench.decode", ("cells", "paged"),
              (ATTENTION_WITH_KVCACHE, ATTENTION_WITH_KVCACHE_APPEND, ATTENTION_WITH_KVCACHE_E4M3))
BACKWARD = Call("backward", "backward specs (backward: dq_atomic, wgmma_dq_red)", "attngen.runtime.calls.backward",
                "attngen.eval.verify.backward", "attngen.eval.bench.backward", ("shapes", "plot_file"),
                (ATTENTION_BACKWARD, ATTENTION_VARLEN_BACKWARD), gradients=True)
FORWARD_FP8 = Call("forward_fp8", "e4m3 forward specs (dtype: e4m3)", "attngen.runtime.calls.forward_fp8",
                   "attngen.eval.verify.forward_fp8", "attngen.eval.bench.forward_fp8", ("shapes",), (ATTENTION_FP8,),
                   dtypes=("e4m3",), out_dtype="bf16")

# A merge of partial results: its parts and output may also be fp32 (the table keys it by fp16 / bf16).
MERGE = Call("merge", "merge specs (merge: by_lse)", "attngen.runtime.calls.merge", "attngen.eval.verify.merge",
             "attngen.eval.bench.merge", (), (MERGE_ATTENTION,))

CALLS: tuple[Call, ...] = (FORWARD, DECODE, BACKWARD, FORWARD_FP8, MERGE)
TABLE_CALLS: tuple[TableCall, ...] = tuple(t for call in CALLS for t in call.table)


def call_named(name: str) -> Call:
    """The convention of that name; ValueError naming the others."""
    for call in CALLS:
        if call.name == name:
            return call
    raise ValueError(f"no call convention {name!r}: one of {', '.join(c.name for c in CALLS)}")


def serving(table_call: str) -> Call:
    """The convention whose kernels serve the dispatch table's call of that name."""
    for call in CALLS:
        if any(t.name == table_call for t in call.table):
            return call
    raise ValueError(f"no call {table_call!r} in the dispatch table: one of {', '.join(t.name for t in TABLE_CALLS)}")


def table_call(name: str) -> TableCall:
    return next(t for t in serving(name).table if t.name == name)


def _check_names() -> None:
    """Every name, convention or table call, once: a word means one thing wherever it is compared."""
    names = [c.name for c in CALLS] + [t.name for t in TABLE_CALLS if t.name not in {c.name for c in CALLS}]
    assert len(set(names)) == len(names), f"a call name is listed twice: {names}"


_check_names()

__all__ = ["ATTENTION", "ATTENTION_BACKWARD", "ATTENTION_FP8", "ATTENTION_VARLEN", "ATTENTION_VARLEN_BACKWARD",
           "ATTENTION_WITH_KVCACHE", "ATTENTION_WITH_KVCACHE_APPEND", "ATTENTION_WITH_KVCACHE_E4M3", "BACKWARD", "CALLS",
           "DECODE", "FORWARD", "FORWARD_FP8", "MERGE", "MERGE_ATTENTION", "TABLE_CALLS", "Call", "TableCall",
           "call_named", "serving", "table_call"]
