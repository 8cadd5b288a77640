"""pytest plugin for running FlashAttention's tests/test_flash_attn.py against attngen (docs/fa-tests).

Loaded by run.sh as `-p attngen_fa_plugin`. It

- turns a refusal raised inside a test into a skip with reason "unsupported: <first line>": a
  NotImplementedError, a plain LookupError (not KeyError / IndexError), a ValueError saying "so far" or
  a TypeError saying "kernels take" (attngen's words for calls it does not serve yet), raised from
  attngen or the flash_attn stand-in (its traceback passes through either, or its message names
  attngen or starts with "unsupported: "); also where such a refusal is the cause or context of the
  test's failure (a pytest.raises(RuntimeError) that caught it). Anything else fails as usual;
- records per test: outcome (passed / failed / unsupported / skipped), the test function, the head
  dim `d` and dtype from its parameters, the reason, the duration;
- writes a JSON report (FA_REPORT, default $OUT/fa_report.json or ./fa_report.json) every
  FA_REPORT_EVERY seconds (30) and at the end: totals, a table test function x head dim of
  passed / failed / unsupported / skipped counts, the distinct unsupported reasons and failure
  messages with counts, and every test's record (up to 20,000 tests; FA_REPORT_TESTS=1 always,
  =0 never);
- prints that table at the end of the run (unless FA_PRINT_SUMMARY=0).

Other knobs: FA_SAMPLE=N keeps about one test in N (by a hash of its node id, so every function and
head dim keeps some); FA_FAKE_CAPABILITY=9.0 answers torch.cuda.get_device_capability on a machine
without CUDA, so the test file (which asks at import) collects there (`--collect-only` only).
Works under pytest-xdist (`-n 4`): the workers run and refuse, the controller records and writes.

`python3 attngen_fa_plugin.py REPORT.json` prints a report's table.
"""
from __future__ import annotations

import collections
import importlib.util
import json
import os
import signal
import sys
import time
import zlib

import pytest

OUTCOMES = ("passed", "failed", "unsupported", "skipped")
MAX_TESTS_LISTED = 20000    # the report lists every test's record up to this many (FA_REPORT_TESTS=1: always)
PREFIX = "unsupported: "

_state = {
    "started": time.time(), "collected": 0, "selected": 0, "records": {}, "last_write": 0.0,
    "interrupted": False, "worker": False,
}


# -- where refusals come from ------------------------------------------------------------------------

def _package_dir(name: str) -> str | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    return os.path.dirname(os.path.abspath(spec.origin)) + os.sep


_DIRS: list[str] = []


def _origin_dirs() -> list[str]:
    if not _DIRS:
        _DIRS.extend(d for d in (_package_dir("attngen"), _package_dir("flash_attn")) if d)
    return _DIRS


def _through_ours(exc: BaseException) -> bool:
    tb = exc.__traceback__
    dirs = _origin_dirs()
    while tb is not None:
        name = os.path.abspath(tb.tb_frame.f_code.co_filename)
        if any(name.startswith(d) for d in dirs):
            return True
        tb = tb.tb_next
    return False


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    line = text.splitlines()[0].strip() if text else type(exc).__name__
    return line[:300]


def refusal(exc: BaseException) -> str | None:
    """"unsupported: ..." where exc (or its cause / context, 4 deep) is attngen's or the stand-in's
    refusal of a call; None otherwise."""
    seen = 0
    while exc is not None and seen < 5:
        text = str(exc)
        kind = (isinstance(exc, NotImplementedError) or type(exc) is LookupError
                or (isinstance(exc, ValueError) and "so far" in text)
                or (isinstance(exc, TypeError) and "kernels take" in text))
        if kind and (text.startswith(PREFIX) or "attngen" in text or _through_ours(exc)):
            line = _first_line(exc)
            return line if line.startswith(PREFIX) else PREFIX + line
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


# -- hooks ------------------------------------------------------------------------------------------

def pytest_configure(config):
    _state["worker"] = hasattr(config, "workerinput")     # a pytest-xdist worker: its controller records
    fake = os.environ.get("FA_FAKE_CAPABILITY")
    if fake:
        import torch
        if not torch.cuda.is_available():
            major, _, minor = fake.partition(".")
            capability = (int(major), int(minor or 0))
            torch.cuda.get_device_capability = lambda *args, **kwargs: capability
    if hasattr(signal, "SIGTERM"):
        def _terminated(signum, frame):     # a time limit's SIGTERM: stop as Ctrl-C does (the report is written)
            _state["interrupted"] = True
            raise KeyboardInterrupt("SIGTERM")
        try:
            signal.signal(signal.SIGTERM, _terminated)
        except ValueError:      # not the main thread
            pass


def _param(params: dict, *names):
    for name in names:
        if name in params:
            return params[name]
    return None


def _shown(value) -> str | None:
    if value is None:
        return None
    return str(value).replace("torch.", "")


def pytest_itemcollected(item):
    _state["collected"] += 1


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    # last: after -k / -m deselected theirs. Each item carries its function, head dim and dtype in
    # user_properties, which its reports carry to where they are recorded (pytest-xdist's controller too).
    sample = int(os.environ.get("FA_SAMPLE", "1") or 1)
    if sample > 1:
        kept = [item for item in items if zlib.crc32(item.nodeid.encode()) % sample == 0]
        dropped = [item for item in items if zlib.crc32(item.nodeid.encode()) % sample != 0]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    for item in items:
        callspec = getattr(item, "callspec", None)
        params = dict(callspec.params) if callspec is not None else {}
        d = _param(params, "d", "headdim", "head_dim")
        item.user_properties.append(("fa_meta", {
            "function": getattr(item, "originalname", None) or item.name.split("[")[0],
            "d": None if d is None else int(d),
            "dtype": _shown(_param(params, "dtype")),
        }))
    _state["selected"] = len(items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    # pytest-xdist's controller collects nothing itself: each worker reports what it will run
    _state["selected"] = len(ids)
    _state["collected"] = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when != "call" or call.excinfo is None or not report.failed:
        return
    reason = refusal(call.excinfo.value)
    if reason is None:
        return
    # a skip whose reason starts with "unsupported: " (FlashAttention's own skips never do)
    report.outcome = "skipped"
    report.longrepr = (str(item.path), (item.location[1] or 0) + 1, "Skipped: " + reason)


def _crash(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None and getattr(crash, "message", None):
        text = crash.message
    else:
        text = str(report.longrepr)
    text = text.strip()
    return (text.splitlines()[0] if text else "")[:300]


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        text = str(longrepr[2])
    else:
        text = str(longrepr)
    return text[len("Skipped: "):] if text.startswith("Skipped: ") else text


def pytest_runtest_logreport(report):
    if _state["worker"]:
        return
    records = _state["records"]
    meta = dict(report.user_properties).get("fa_meta") or {
        "function": report.nodeid.split("::")[-1].split("[")[0], "d": None, "dtype": None}
    record = records.get(report.nodeid)
    if record is None:
        record = records[report.nodeid] = {"nodeid": report.nodeid, **meta, "outcome": None, "reason": None,
                                           "duration": 0.0}
    record["duration"] = round(record["duration"] + (report.duration or 0.0), 4)
    if report.when == "setup":
        if report.failed:
            record["outcome"], record["reason"] = "failed", "setup error: " + _crash(report)
        elif report.skipped:
            record["outcome"], record["reason"] = "skipped", _skip_reason(report)
    elif report.when == "call":
        if report.passed:
            record["outcome"] = "passed"
        elif report.skipped and _skip_reason(report).startswith(PREFIX):
            record["outcome"], record["reason"] = "unsupported", _skip_reason(report)
        elif report.skipped:
            record["outcome"], record["reason"] = "skipped", _skip_reason(report)
        else:
            record["outcome"], record["reason"] = "failed", _crash(report)
    elif report.when == "teardown":
        if report.failed and record["outcome"] in (None, "passed"):
            record["outcome"], record["reason"] = "failed", "teardown error: " + _crash(report)
        every = float(os.environ.get("FA_REPORT_EVERY", "30") or 30)
        if time.time() - _state["last_write"] >= every:
            write_report(complete=False)


def pytest_sessionfinish(session, exitstatus):
    if _state["worker"]:
        return
    write_report(complete=not _state["interrupted"] and exitstatus != pytest.ExitCode.INTERRUPTED,
                 exitstatus=int(exitstatus))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _state["worker"] and os.environ.get("FA_PRINT_SUMMARY", "1") != "0":
        terminalreporter.write_line("")
        for line in format_report(build_report()).splitlines():
            terminalreporter.write_line(line)


# -- the report -------------------------------------------------------------------------------------

def report_path() -> str:
    given = os.environ.get("FA_REPORT")
    if given:
        return given
    out = os.environ.get("OUT")
    return os.path.join(out, "fa_report.json") if out else os.path.join(os.getcwd(), "fa_report.json")


def _d_key(d) -> str:
    return "-" if d is None else str(d)


def build_report(complete: bool = False, exitstatus: int | None = None) -> dict:
    records = [r for r in _state["records"].values() if r["outcome"] is not None]
    totals = collections.Counter(r["outcome"] for r in records)
    table: dict = {}
    by_d: dict = {}
    for r in records:
        cell = table.setdefault(r["function"], {}).setdefault(_d_key(r["d"]), dict.fromkeys(OUTCOMES, 0))
        cell[r["outcome"]] += 1
        by_d.setdefault(_d_key(r["d"]), dict.fromkeys(OUTCOMES, 0))[r["outcome"]] += 1
    unsupported = collections.Counter(r["reason"] for r in records if r["outcome"] == "unsupported")
    failures = collections.Counter(r["reason"] for r in records if r["outcome"] == "failed")
    report = {
        "complete": complete,
        "exitstatus": exitstatus,
        "elapsed_s": round(time.time() - _state["started"], 1),
        "collected": _state["collected"],
        "selected": _state["selected"],
        "sample": int(os.environ.get("FA_SAMPLE", "1") or 1),
        "totals": {**{k: totals.get(k, 0) for k in OUTCOMES}, "run": len(records),
                   "not_run": max(0, _state["selected"] - len(records))},
        "table": {fn: dict(sorted(cells.items(), key=lambda kv: _sort_d(kv[0]))) for fn, cells in table.items()},
        "by_head_dim": dict(sorted(by_d.items(), key=lambda kv: _sort_d(kv[0]))),
        "unsupported_reasons": [{"reason": k, "count": n} for k, n in unsupported.most_common()],
        "failure_reasons": [{"reason": k, "count": n} for k, n in failures.most_common()],
    }
    tests = os.environ.get("FA_REPORT_TESTS", "")
    if tests == "1" or (tests != "0" and len(records) <= MAX_TESTS_LISTED):
        report["tests"] = records
    return report


def _sort_d(key: str):
    return (0, int(key)) if key.isdigit() else (1, 0)


def write_report(complete: bool = False, exitstatus: int | None = None) -> None:
    _state["last_write"] = time.time()
    path = report_path()
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w") as fh:
            report = build_report(complete, exitstatus)
            json.dump(report, fh, indent=1 if len(report.get("tests", ())) <= 2000 else None)
        os.replace(tmp, path)
    except OSError as exc:
        sys.stderr.write(f"attngen_fa_plugin: cannot write {path}: {exc}\n")


def format_report(report: dict, reasons: int = 25) -> str:
    """The report as text: totals, function x head dim counts (P passed, F failed, U unsupported,
    S skipped), the head dims over all functions, and the most frequent reasons."""
    t = report["totals"]
    lines = [f"attngen vs FlashAttention tests: {t['run']} run of {report['selected']} selected "
             f"({report['collected'] if report['collected'] is not None else '?'} collected{', sample 1/' + str(report['sample']) if report.get('sample', 1) > 1 else ''})"
             f": {t['passed']} passed, {t['failed']} failed, {t['unsupported']} unsupported, {t['skipped']} skipped"
             + ("" if report.get("complete") else f", {t['not_run']} not run (incomplete)")]
    dims = sorted({d for cells in report["table"].values() for d in cells}, key=_sort_d)
    if dims:
        width = max(len(fn) for fn in report["table"]) + 2
        lines.append("")
        lines.append("P/F/U/S per head dim (passed/failed/unsupported/skipped)")
        lines.append("function".ljust(width) + "".join(f"d={d}".rjust(16) for d in dims))
        for fn in sorted(report["table"]):
            cells = report["table"][fn]
            row = fn.ljust(width)
            for d in dims:
                c = cells.get(d)
                row += ("" if c is None else f"{c['passed']}/{c['failed']}/{c['unsupported']}/{c['skipped']}").rjust(16)
            lines.append(row)
        row = "all".ljust(width)
        for d in dims:
            c = report["by_head_dim"].get(d)
            row += ("" if c is None else f"{c['passed']}/{c['failed']}/{c['unsupported']}/{c['skipped']}").rjust(16)
        lines.append(row)
    for title, key in (("unsupported reasons", "unsupported_reasons"), ("failures", "failure_reasons")):
        items = report.get(key) or []
        if items:
            lines.append("")
            lines.append(f"{title} ({len(items)} distinct, top {min(reasons, len(items))}):")
            lines += [f"  {it['count']:6d}  {it['reason']}" for it in items[:reasons]]
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python3 attngen_fa_plugin.py REPORT.json")
    with open(sys.argv[1]) as fh:
        print(format_report(json.load(fh)))
