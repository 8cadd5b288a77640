"""Dispatch-table entries from measurements: the winner and runner-up of every cell of `attngen
bench --json` or `attngen sweep --json` reports (GPU time, attngen specs only), bucketed by
sequence length: forward entries from forward reports and sweeps, backward entries from backward
bench reports and sweeps of backward specs, varlen entries from `attngen bench --varlen` reports
(bucketed by the batch's longest sequence), e4m3 forward entries from bench reports of e4m3 specs. Entries of other calls and other arches in the table
are kept as they are."""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from ..ops.table import CALLS, Entry

FORWARD, BACKWARD, VARLEN, FP8 = "forward", "backward", "varlen", "forward_fp8"   # the Entry.call of the calls
                                                                                  # bench reports measure

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
        if "lengths" in report and "rows" in report:   # a varlen bench report
            if call == VARLEN:
                _varlen_cells(cells, name, report)
            continue
        if "cases" in report and "ranking" in (report["cases"] or [{}])[0]:
            if report.get("call", FORWARD) == call:
                _sweep_cells(cells, name, report, call)
            continue
        arch = arch_of(report["gpu"])
        for r in report["results"]:
            c = r["case"]
            if c.get("call", FORWARD) != call:
                continue
            ranked = sorted((t for t in r["timings"] if t["status"] == "ok" and not t["impl"].startswith("sdpa")),
                            key=lambda t: t["median_us"])
            if not ranked:
                continue
            mask = "causal" if c["causal"] else "none"
            query_rows = c["batch"] * c["heads"] * c["seqlen"] if call == FORWARD else 0   # only forward calls pass rows
            cells[(arch, c["dtype"], c["head_dim"], mask, c.get("head_dim_v", 0))][c["seqlen"], query_rows] = (
                ranked, f"{name} {r['label']}")
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
    return out


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
    arch = report.get("arch") or arch_of(report["gpu"])
    for case in report["cases"]:
        ranked = [{"impl": r["name"], "median_us": r["median_us"]} for r in case["ranking"] if r.get("median_us")]
        if ranked:
            batch, heads, seqlen, head_dim, *v = case["shape"]
            rows = batch * heads * seqlen if call == FORWARD else 0
            cells[(arch.rstrip("a"), case["dtype"], head_dim, "causal" if case["causal"] else "none",
                   v[0] if v else 0)][seqlen, rows] = (ranked, f"{name} {case['label']}")


def _varlen_cells(cells, name: str, report: dict) -> None:
    """A varlen bench report's rows as cells: per batch, dtype, head dim and mask, the specs that
    passed, fastest first; the batch's longest sequence stands for its seqlen."""
    arch, longest = arch_of(report["gpu"]), max(report["lengths"])
    ranked = defaultdict(list)
    for r in report["rows"]:
        if r.get("status") == "ok":
            key = (arch, r["dtype"], r["head_dim"], "causal" if r["causal"] else "none", 0)
            ranked[key, r["batch"]].append({"impl": r["spec"], "median_us": r["attngen_us"]})
    for (key, batch), specs in ranked.items():
        cells[key][longest, 0] = (sorted(specs, key=lambda t: t["median_us"]), f"{name} {batch}")


def merge(existing, new) -> list[Entry]:
    """`existing` with every key that `new` covers replaced by `new`'s entries of that key."""
    replaced = {e.key() for e in new}
    return [e for e in existing if e.key() not in replaced] + list(new)


def read_reports(paths) -> list[tuple[str, dict]]:
    """(path as the table cites it: relative to the working directory when inside it, report)."""
    import json
    from ..render import display_path
    return [(display_path(p), json.loads(Path(p).read_text())) for p in paths]


__all__ = ["arch_of", "backward_entries", "bench_entries", "call_entries", "entries_summary", "forward_entries",
           "merge", "read_reports", "varlen_entries"]
