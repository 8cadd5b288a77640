"""The output of a sweep: the ranked table (`format_report`), everything as JSON (`report_dict`),
and the winner of each case as a spec file (`winners`, `write_best`)."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from ... import fsutil
from ...kinds import kind_of
from ...spec import spec_dict, spec_yaml
from ..bench.report import Case
from .build import COMPILE_FAILED, Candidate, candidate_name
from .prune import NOT_SAMPLED
from .search import SweepReport
from .space import choice_of, shape_of

def _ratio(flash: float | None, us: float | None) -> float | None:
    return flash / us if flash and us else None


def format_report(report: SweepReport, *, top: int | None = 20) -> str:
    """Ranked table per case (a column per axis of the space), the flash reference, the base spec's
    place, and the counts."""
    space = report.space
    base_choice = choice_of(report.base, space)
    lines = []
    if report.gpu:
        lines.append(f"GPU: {report.gpu} ({report.arch}), torch {report.torch_version}; "
                     f"vs flash = flash time / candidate time (above 1.00 the candidate is faster)")
    widths = {a.name: max([len(a.name)] + [len(a.show(v)) for v in a.values]) for a in space.axes}
    nw = max([40] + [len(r.candidate.name) for r in report.results])
    head = (f"{'rank':>4}  {'name':<{nw}} " + " ".join(f"{n:>{w}}" for n, w in widths.items())
            + f" {'time us':>9} {'TFLOP/s':>8} {'vs flash':>8}")
    for case in report.options.cases if report.gpu else []:
        ranked = report.ranking(case)
        flash = report.flash.get(case)
        lines += ["", f"{case.label}: {len(ranked)} ranked; torch flash "
                      + (f"{flash:.1f} us, {case.tflops(flash):.1f} TFLOP/s" if flash else "unavailable"), head]
        for i, r in enumerate(ranked, 1):
            if top is not None and i > top and r.candidate.choice != base_choice:
                continue
            us = r.time(case)
            ratio = _ratio(flash, us)
            mark = "  (base)" if r.candidate.choice == base_choice else ""
            shown = space.shown(r.candidate.choice)
            lines.append(f"{i:>4}  {r.candidate.name:<{nw}} " + " ".join(f"{shown[n]:>{w}}" for n, w in widths.items())
                         + f" {us:>9.1f} {case.tflops(us):>8.1f} {f'{ratio:.2f}' if ratio else '-':>8}{mark}")
        if top is not None and len(ranked) > top:
            lines.append(f"      ... {len(ranked) - top} more in --json")
    lines += ["", "candidates:"] + [f"  {k:<28} {v:>5}" for k, v in report.counts().items()]
    failures = list(dict.fromkeys(r.compile.note for r in report.results
                                  if r.compile is not None and r.compile.status == COMPILE_FAILED and r.compile.note))
    if failures:   # nvcc's own words, so a failure that hits every candidate (a wrong --arch) says why
        lines += ["", "compile failures (nvcc):"] + [f"  {note}" for note in failures[:3]]
        if len(failures) > 3:
            lines.append(f"  ... {len(failures) - 3} more in --json")
    return "\n".join(lines)


def report_dict(report: SweepReport) -> dict:
    """Everything: space, options, counts, flash times, per-case rankings, every candidate."""
    def case_dict(case: Case) -> dict:
        return {"shape": list(shape_of(case)), "dtype": case.dtype, "causal": case.causal, "label": case.label}

    cases = []
    for case in report.options.cases if report.gpu else []:
        flash = report.flash.get(case)
        cases.append({**case_dict(case), "flash_us": flash, "ranking": [
            {"rank": i, "name": r.candidate.name, "median_us": r.time(case), "tflops": case.tflops(r.time(case)),
             "vs_flash": _ratio(flash, r.time(case))} for i, r in enumerate(report.ranking(case), 1)]})
    opts = report.options
    return {
        "base": report.base.name, "call": kind_of(report.base).calls, "gpu": report.gpu, "arch": report.arch,
        "torch": report.torch_version,
        "space": report.space.as_dict(),
        "options": {"search": opts.search, "budget": opts.budget, "seed": opts.seed, "generations": opts.generations,
                    "top_k": opts.top_k, "cases": [case_dict(c) for c in opts.cases]},
        "counts": report.counts(),
        "cases": cases,
        "candidates": [{"name": r.candidate.name, "fields": report.space.shown(r.candidate.choice),
                        "spec_hash": r.candidate.spec_hash, "outcome": r.outcome,
                        "compile": asdict(r.compile) if r.compile else None,
                        "results": [{**case_dict(c), "status": rec["status"], "median_us": rec["median_us"],
                                     "note": rec["note"]} for c, rec in r.records.items()]}
                       for r in report.results],
        "pruned": [{"name": candidate_name(report.base.name, p.choice.tag), "fields": report.space.shown(p.choice),
                    "reason": p.reason, "message": p.message}
                   for p in report.pruned if p.reason != NOT_SAMPLED],   # those only counted, as before
    }


def winners(report: SweepReport) -> dict[str, tuple[Candidate, list[Case]]]:
    """The fastest candidate of each case, grouped: name -> (candidate, the cases it won)."""
    out: dict[str, tuple[Candidate, list[Case]]] = {}
    for case in report.options.cases:
        ranked = report.ranking(case)
        if ranked:
            cand = ranked[0].candidate
            out.setdefault(cand.name, (cand, []))[1].append(case)
    return out


def best_spec_text(report: SweepReport, cand: Candidate, cases: list[Case], command: str) -> str:
    """A spec file for a winner: comment lines on where and how it won, then the spec."""
    result = next(r for r in report.results if r.candidate is cand)
    lines = [f"# attngen sweep winner over {report.base.name} on {report.gpu} ({report.arch}), "
             f"torch {report.torch_version}:"]
    for case in cases:
        us, flash = result.time(case), report.flash.get(case)
        ratio = _ratio(flash, us)
        vs = f"{ratio:.2f}x torch's flash backend ({flash:.1f} us)" if ratio else "torch's flash backend unavailable"
        lines.append(f"#   {case.label}: {us:.1f} us, {case.tflops(us):.1f} TFLOP/s, {vs}")
    lines.append(f"# command: {command}")
    data = spec_dict(cand.spec)
    data["description"] = (f"sweep winner over {report.base.name}: "
                           + ", ".join(f"{k} {v}" for k, v in report.space.shown(cand.choice).items()))
    return "\n".join(lines) + "\n" + spec_yaml(data)


def write_best(report: SweepReport, out_dir: str | Path, command: str) -> list[Path]:
    """DIR/<name>.yaml for the winner of each case, ready for `attngen build`; each file is written
    atomically, and a failed write is a WriteError."""
    out = fsutil.ensure_dir(out_dir)
    written = []
    for name, (cand, cases) in winners(report).items():
        path = out / f"{name}.yaml"
        fsutil.atomic_write_text(path, best_spec_text(report, cand, cases, command))
        written.append(path)
    return written
