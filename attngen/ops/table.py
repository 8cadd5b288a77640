"""The dispatch table: which committed spec serves a call, per GPU arch, call convention, dtype,
head dim, mask and sequence-length bucket. It lives in specs/dispatch/table.yaml beside the specs
it names, is written from measurements (`attngen dispatch --from REPORT --write`), and read here with no
torch and no GPU, so `attngen check` can prove that every entry names a spec that exists.

An entry:
    {call: forward, arch: sm_90, dtype: fp16, head_dim: 64, mask: causal, upto: 1024,
     spec: h100_wgmma_d64_n128c1hs2oet, us: 9.5, runner_up: h100_wgmma_d64_n128c1hs2o,
     runner_up_us: 9.7, measured: "docs/hopper-h200/round3/grid_fp16.json 1x8x512x64"}
`upto`: the largest seqlen_k (forward, varlen, backward: max_seqlen_k; decode: cache capacity) the entry
serves; null for no limit. `min_rows`: the fewest query rows (batch x heads x seqlen_q) of a call the
entry serves, where a bucket's winner depends on the grid's size (a persistent spec loses on grids
with fewer query blocks than SMs): of a bucket's entries, a call takes the one with the largest
min_rows it reaches. An entry without `us` is unmeasured (chosen from its spec's target).
Decode entries also key on page_size (0: contiguous caches) and may set `max_group_rows`: the
most query rows per KV head (heads / kv_heads x seqlen_q) they serve. Entries for a spec with score
modifiers key on them too: `scores: softcap`, `alibi` or `softcap+alibi` (the spec's `scores`, joined).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path

from ..errors import SpecError

CALLS = ("forward", "varlen", "decode", "backward", "varlen_backward", "forward_fp8")
# The runtime call convention (its kind's `calls`) a spec must have to serve each call: a varlen
# call is the varlen function of a forward-convention kernel; backward serves the gradients of a
# forward call (autograd through attngen.attention), varlen_backward those of a varlen call (the
# varlen functions of a backward-convention kernel).
CONVENTION = {"forward": "forward", "varlen": "forward", "decode": "decode", "backward": "backward",
              "varlen_backward": "backward", "forward_fp8": "forward_fp8"}
# The output type of each call where the table fixes it: attngen.attention_fp8 returns bf16 (as
# FlashAttention-3's fp8 forward), so torch.compile knows its output without loading a kernel.
OUT_DTYPE = {"forward_fp8": "bf16"}
VARLEN_CALLS = ("varlen", "varlen_backward")   # calls served by a spec's varlen functions
TABLE_FILE = Path("dispatch") / "table.yaml"     # under the specs folder


@dataclass(frozen=True)
class Entry:
    call: str
    arch: str
    dtype: str
    head_dim: int
    mask: str
    spec: str
    upto: int | None = None
    page_size: int = 0
    max_group_rows: int | None = None
    min_rows: int | None = None
    us: float | None = None
    runner_up: str | None = None
    runner_up_us: float | None = None
    measured: str | None = None
    head_dim_v: int = 0                 # V's and O's head dim where it differs from head_dim (0: the same)
    scores: str = ""                    # the spec's score modifiers joined by "+" ("": none)

    @property
    def why(self) -> str:
        if self.us is None:
            return f"{self.spec}: unmeasured (the spec's target GPU class)"
        runner = f", runner-up {self.runner_up} {self.runner_up_us:.1f} us" if self.runner_up else ""
        return f"{self.spec}: {self.us:.1f} us measured ({self.measured}){runner}"

    def key(self) -> tuple:
        return (self.call, self.arch, self.dtype, self.head_dim, self.mask, self.page_size, self.head_dim_v,
                self.scores)


def table_path(specs_dir) -> Path:
    return Path(specs_dir) / TABLE_FILE


def load_table(path) -> tuple[Entry, ...]:
    """Every entry of the table at `path`; SpecError naming the file and entry when one is malformed."""
    import yaml
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise SpecError(f"cannot read the dispatch table: {exc}", file=str(path)) from None
    except yaml.YAMLError as exc:
        raise SpecError(f"not valid YAML: {exc}", file=str(path)) from None
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise SpecError("a dispatch table is a mapping with a list under `entries`", file=str(path), key="entries")
    names = {f.name for f in fields(Entry)}
    out = []
    for i, raw in enumerate(data["entries"]):
        where = f"entries[{i}]"
        if not isinstance(raw, dict):
            raise SpecError("each entry is a mapping", file=str(path), key=where)
        unknown = set(raw) - names
        if unknown:
            raise SpecError(f"unknown key(s) {', '.join(sorted(map(str, unknown)))}; keys are {', '.join(sorted(names))} "
                            "(a value with a comma in a flow mapping needs quotes)",
                            file=str(path), key=where)
        try:
            entry = Entry(**raw)
        except TypeError as exc:
            raise SpecError(f"{exc}", file=str(path), key=where) from None
        if entry.call not in CALLS:
            raise SpecError(f"call must be one of {', '.join(CALLS)} (got {entry.call!r})", file=str(path),
                            key=f"{where}.call")
        out.append(entry)
    return tuple(out)


def dump_table(entries, header: str) -> str:
    """The table's YAML: one flow mapping per entry, sorted by key then upto, so a change to one
    entry is a one-line diff."""
    import yaml
    lines = [f"# {line}" if line else "#" for line in header.splitlines()] + ["entries:"]
    order = sorted(entries, key=lambda e: (e.key(), math.inf if e.upto is None else e.upto,
                                           e.max_group_rows or 0, e.min_rows or 0))
    for e in order:
        row = {f.name: getattr(e, f.name) for f in fields(Entry)
               if getattr(e, f.name) not in (None,) and not (f.name in ("page_size", "head_dim_v", "scores")
                                                             and not getattr(e, f.name))}
        text = yaml.safe_dump(row, default_flow_style=True, sort_keys=False, width=10_000).strip()
        lines.append(f"  - {text}")
    return "\n".join(lines) + "\n"


def call_text(call: str, arch: str, dtype: str, head_dim: int, mask: str, seqlen: int, page_size: int = 0,
              group_rows: int = 1, head_dim_v: int = 0, scores: str = "") -> str:
    """A call's dispatch key in words (the decode keys only for decode calls)."""
    decode = f" page_size {page_size} group_rows {group_rows}" if call == "decode" else ""
    v = f" head_dim_v {head_dim_v}" if head_dim_v else ""
    mods = f" scores {scores}" if scores else ""
    return f"{call} {arch} {dtype} head_dim {head_dim}{v} {mask}{mods} seqlen {seqlen}{decode}"


def scores_key(plan) -> str:
    """A plan's score modifiers as an entry's `scores`."""
    return "+".join(s.name for s in getattr(plan, "score_variants", ()))


def entry_problem(e: Entry, plan) -> str | None:
    """Why the spec whose plan is `plan` cannot serve entry `e`: another call convention, dtype or
    head_dim, no function for the entry's mask (varlen: its varlen function), or pages of
    another size; None when it serves it."""
    from ..core.varlen_plan import varlen_key
    if plan.kind.calls != CONVENTION[e.call]:
        return f"{e.spec} is a {plan.kind.calls} spec, not one for {e.call} calls"
    if (plan.spec.dtype, plan.head_dim) != (e.dtype, e.head_dim):
        return f"{e.spec} is {plan.spec.dtype} head_dim {plan.head_dim}, the entry {e.dtype} {e.head_dim}"
    if e.call in OUT_DTYPE and plan.spec.out_dtype != OUT_DTYPE[e.call]:
        return f"{e.spec} writes {plan.spec.out_dtype}, {e.call} calls return {OUT_DTYPE[e.call]}"
    if plan.head_dim_v != e.head_dim_v:
        return f"{e.spec} has head_dim_v {plan.v_dim}, the entry {e.head_dim_v or e.head_dim}"
    if scores_key(plan) != e.scores:
        return f"{e.spec} applies scores [{scores_key(plan)}], the entry [{e.scores}]"
    varlen = e.call in VARLEN_CALLS
    if (varlen_key(e.mask) if varlen else e.mask) not in plan.entry_functions:
        return f"{e.spec} has no {e.mask} {'varlen ' if varlen else ''}function"
    pages = getattr(plan, "page_size", 0)
    if e.page_size and pages != e.page_size:
        return f"{e.spec} reads pages of {pages}, the entry {e.page_size}"
    return None


def candidates(entries, call: str, arch: str, dtype: str, head_dim: int, mask: str, page_size: int = 0,
               head_dim_v: int = 0, scores: str = "") -> list:
    """The entries of one key, by upto (no limit last), then max_group_rows and min_rows; head_dim_v 0:
    V's head dim is head_dim."""
    keyed = [e for e in entries if e.key() == (call, arch, dtype, head_dim, mask, page_size, head_dim_v, scores)]
    return sorted(keyed, key=lambda e: (math.inf if e.upto is None else e.upto, e.max_group_rows or math.inf,
                                        e.min_rows or 0))


def select(entries, call: str, arch: str, dtype: str, head_dim: int, mask: str, seqlen: int, *,
           page_size: int = 0, group_rows: int = 1, head_dim_v: int = 0, scores: str = "",
           rows: int | None = None) -> Entry:
    """The entry serving a call: among its key's entries, the first bucket whose upto covers
    `seqlen` (and whose max_group_rows covers `group_rows`; the last bucket serves longer
    sequences), and of that bucket's entries the one with the largest min_rows that `rows` (the
    call's batch x heads x seqlen_q; None: the entry without min_rows) reaches.
    LookupError with what exists and how to add the key when the key has no entry."""
    keyed = candidates(entries, call, arch, dtype, head_dim, mask, page_size, head_dim_v, scores)
    keyed = [e for e in keyed if e.max_group_rows is None or group_rows <= e.max_group_rows] or keyed
    if not keyed:
        have = sorted({(e.arch, e.dtype, e.head_dim) + ((f"v{e.head_dim_v}",) if e.head_dim_v else ()) + (e.mask,)
                       + ((f"scores {e.scores}",) if e.scores else ())
                       + ((e.page_size,) if call == "decode" else ()) for e in entries if e.call == call}, key=str)
        listed = "; ".join(" ".join(str(x) for x in h) for h in have) or "none"
        raise LookupError(
            f"attngen has no {call} kernel for {arch} {dtype} head_dim {head_dim}"
            + (f" head_dim_v {head_dim_v}" if head_dim_v else "") + f" mask {mask}"
            + (f" scores {scores}" if scores else "")
            + (f" page_size {page_size}" if call == "decode" else "")
            + f". The dispatch table has: {listed}. Add one: write a spec for it (`attngen explain SPEC` checks it; "
              f"`attngen sweep SPEC --shapes 1x16x2048x{head_dim}` finds faster variants), time it on that GPU with "
              f"`attngen bench SPEC --json REPORT.json`, then `attngen dispatch --from REPORT.json --write`.")
    bucket = next((e for e in keyed if e.upto is None or seqlen <= e.upto), keyed[-1])
    same = [e for e in keyed if e.upto == bucket.upto and e.max_group_rows == bucket.max_group_rows]
    return max((e for e in same if (e.min_rows or 0) <= (rows or 0)), key=lambda e: e.min_rows or 0,
               default=min(same, key=lambda e: e.min_rows or 0))


__all__ = ["CALLS", "CONVENTION", "OUT_DTYPE", "Entry", "call_text", "scores_key", "entry_problem", "TABLE_FILE", "candidates", "dump_table", "load_table", "select", "table_path"]
