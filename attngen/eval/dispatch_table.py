"""Dispatch-table entries from measurements: the winner and runner-up of every cell of `attngen
bench --json` or `attngen sweep --json` reports (GPU time, attngen specs only), bucketed by
sequence length: forward entries from forward reports and sweeps, backward entries from backward
bench reports and sweeps of backward specs, varlen entries from `attngen bench --varlen` reports
(bucketed by the batch's longest sequence), e4m3 forward entries from bench reports of e4m3 specs. Entries of other calls and other arches in the table
are kept as they are."""
from __future__ import annotations

import contextlib
import json
import math
from collections import defaultdict

from .. import fsutil
from ..core.calls import (ATTENTION, ATTENTION_BACKWARD, ATTENTION_FP8, ATTENTION_VARLEN, ATTENTION_VARLEN_BACKWARD,
                          ATTENTION_WITH_KVCACHE, ATTENTION_WITH_KVCACHE_APPEND)
from ..errors import SpecError
from ..ops.table import CALLS, MAX_INTEGER, Entry, check_entry

# the Entry.call of the calls bench reports measure
FORWARD, BACKWARD, VARLEN, FP8 = (t.name for t in (ATTENTION, ATTENTION_BACKWARD, ATTENTION_VARLEN, ATTENTION_FP8))
JOINS_SINKS = (FORWARD, VARLEN, ATTENTION_WITH_KVCACHE.name)   # the calls ops.library joins sinks after

GPU_ARCH = {"H100": "sm_90", "H200": "sm_90", "H800": "sm_90", "L4": "sm_89", "RTX 4090": "sm_89", "A100": "sm_80"}


def arch_of(gpu_name: str) -> str:
    for key, arch in GPU_ARCH.items():
        if key in gpu_name:
            return arch
    raise ValueError(f"no arch known for GPU {gpu_name!r}; known: {', '.join(GPU_ARCH)}")


def forward_entries(reports: list[tuple[str, dict]]) -> list[Entry]:
    """Forward entries from (file name, bench report dict) pairs: per (arch, dtype, head_dim,
    mask) the fastest spec of each measured seqlen, serving up to the geometric mean of its
    seqlen and the next one measured (the longest serves everything above); where grids of one
    seqlen have different winners, split by query rows (grid_entries)."""
    return call_entries(reports, FORWARD)


def backward_entries(reports: list[tuple[str, dict]]) -> list[Entry]:
    """Backward entries from the cases of backward bench reports (`attngen bench --json` on backward
    specs: cases with "call": "backward"), bucketed by seqlen as forward_entries buckets."""
    return call_entries(reports, BACKWARD)


def varlen_entries(reports: list[tuple[str, dict]]) -> list[Entry]:
    """Varlen entries from `attngen bench --varlen --json` reports: per (arch, dtype, head_dim, mask)
    the fastest spec of each measured batch, keyed by its longest sequence (the call's
    max_seqlen_k; of batches with the same longest sequence, the last report's) and bucketed as
    forward_entries buckets seqlens."""
    return call_entries(reports, VARLEN)


def bench_entries(reports: list[tuple[str, dict]]) -> list[Entry]:
    """The entries of every call the reports measure: forward, backward, varlen, then e4m3 forward
    entries (`attngen bench --json` on e4m3 specs: cases with "call": "forward_fp8")."""
    return (forward_entries(reports) + backward_entries(reports) + varlen_entries(reports)
            + call_entries(reports, FP8))


def entries_summary(entries) -> str:
    """'12 forward entries', or '12 forward and 4 backward entries'."""
    counts = [(call, sum(e.call == call for e in entries)) for call in CALLS]
    parts = [f"{n} {call}" for call, n in counts if n] or [f"0 {FORWARD}"]
    return " and ".join(parts) + " entries"


def call_entries(reports: list[tuple[str, dict]], call: str) -> list[Entry]:
    """`call`'s entries from the reports' cases of that call (a case without "call": forward; a
    sweep report's cases are its "call", forward where it has none). A cell (key, seqlen and query
    rows, batch x heads x seqlen) that several reports measure is the last report's: a later --from
    remeasures it. Where cells of one seqlen but different rows have different winners, the
    bucket splits by rows (grid_entries)."""
    cells = defaultdict(dict)
    for name, report in reports:
        with malformed(name):
            _report_cells(cells, name, report, call)
    out = []
    for (arch, dtype, head_dim, mask, *v), by_cell in cells.items():
        seqlens = sorted({seqlen for seqlen, _ in by_cell})
        for i, seqlen in enumerate(seqlens):
            upto = None if i + 1 == len(seqlens) else int(math.sqrt(seqlen * seqlens[i + 1]))
            by_rows = sorted((rows, *cell) for (s, rows), cell in by_cell.items() if s == seqlen)
            for min_rows, ranked, where in grid_entries(by_rows):
                best, second = ranked[0], (ranked[1] if len(ranked) > 1 else None)
                out.append(Entry(call, arch, dtype, head_dim, mask, best["impl"], upto=upto, min_rows=min_rows,
                                 us=round(best["median_us"], 1), runner_up=second["impl"] if second else None,
                                 runner_up_us=round(second["median_us"], 1) if second else None, measured=where,
                                 head_dim_v=v[0] if v else 0))
    for e in out:
        check_entry(e, e.measured)
    return out


def _report_cells(cells, name: str, report: dict, call: str) -> None:
    """The cells of `call` that one report measured, into `cells` (see call_entries)."""
    if not isinstance(report, dict):
        raise TypeError(f"the report is a JSON {type(report).__name__}, not an object")
    if "lengths" in report and "rows" in report:   # a varlen bench report
        if call == VARLEN:
            _varlen_cells(cells, name, report)
        return
    if "cases" in report and "ranking" in (report["cases"] or [{}])[0]:
        if report.get("call", FORWARD) == call:
            _sweep_cells(cells, name, report, call)
        return
    arch = arch_of(_text(report["gpu"], "gpu"))
    for r in report["results"]:
        c = r["case"]
        if c.get("call", FORWARD) != call:
            continue
        ranked = sorted((_timing(t["impl"], t["median_us"]) for t in r["timings"]
                         if t["status"] == "ok" and not _text(t["impl"], "impl").startswith("sdpa")),
                        key=lambda t: t["median_us"])
        if not ranked:
            continue
        mask = "causal" if _flag(c["causal"], "causal") else "none"
        seqlen = _count(c["seqlen"], "seqlen")
        query_rows = _count(c["batch"], "batch") * _count(c["heads"], "heads") * seqlen if call == FORWARD else 0
        cells[(arch, _text(c["dtype"], "dtype"), _count(c["head_dim"], "head_dim"), mask,
               _count(c.get("head_dim_v", 0), "head_dim_v", least=0))][seqlen, query_rows] = (
            ranked, f"{name} {_text(r['label'], 'label')}")


# A larger grid's winner starts a bucket of its own only where it beats the smaller grids' winner
# on that grid by more than this: closer cells are run-to-run noise (or another GPU of the arch).
GRID_SPLIT_MARGIN = 0.03


def grid_entries(by_rows) -> list[tuple]:
    """(min_rows, ranking, where) per run of one winner in `by_rows`, the cells of one bucket as
    (query rows, ranking, where) by rows: the first run serves every call (min_rows None), each
    later one serves calls from the geometric mean of the rows on both sides of its boundary. A
    cell whose winner beats the current run's spec by at most GRID_SPLIT_MARGIN stays in that run (a
    cell that did not measure that spec starts a run of its own). A run stands for its largest grid
    that its own spec won."""
    runs, last_rows = [], None
    for rows, ranked, where in by_rows:
        held = runs[-1][1][0]["impl"] if runs else None
        times = {t["impl"]: t["median_us"] for t in ranked}
        if ranked[0]["impl"] == held:
            runs[-1][1:] = [ranked, where]
        elif held is None or held not in times or times[held] > ranked[0]["median_us"] * (1 + GRID_SPLIT_MARGIN):
            runs.append([None if held is None else int(math.sqrt(last_rows * rows)), ranked, where])
        last_rows = rows
    return [tuple(run) for run in runs]


def _sweep_cells(cells, name: str, report: dict, call: str) -> None:
    """A sweep report's cases as bench cells: its ranking, fastest first, names as written by
    `attngen sweep --write-best` (a name that is not a committed spec is refused on --write)."""
    arch = _text(report.get("arch") or arch_of(_text(report["gpu"], "gpu")), "arch")
    for case in report["cases"]:
        ranked = [_timing(r["name"], r["median_us"]) for r in case["ranking"] if r.get("median_us")]
        if ranked:
            batch, heads, seqlen, head_dim, *v = (_count(n, "shape") for n in case["shape"])
            rows = batch * heads * seqlen if call == FORWARD else 0
            cells[(arch.rstrip("a"), _text(case["dtype"], "dtype"), head_dim,
                   "causal" if _flag(case["causal"], "causal") else "none",
                   v[0] if v else 0)][seqlen, rows] = (ranked, f"{name} {_text(case['label'], 'label')}")


def _varlen_cells(cells, name: str, report: dict) -> None:
    """A varlen bench report's rows as cells: per batch, dtype, head dim and mask, the specs that
    passed, fastest first; the batch's longest sequence stands for its seqlen."""
    arch, longest = arch_of(_text(report["gpu"], "gpu")), max(_count(n, "lengths") for n in report["lengths"])
    ranked = defaultdict(list)
    for r in report["rows"]:
        if r.get("status") == "ok":
            key = (arch, _text(r["dtype"], "dtype"), _count(r["head_dim"], "head_dim"),
                   "causal" if _flag(r["causal"], "causal") else "none", 0)
            ranked[key, _text(r["batch"], "batch")].append(_timing(r["spec"], r["attngen_us"]))
    for (key, batch), specs in ranked.items():
        cells[key][longest, 0] = (sorted(specs, key=lambda t: t["median_us"]), f"{name} {batch}")


BUILT_IN_MASKS = ("none", "causal", "window")   # a call's causal= and window= name one; an expression spec's
                                                # mask is its own, reached through attngen.load, not the table


def serving_entries(plans, entries) -> list[Entry]:
    """Unmeasured entries for the keys the plans' specs serve that `entries` lacks: per plan its arch,
    dtype, head dims and score modifiers, each call of its convention, each of its masks, contiguous
    and paged caches where the call has one; a key goes to the first plan that serves it (what serves
    is ops.table.entry_problem's, as `attngen check` proves it). How a new member of a family file
    reaches the table before anything is measured; a bench report's entries replace these later."""
    from ..core.calls import table_call
    from ..ops.table import CONVENTION, entry_problem, scores_key
    have = {e.key() for e in entries}
    new = []
    for plan in plans:
        if "expr" in scores_key(plan).split("+"):
            continue                                    # an expression variant: no call argument selects it
        for call in CALLS:
            if CONVENTION[call] != plan.kind.calls:
                continue
            for mask in BUILT_IN_MASKS:                 # entry_problem keeps the ones it has a function for
                for paged in ((False, True) if table_call(call).paged else (False,)):
                    e = Entry(call=call, arch=plan.target.arch, dtype=plan.spec.dtype, head_dim=plan.head_dim,
                              mask=mask, spec=plan.spec.name, paged=paged, head_dim_v=plan.head_dim_v,
                              scores=scores_key(plan))
                    if e.key() not in have and entry_problem(e, plan) is None:
                        check_entry(e, "the entry to add")
                        new.append(e)
                        have.add(e.key())
    return new


COVERAGE_HEAD_DIMS = (32, 40, 59, 64, 80, 96, 111, 128, 160, 192, 224, 256)   # FlashAttention's tests'


def coverage(entries, arch: str, dtype: str, head_dims=COVERAGE_HEAD_DIMS) -> list[dict]:
    """What the table serves on `arch` in `dtype`, per call (decode: contiguous and paged caches), score
    modifiers and mask that it has entries of: for each head dim "served" (a kernel of that head dim),
    "padded" (runs at the next served head dim, q, k and v zero-padded, as the entry points do), "window"
    (runs the window function, served or padded, with a window wider than every sequence:
    ops.table.window_stands_in), "sinks after" (learned sinks beside modifiers no sink kernel has: the
    kernel of the others, the sinks joined after it; ops.table.sinks_apart) or "refused". V of q's head
    dim."""
    from ..core.calls import table_call
    from ..ops.table import candidates, padded_dims, window_stands_in
    rows = []
    # the calls ops.library runs padded at an unserved head dim (a paged call's pools and a decode call's
    # cache copied; an appending call's copied back); not an e4m3 cache, fp8 or merge
    padding = {ATTENTION.name, ATTENTION_BACKWARD.name, ATTENTION_VARLEN.name, ATTENTION_VARLEN_BACKWARD.name,
               ATTENTION_WITH_KVCACHE.name, ATTENTION_WITH_KVCACHE_APPEND.name}
    keys = sorted({(e.call, e.paged, e.scores, e.mask) for e in entries
                   if e.arch == arch and e.dtype == dtype and not e.head_dim_v},
                  key=lambda k: (CALLS.index(k[0]), k[1], k[2], BUILT_IN_MASKS.index(k[3])
                                 if k[3] in BUILT_IN_MASKS else len(BUILT_IN_MASKS), k[3]))
    def reach(call, paged, scores, mask, d):
        if candidates(entries, call, arch, dtype, d, mask, paged, 0, scores):
            return "served"
        if call in padding and padded_dims(
                entries, call, arch, dtype, d, 0, mask, scores, paged if table_call(call).paged else None):
            return "padded"
        return "refused"

    for call, paged, scores, mask in keys:
        cells = {}
        for d in head_dims:
            cells[d] = reach(call, paged, scores, mask, d)
            if cells[d] == "refused" and window_stands_in(call, mask, scores) \
                    and reach(call, paged, scores, "window", d) != "refused":
                cells[d] = "window"
        rows.append({"call": call, "paged": paged, "scores": scores, "mask": mask, "head_dims": cells})
        with_sinks = f"{scores}+sink" if scores else "sink"
        if call in JOINS_SINKS and not (call == VARLEN and paged) and "sink" not in scores.split("+") \
                and (call, paged, with_sinks, mask) not in keys:
            # learned sinks where no kernel has them with these modifiers: the kernel of the others, the sinks
            # joined after it (ops.table.sinks_apart, ops.library.join_sinks; paged varlen takes no sinks)
            rows.append({"call": call, "paged": paged, "scores": with_sinks, "mask": mask,
                         "head_dims": {d: "refused" if c == "refused" else "sinks after" for d, c in cells.items()}})
    return rows


def merge(existing, new) -> list[Entry]:
    """`existing` with every key that `new` covers replaced by `new`'s entries of that key, but for the
    key's window-width buckets (max_window) where `new` brings none: reports time no window's width, so
    a report's winners do not drop the entry chosen for narrow windows."""
    replaced = {e.key() for e in new}
    widths = {e.key() for e in new if e.max_window is not None}
    return [e for e in existing if e.key() not in replaced or (e.max_window is not None and e.key() not in widths)] \
        + list(new)


def dropped_elsewhere(existing, merged, reports) -> dict[str, int]:
    """The entries of `existing` that `merged` no longer holds and that other reports than `reports` measured:
    {the report an entry cites: entries dropped}. A report rewrites every entry of its keys, so a key that
    several reports share keeps only this call's winners unless the others are given too."""
    kept = set(map(repr, merged))
    out: dict[str, int] = {}
    for e in existing:
        if repr(e) in kept or not e.measured:
            continue
        source = e.measured.split(" ", 1)[0]
        if source not in reports:
            out[source] = out.get(source, 0) + 1
    return out


# Reports run to a few MiB (a sweep of thousands of candidates); a report nests 7 levels.
MAX_REPORT_BYTES = 64 * 1024 * 1024
MAX_REPORT_DEPTH = 64
NOT_A_REPORT = "not an `attngen bench --json` or `attngen sweep --json` report"


def read_reports(paths) -> list[tuple[str, dict]]:
    """(path as the table cites it: relative to the working directory when inside it, report). A file
    that is not a regular file, too large, not JSON, nested deeper than MAX_REPORT_DEPTH or holding
    NaN or Infinity is one SpecError naming it."""
    from ..render import display_path
    return [(display_path(p), read_report(p)) for p in paths]


def read_report(path) -> dict:
    """One report file's JSON (see read_reports)."""
    name = str(path)
    text = _report_text(name)
    if fsutil.json_deeper_than(text, MAX_REPORT_DEPTH):
        raise SpecError(f"{NOT_A_REPORT}: nested more than {MAX_REPORT_DEPTH} levels deep (a report nests under 10)",
                        file=name)
    try:
        return json.loads(text, parse_constant=_no_constant, parse_int=_report_int)
    except ValueError as exc:       # JSONDecodeError, NaN or Infinity, an integer too long to convert
        raise SpecError(f"{NOT_A_REPORT}: {_one_line(exc)}", file=name) from None
    except RecursionError:          # not reached past json_deeper_than; kept so depth is never a traceback
        raise SpecError(f"{NOT_A_REPORT}: nested too deep", file=name) from None


def _report_text(name: str) -> str:
    """A report's text: a regular file of at most MAX_REPORT_BYTES of UTF-8 (a link is followed), a FIFO
    or device refused without being opened."""
    try:
        data = fsutil.read_regular(name, MAX_REPORT_BYTES, follow=True)
    except (fsutil.NotRegular, fsutil.TooLarge) as exc:
        mib = MAX_REPORT_BYTES >> 20
        grew = isinstance(exc, fsutil.TooLarge) and exc.grew
        raise SpecError(f"{NOT_A_REPORT}: " + (f"over {mib} MiB" if grew else f"not a regular file of at most {mib} MiB"),
                        file=name) from None
    except (fsutil.ReadRefused, OSError) as exc:
        raise SpecError(f"cannot read the report: {fsutil.reason(exc)}", file=name) from None
    try:
        return fsutil.utf8_text(data)
    except fsutil.NotUtf8 as exc:
        raise SpecError(f"{NOT_A_REPORT}: not UTF-8 (byte 0x{exc.byte:02x} at offset {exc.offset})",
                        file=name) from None


def _report_int(digits: str) -> int:
    """A JSON integer, refused before conversion when it is longer than any count or time a report holds."""
    if len(digits.lstrip("-")) > 18:
        raise ValueError(f"an integer of {len(digits.lstrip('-'))} digits is no count a report holds")
    return int(digits)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a time; a report's times are finite numbers")


def _one_line(exc) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 200 else text[:197] + "..."


@contextlib.contextmanager
def malformed(name: str):
    """Reading report `name`: what its JSON lacks or holds of the wrong type is one SpecError naming
    it, never a traceback from deep inside the cell walk."""
    try:
        yield
    except KeyError as exc:
        raise SpecError(f"{NOT_A_REPORT}: it has no {_one_line(repr(exc.args[0]))} where one is expected",
                        file=name) from None
    except (IndexError, TypeError, AttributeError, ValueError) as exc:
        raise SpecError(f"{NOT_A_REPORT}: {_one_line(exc)}", file=name) from None


def _count(value, what: str, least: int = 1) -> int:
    """A report's count (a seqlen, batch, head dim): an integer of at least `least`, not a bool or text."""
    if type(value) is not int or not least <= value <= MAX_INTEGER:
        raise ValueError(f"{what} must be an integer from {least} to {MAX_INTEGER}, not {_one_line(repr(value))[:40]}")
    return value


def _flag(value, what: str) -> bool:
    if type(value) is not bool:
        raise ValueError(f"{what} must be true or false, not {_one_line(repr(value))[:40]}")
    return value


def _text(value, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be text, not {_one_line(repr(value))[:40]}")
    return value


def _timing(impl, median_us) -> dict:
    """A ranking's row: a name and a finite, positive median time."""
    if type(median_us) not in (int, float) or not math.isfinite(median_us) or median_us <= 0:
        raise ValueError(f"median_us must be a positive number of microseconds, not {_one_line(repr(median_us))[:40]}")
    return {"impl": _text(impl, "impl"), "median_us": median_us}


__all__ = ["arch_of", "backward_entries", "bench_entries", "call_entries", "entries_summary", "forward_entries",
           "merge", "read_report", "read_reports", "varlen_entries"]
