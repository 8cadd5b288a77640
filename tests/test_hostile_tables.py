"""Hostile dispatch tables and reports: every table `attngen dispatch` could not serve from is
refused by `attngen check` and `attngen dispatch` in one line naming the file, the entry, its line
and the fix, with exit 2; a missing table is refused where one is needed; `dispatch --from` refuses a
malformed or too-deep report in one line and `--write` never writes what the table would refuse on
load. No nvcc, no GPU."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attngen.errors import SpecError
from attngen.ops.table import Entry, dump_table, load_table, table_expected, table_path
from hostile_helpers import SECONDS, assert_clean, error_lines, invoke

ROOT = Path(__file__).resolve().parents[1]


# -- a small project: one spec, its generated file, a table ------------------------------------

ENTRY = "{call: forward, arch: sm_89, dtype: fp16, head_dim: 64, mask: causal, spec: phase4"
GOOD = f"entries:\n  - {ENTRY}}}\n  - {ENTRY.replace('causal', 'none')}, us: 9.5, measured: r.json 1x8x512x64}}\n"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """specs/ holding phase4 and generated/ in sync with it, built once."""
    root = tmp_path_factory.mktemp("built")
    (root / "specs").mkdir()
    shutil.copy(ROOT / "specs" / "phase4.yaml", root / "specs")
    code, out, err, exc, _ = invoke(["build", "--specs-dir", root / "specs", "--out", root / "generated"])
    assert code == 0, err
    return root


@pytest.fixture
def project(built, tmp_path) -> Path:
    """A copy of `built` with the GOOD table in specs/dispatch/."""
    root = tmp_path / "project"
    shutil.copytree(built, root)
    (root / "specs" / "dispatch").mkdir()
    (root / "specs" / "dispatch" / "table.yaml").write_text(GOOD)
    return root


def check(root: Path, *args):
    return invoke(["check", "--specs-dir", root / "specs", "--generated", root / "generated", *args])


def dispatch(root: Path, *args):
    return invoke(["dispatch", "--specs-dir", root / "specs", "--arch", "sm_89", "--head-dim", "64", *args])


def test_the_small_project_passes(project):
    code, out, err, exc, _ = check(project)
    assert code == 0 and "2 dispatch entries" in out, out + err
    code, out, err, exc, _ = dispatch(project, "--causal")
    assert code == 0 and "-> phase4" in out, out + err


def test_the_committed_table_loads_and_round_trips(tmp_path):
    entries = load_table(table_path(ROOT / "specs"))
    path = tmp_path / "table.yaml"
    path.write_text(dump_table(entries, "header"))
    assert load_table(path) == entries


# -- hostile tables -------------------------------------------------------------------------------

def entry(extra: str = "", **replace) -> str:
    """One entry line of the table: ENTRY with `key: value` replaced and `extra` appended."""
    text = ENTRY
    for key, value in replace.items():
        old = next(part for part in text.strip("{").split(", ") if part.startswith(f"{key}:"))
        text = text.replace(old, f"{key}: {value}")
    return f"  - {text}{', ' + extra if extra else ''}}}\n"


def table(*entries: str) -> str:
    return "# a header\nentries:\n" + "".join(entries)


# name -> (table text, fragments the one error line must hold). Line numbers count the header.
HOSTILE_TABLES = {
    # the cases
    "two_specs_one_bucket": (table(entry(), entry(spec="other")),
                             [":4: entries[1]: ", "same calls as entries[0] (line 3)", "other, not phase4"]),
    "two_specs_one_bucket_upto": (table(entry("upto: 1024"), entry("upto: 1024", spec="other"), entry()),
                                  ["entries[1]", "other, not phase4", "keep"]),
    "head_dim_true": (table(entry(head_dim="true")), [":3: entries[0].head_dim: ", "(got True)"]),
    "head_dim_float": (table(entry(head_dim="64.0")), ["entries[0].head_dim: ", "(got 64.0)"]),
    "us_nan": (table(entry("us: .nan")), ["entries[0].us: ", "finite", "'.nan'", "leave `us` out"]),
    "us_inf": (table(entry("us: .inf")), ["entries[0].us: ", "'.inf'"]),
    "us_overflow": (table(entry("us: 1.0e999")), ["entries[0].us: ", "inf"]),
    "us_negative": (table(entry("us: -1.5")), ["entries[0].us: ", "-1.5"]),
    "us_text": (table(entry("us: fast")), ["entries[0].us: ", "'fast'"]),
    "us_bool": (table(entry("us: true")), ["entries[0].us: ", "True"]),
    "runner_up_us_text": (table(entry("runner_up: phase4, runner_up_us: slow")), ["entries[0].runner_up_us: "]),
    "upto_negative": (table(entry("upto: -1")), ["entries[0].upto: ", "(got -1)", "leave `upto` out"]),
    "upto_zero": (table(entry("upto: 0")), ["entries[0].upto: ", "(got 0)"]),
    "upto_quoted": (table(entry('upto: "4096"')), ["entries[0].upto: ", "'4096'", "without quotes"]),
    "upto_octal": (table(entry("upto: 0100")), ["entries[0].upto: ", "'0100'", "octal", "write 64"]),
    "upto_underscore": (table(entry("upto: 4_096")), ["entries[0].upto: ", "'4_096'"]),
    "upto_5000_digits": (table(entry("upto: " + "9" * 5000)), [":3: ", "5000 digits"]),
    "upto_huge": (table(entry("upto: 999999999999999999")), ["entries[0].upto: ", "larger than any call"]),
    "paged_int": (table(entry("paged: 1")), ["entries[0].paged: ", "true or false", "(got 1)"]),
    "paged_text": (table(entry("paged: yes")), ["entries[0].paged: ", "true or false"]),
    "min_rows_list": (table(entry("min_rows: [1]")), ["entries[0].min_rows: ", "[1]"]),
    "spec_parent_path": (table(entry(spec="../elsewhere/x")), ["entries[0].spec: ", "bare name", "'../elsewhere/x'"]),
    "spec_absolute": (table(entry(spec="/etc/x")), ["entries[0].spec: ", "'/etc/x'"]),
    "spec_dotdot": (table(entry(spec="a..b")), ["entries[0].spec: "]),
    "spec_backslash": (table(entry(spec='"a\\\\b"')), ["entries[0].spec: "]),
    "spec_hidden": (table(entry(spec=".hidden")), ["entries[0].spec: "]),
    "spec_number": (table(entry(spec="5")), ["entries[0].spec: ", "must be text (got 5)"]),
    "spec_null": (table(entry(spec="null")), ["entries[0].spec: ", "required"]),
    "runner_up_path": (table(entry("runner_up: ../x, runner_up_us: 1.0")), ["entries[0].runner_up: ", "'../x'"]),
    "call_unknown": (table(entry(call="sideways")), ["entries[0].call: ", "'sideways'", "forward"]),
    "arch_newline": (table(entry(arch='"sm_89\\nattngen: all good"')), ["entries[0].arch: ", "\\n"]),
    "mask_bidi": (table(entry(mask='"causal\\u202e"')), ["entries[0].mask: "]),
    "measured_newline": (table(entry('measured: "r.json\\u2028x"')), ["entries[0].measured: ", "one line"]),
    "measured_huge": (table(entry("measured: " + "x" * 2000)), ["entries[0].measured: ", "at most 1000"]),
    "scores_unknown_form": (table(entry("scores: soft cap")), ["entries[0].scores: "]),
    "missing_spec": (table("  - {call: forward, arch: sm_89, dtype: fp16, head_dim: 64, mask: causal}\n"),
                     ["entries[0]: missing key(s) spec"]),
    "unknown_key": (table(entry("fastest: yes")), ["entries[0]: unknown key(s) fastest"]),
    # YAML-level
    "key_twice": (table(entry("spec: other")), [":3: entries[0].spec: key given twice"]),
    "deep_flow": ("entries: " + "[" * 100000 + "]" * 100000 + "\n", ["nested more than"]),
    "deep_block": ("entries:\n" + "".join("  " * i + "- \n" for i in range(50)), ["nested more than"]),
    "anchor_alias": ("base: &b {call: forward}\nentries:\n  - *b\n", ["anchors, aliases and tags"]),
    "tag": (table("  - !!python/object:os.system {}\n"), ["anchors, aliases and tags"]),
    "not_yaml": ("entries: [\n", ["not valid YAML"]),
    "nul_byte": ("entries: []\n\x00\n", ["not valid YAML"]),
    "empty": ("", ["list under `entries`"]),
    "top_level_list": ("- a\n", ["list under `entries`"]),
    "entries_mapping": ("entries: {a: 1}\n", ["list under `entries`"]),
    "entry_scalar": (table("  - phase4\n"), ["entries[0]: each entry is a mapping"]),
    "top_level_extra": ("entries: []\nspec: phase4\n", [":2: ", "unknown top-level key spec"]),
    "not_utf8": (b"entries: []\n# \xff\n", ["not UTF-8", "0xff"]),
}


def write_table(root: Path, content) -> Path:
    path = table_path(root / "specs")
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


@pytest.mark.parametrize("command", ["check", "dispatch"])
@pytest.mark.parametrize("name", sorted(HOSTILE_TABLES))
def test_hostile_table(project, name, command):
    content, fragments = HOSTILE_TABLES[name]
    path = write_table(project, content)
    line = assert_clean(*(check(project) if command == "check" else dispatch(project, "--causal")))
    assert line.startswith(str(path)), line       # names the file (and the line, where there is one)
    for fragment in fragments:
        assert fragment in line[len(str(path)):], (fragment, line)
    with pytest.raises(SpecError):
        load_table(path)


@pytest.mark.parametrize("name", ["key_twice", "not_utf8", "missing"])
def test_check_json_reports_a_refused_table(project, name):
    """Before: `check --json` printed the refusal on stderr and no JSON; now the report holds it
    among its errors, and the exit code is still 2."""
    path = table_path(project / "specs")
    if name == "missing":
        path.unlink()
    else:
        write_table(project, HOSTILE_TABLES[name][0])
    code, out, err, exc, _ = check(project, "--json")
    assert code == 2 and "Traceback" not in out + err, (code, out, err)
    report = json.loads(out)
    assert report["ok"] is False and report["dispatch"] == [] and report["in_sync"]
    (error,) = report["errors"]
    assert error["spec"] == str(path) and error_lines(err) == [error["error"]], (error, err)
    assert error["error"].startswith(str(path))
    if name == "key_twice":
        assert error["line"] == 3 and error["key"] == "entries[0].spec" and "key given twice" in error["message"]


def test_same_spec_twice_in_a_bucket_is_no_conflict(project):
    write_table(project, table(entry(), entry("us: 9.0, measured: r.json 1x8x512x64")))
    assert check(project)[0] == 0


def test_a_runner_up_without_its_time_is_shown_not_a_traceback(project):
    write_table(project, table(entry("us: 9.5, measured: r.json x, runner_up: phase4")))
    code, out, err, exc, _ = dispatch(project, "--causal")
    assert code == 0 and "runner-up phase4" in out, out + err


# -- a missing table --------------------------------------------------------------------------------

def test_a_missing_table_is_refused_where_its_folder_is(project):
    path = table_path(project / "specs")
    path.unlink()
    line = assert_clean(*check(project))
    assert line.startswith(f"{path}: there is no dispatch table") and "git checkout" in line, line
    line = assert_clean(*dispatch(project, "--causal"))
    assert "there is no dispatch table" in line, line


def test_a_dangling_table_link_is_refused(project):
    path = table_path(project / "specs")
    path.unlink()
    shutil.rmtree(path.parent)                 # no dispatch/ folder: only the link says a table was meant
    path.parent.mkdir()
    path.symlink_to(project / "nowhere.yaml")
    line = assert_clean(*check(project))
    assert "there is no dispatch table" in line, line


@pytest.mark.parametrize("kind", ["directory", "fifo", "device"])
def test_a_table_that_is_not_a_regular_file(project, kind):
    path = table_path(project / "specs")
    path.unlink()
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)                         # no writer: a blocking read would never return
    else:
        path.symlink_to("/dev/zero")            # reads without end
    line = assert_clean(*check(project))
    assert line.startswith(str(path)) and "not a regular file" in line, line


def test_the_served_specs_folder_must_have_its_table(built, tmp_path, monkeypatch):
    """A folder of specs alone (a test's, another project's) needs no table; the folder
    attngen.attention serves does, whether or not its dispatch/ folder is left."""
    root = tmp_path / "served"
    shutil.copytree(built, root)
    assert not table_expected(root / "specs") and check(root)[0] == 0
    import attngen.shipped
    monkeypatch.setattr(attngen.shipped, "shipped", lambda name: root / name)
    assert table_expected(root / "specs")
    line = assert_clean(*check(root))
    assert "there is no dispatch table" in line, line


def test_the_repository_specs_expect_a_table():
    assert table_expected(ROOT / "specs")


# -- dispatch --from: hostile reports ----------------------------------------------------------------

def bench_report(impl="phase4", us=9.5, label="1x8x512x64", **case) -> dict:
    """A forward `attngen bench --json` report of one cell, made by hand."""
    c = {"batch": 1, "heads": 8, "seqlen": 512, "head_dim": 64, "dtype": "fp16", "causal": True, **case}
    return {"gpu": "NVIDIA L4", "results": [{"case": c, "label": label,
                                             "timings": [{"impl": impl, "median_us": us, "status": "ok"},
                                                         {"impl": "sdpa:flash", "median_us": 5.0, "status": "ok"}]}]}


def sweep_report(name="phase4") -> dict:
    return {"gpu": "NVIDIA L4", "arch": "sm_89", "cases": [
        {"shape": [1, 8, 512, 64], "dtype": "fp16", "causal": True, "label": "1x8x512x64",
         "ranking": [{"name": name, "median_us": 9.5}]}]}


def text_of(report) -> str:
    return report if isinstance(report, str) else json.dumps(report)


# name -> (report text or dict, fragments the one error line must hold)
HOSTILE_REPORTS = {
    "not_json": ("{not json", ["Expecting property name"]),
    "empty": ("", ["Expecting value"]),
    "deep_100000": ("[" * 100000 + "]" * 100000, ["nested more than 64 levels"]),
    "deep_objects": ('{"a":' * 100000 + "1" + "}" * 100000, ["nested more than 64 levels"]),
    "brackets_in_strings_do_not_nest": (json.dumps({"gpu": "[" * 1000, "results": []}), ["no arch known"]),
    "a_list": ("[1, 2]", ["a JSON list, not an object"]),
    "a_number": ("5", ["a JSON int, not an object"]),
    "no_gpu": ({"results": []}, ["no 'gpu'"]),
    "unknown_gpu": (bench_report() | {"gpu": "Voodoo 2"}, ["no arch known for GPU 'Voodoo 2'"]),
    "gpu_number": (bench_report() | {"gpu": 5}, ["gpu must be text"]),
    "results_mapping": (bench_report() | {"results": {"a": 1}}, ["not an `attngen bench --json`"]),
    "case_list": ({"gpu": "NVIDIA L4", "results": [{"case": [1], "label": "x", "timings": []}]},
                  ["not an `attngen bench --json`"]),
    "seqlen_text": (bench_report(seqlen="512"), ["seqlen must be an integer", "'512'"]),
    "seqlen_bool": (bench_report(seqlen=True), ["seqlen must be an integer"]),
    "seqlen_negative": (bench_report(seqlen=-4), ["seqlen must be an integer"]),
    "seqlen_float": (bench_report(seqlen=512.5), ["seqlen must be an integer"]),
    "huge_integer": ('{"gpu": "NVIDIA L4", "results": [{"case": {"seqlen": ' + "9" * 5000 + "}}]}",
                     ["5000 digits"]),
    "causal_text": (bench_report(causal="yes"), ["causal must be true or false"]),
    "median_text": (bench_report(us="fast"), ["median_us must be a positive number", "'fast'"]),
    "median_nan": (text_of(bench_report()).replace("9.5", "NaN"), ["NaN is not a time"]),
    "median_infinity": (text_of(bench_report()).replace("9.5", "Infinity"), ["Infinity is not a time"]),
    "median_overflow": (text_of(bench_report()).replace("9.5", "1e999"), ["median_us", "inf"]),
    "median_negative": (bench_report(us=-1.0), ["median_us"]),
    "spec_path": (bench_report(impl="../elsewhere/x"), ["1x8x512x64: spec: ", "bare name", "nothing was written"]),
    "spec_absolute": (bench_report(impl="/tmp/x"), ["spec: ", "'/tmp/x'"]),
    "label_newline": (bench_report(label="1x8\nattngen: all good"), ["measured: ", "one line"]),
    "sweep_spec_path": (sweep_report("../elsewhere/x"), ["spec: ", "'../elsewhere/x'"]),
    "sweep_shape_text": (sweep_report() | {"cases": [{"shape": ["1", 8, 512, 64], "ranking": [{"name": "x",
                                                                                              "median_us": 1.0}]}]},
                         ["shape must be an integer"]),
    "varlen_lengths_text": ({"gpu": "NVIDIA L4", "lengths": ["a"], "rows": []}, ["lengths must be an integer"]),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_REPORTS))
def test_hostile_report(project, tmp_path, name):
    report, fragments = HOSTILE_REPORTS[name]
    path = tmp_path / "report.json"
    path.write_text(text_of(report))
    (project / "elsewhere").mkdir()
    (project / "elsewhere" / "x.yaml").write_text("outside the specs folder")   # "not in specs/" cannot refuse it
    before = table_path(project / "specs").read_bytes()
    line = assert_clean(*dispatch(project, "--from", path, "--write"))
    for fragment in fragments:
        assert fragment in line.replace(str(path), "REPORT"), (fragment, line)
    assert table_path(project / "specs").read_bytes() == before


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_report_that_is_not_a_regular_file(project, tmp_path, kind):
    path = tmp_path / "report.json"
    path.mkdir() if kind == "directory" else os.mkfifo(path)
    code, out, err, exc, seconds = dispatch(project, "--from", path, "--write")
    assert code == 2 and "Traceback" not in err and seconds < SECONDS, err


def test_a_good_report_is_written_and_loads(project, tmp_path):
    path = tmp_path / "report.json"
    path.write_text(json.dumps(bench_report(us=8.25)))
    code, out, err, exc, _ = dispatch(project, "--from", path, "--write")
    assert code == 0, out + err
    written = load_table(table_path(project / "specs"))
    assert [e.us for e in written if e.mask == "causal"] == [8.2]
    assert check(project)[0] == 0


def test_write_refuses_what_load_refuses():
    for bad in (Entry("forward", "sm_89", "fp16", 64, "causal", "../elsewhere/x"),
                Entry("forward", "sm_89", "fp16", 64, "causal", "phase4", us=float("inf")),
                Entry("forward", "sm_89", "fp16", 64, "causal", "phase4", upto=-1),
                Entry("forward", "sm_89", "fp16", True, "causal", "phase4")):
        with pytest.raises(SpecError):
            dump_table([bad], "header")
    two = [Entry("forward", "sm_89", "fp16", 64, "causal", "phase4"),
           Entry("forward", "sm_89", "fp16", 64, "causal", "other")]
    with pytest.raises(SpecError, match="same calls"):
        dump_table(two, "header")


# -- what a user sees ---------------------------------------------------------------------------------

def _run(args, cwd):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "attngen", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=60)


def test_deep_table_and_report_in_a_real_process(project, tmp_path):
    # CliRunner catches exceptions itself; a real process shows exactly what a user sees.
    report = tmp_path / "deep.json"
    report.write_text("[" * 100000 + "]" * 100000)
    run = _run(["dispatch", "--specs-dir", project / "specs", "--from", report, "--write"], tmp_path)
    assert run.returncode == 2 and "Traceback" not in run.stderr and len(error_lines(run.stderr)) == 1, run.stderr
    write_table(project, HOSTILE_TABLES["deep_flow"][0])
    run = _run(["check", "--specs-dir", project / "specs", "--generated", project / "generated"], tmp_path)
    assert run.returncode == 2 and "Traceback" not in run.stderr and len(error_lines(run.stderr)) == 1, run.stderr
