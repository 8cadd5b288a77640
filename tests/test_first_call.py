"""A process's first call with a warm cache: the dispatch table comes from its memo (never a memo
that fails the table's checks), a shipped spec's source from its committed generated file (never
a stale one), and `import attngen` loads no renderer."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import attngen.shipped
from attngen import fsutil
from attngen.ops import table
from attngen.ops.dispatch import SPECS_DIR
from attngen.render import render_spec_file
from attngen.render import render_bundle
from attngen.runtime.kernel import bundle_of, committed_bundle

ROOT = Path(__file__).resolve().parent.parent
TABLE = table.table_path(SPECS_DIR)
BUNDLE = "l4_bwd_d64"          # a served spec of three parts


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty user cache, and no table kept by this process."""
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(table, "_PARSED", {})
    return tmp_path / "cache"


def strict_entries():
    return table.parse_table(table.read_table_text(TABLE), str(TABLE))


def refuse_parsing(monkeypatch):
    def parse(*_):
        raise AssertionError("the table was parsed again")
    monkeypatch.setattr(table, "parse_table", parse)


def memo_file() -> Path:
    return table.memo_path(table.memo_key(table.read_table_text(TABLE)))


def test_the_memo_serves_a_later_process(cache, monkeypatch):
    entries = table.load_table(TABLE)
    assert memo_file().is_file()
    table._PARSED.clear()                 # as a new process
    refuse_parsing(monkeypatch)
    assert table.load_table(TABLE) == entries


def test_verify_leaves_the_tables_memo_for_the_next_process(cache, monkeypatch):
    """`attngen verify` parses the dispatch table once after its cases, so the first call after it reads the memo."""
    from attngen.cli.verify import memo_dispatch_table
    expected = strict_entries()
    assert not memo_file().exists()
    memo_dispatch_table()
    assert memo_file().is_file()
    table._PARSED.clear()                 # as a new process
    refuse_parsing(monkeypatch)
    assert table.load_table(TABLE) == expected


def test_verify_runs_on_when_the_table_does_not_load(cache, monkeypatch):
    """A table that does not load is the call's (and `attngen check`'s) to report: verify's memo step says nothing."""
    import importlib
    from attngen.errors import SpecError
    verify_cli = importlib.import_module("attngen.cli.verify")     # the package's `verify` is the click command

    def broken(_path):
        raise SpecError("specs/dispatch/table.yaml: not YAML")
    monkeypatch.setattr(table, "load_table", broken)
    verify_cli.memo_dispatch_table()
    assert not memo_file().exists()


def test_the_memo_holds_the_strict_entries(cache):
    table.load_table(TABLE)
    assert table.read_memo(table.memo_key(table.read_table_text(TABLE))) == strict_entries()


def test_the_process_keeps_the_table(cache, monkeypatch):
    entries = table.load_table(TABLE)
    memo_file().unlink()
    refuse_parsing(monkeypatch)
    assert table.load_table(TABLE) is entries


def _memo_with(entries_json, fields=None) -> str:
    key = table.memo_key(table.read_table_text(TABLE))
    return json.dumps({"format": table.MEMO_FORMAT, "key": key, "fields": fields or list(table.ENTRY_FIELDS),
                       "entries": entries_json})


def _good_rows() -> list:
    return json.loads(memo_file().read_text())["entries"]


def _with(row: list, **values) -> list:
    """A memo row with some fields' values changed."""
    return [values.get(name, value) for name, value in zip(table.ENTRY_FIELDS, row)]


def _hostile_memos() -> dict:
    """Memos a user-writable cache could hold, each of which must be ignored."""
    rows = _good_rows()
    first = dict(zip(table.ENTRY_FIELDS, rows[0]))
    other_spec = [_with(rows[0], spec="../../etc/passwd")] + rows[1:]
    bool_dim = [_with(rows[0], head_dim=True)] + rows[1:]
    # equal to earlier rows' values (0 == False, 64 == 64.0), and checked as what they are, not as those
    last = dict(zip(table.ENTRY_FIELDS, rows[-1]))
    false_pages = rows[:-1] + [_with(rows[-1], paged=0 if last["paged"] is False else 1.0)]
    float_dim = rows[:-1] + [_with(rows[-1], head_dim=float(last["head_dim"]))]
    nan_time = [_with(rows[0], us=float("nan"))] + rows[1:]
    unknown = [rows[0] + ["rm -rf /"]] + rows[1:]
    as_mapping = [first] + rows[1:]
    nested = [_with(rows[0], upto=[1])] + rows[1:]
    clash = rows + [_with(rows[0], spec=first["runner_up"] or "phase4")]
    deep = "[" * 1000 + "]" * 1000
    return {"garbage": "\x00not json", "not utf-8": b"\xff\xfe".decode("latin-1"), "deep": deep,
            "other key": json.dumps({"format": table.MEMO_FORMAT, "key": "0" * 64, "fields": list(table.ENTRY_FIELDS),
                                     "entries": rows}),
            "other fields": _memo_with([row[::-1] for row in rows], list(table.ENTRY_FIELDS)[::-1]),
            "bad spec": _memo_with(other_spec), "bool": _memo_with(bool_dim),
            "false for 0": _memo_with(false_pages), "a float dim": _memo_with(float_dim), "nan": _memo_with(nan_time),
            "unknown field": _memo_with(unknown), "an entry as a mapping": _memo_with(as_mapping),
            "a list value": _memo_with(nested), "two specs for a bucket": _memo_with(clash)}


def test_a_tampered_memo_is_ignored_and_rewritten(cache):
    strict = strict_entries()
    table.load_table(TABLE)
    key = table.memo_key(table.read_table_text(TABLE))
    for name, text in _hostile_memos().items():
        memo_file().write_bytes(text.encode("utf-8", "surrogateescape") if name != "not utf-8" else b"\xff\xfe")
        assert table.read_memo(key) is None, name   # refused itself, not only equal (False == 0, 64.0 == 64)
        table._PARSED.clear()
        assert table.load_table(TABLE) == strict, name
        assert table.read_memo(key) == strict, name


def test_a_memo_that_is_not_a_regular_file_is_ignored(cache):
    table.load_table(TABLE)
    memo = memo_file()
    memo.unlink()
    memo.mkdir()
    table._PARSED.clear()
    assert table.load_table(TABLE) == strict_entries()


def test_an_unwritable_cache_only_costs_a_parse(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(blocker))
    monkeypatch.setattr(table, "_PARSED", {})
    assert table.load_table(TABLE) == strict_entries()


# -- the committed source of a shipped spec ------------------------------------------------------

def rendered(path) -> tuple[str, ...]:
    return tuple(p.source for p in render_spec_file(path).parts)


def test_a_current_generated_file_is_the_rendered_source():
    path = SPECS_DIR / f"{BUNDLE}.yaml"
    plan, sources, label = committed_bundle(path)
    assert sources == rendered(path) and len(sources) == len(plan.parts) == 3
    assert render_bundle(path)[1] == sources


def test_a_spec_edited_since_build_is_rendered(shipped_copy):
    spec = shipped_copy / "specs" / f"{BUNDLE}.yaml"
    assert committed_bundle(spec) is not None
    spec.write_text(spec.read_text() + "# edited after the build\n")
    assert committed_bundle(spec) is None
    assert bundle_of(spec)[1] == rendered(spec)


def test_templates_or_code_changed_since_build_are_rendered(shipped_copy, monkeypatch):
    spec = shipped_copy / "specs" / f"{BUNDLE}.yaml"
    monkeypatch.setattr(attngen.shipped, "render_inputs", lambda: "0" * 64)
    assert committed_bundle(spec) is None
    assert bundle_of(spec)[1] == rendered(spec)


def test_an_edited_template_changes_the_render_inputs(tmp_path, monkeypatch):
    templates = tmp_path / "templates"
    shutil.copytree(attngen.shipped.TEMPLATES, templates)
    monkeypatch.setattr(attngen.shipped, "TEMPLATES", templates)
    attngen.shipped.render_inputs.cache_clear()
    try:
        before = attngen.shipped.render_inputs()
        lib = templates / "lib" / "prelude.j2"
        lib.write_text(lib.read_text() + "\n")
        attngen.shipped.render_inputs.cache_clear()
        assert attngen.shipped.render_inputs() != before
    finally:
        attngen.shipped.render_inputs.cache_clear()


def test_a_same_size_edit_with_its_mtime_put_back_is_read_again(tmp_path, monkeypatch):
    # the memo of the render inputs' digest is keyed by each file's stat: an in-place edit that keeps
    # the size and puts the mtime back (cp -p, touch -r, a write in one clock tick) still moves ctime
    templates = tmp_path / "templates"
    shutil.copytree(attngen.shipped.TEMPLATES, templates)
    monkeypatch.setattr(attngen.shipped, "TEMPLATES", templates)
    monkeypatch.setattr(attngen.shipped, "RACY_NS", 0)          # remember even a fresh file's digest
    lib = templates / "lib" / "prelude.j2"
    attngen.shipped.render_inputs.cache_clear()
    try:
        before = attngen.shipped.render_inputs()
        assert any((fsutil.cache_dir() / attngen.shipped.INPUTS_MEMO).iterdir())      # remembered
        st = lib.stat()
        text = lib.read_text()
        lib.write_text(text.replace("#", "/", 1) if "#" in text else "x" + text[1:])
        os.utime(lib, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert lib.stat().st_size == st.st_size and lib.stat().st_mtime_ns == st.st_mtime_ns
        attngen.shipped.render_inputs.cache_clear()
        assert attngen.shipped.render_inputs() != before
    finally:
        attngen.shipped.render_inputs.cache_clear()


def test_a_digest_is_not_remembered_while_an_input_is_fresh_from_an_edit(tmp_path, monkeypatch):
    templates = tmp_path / "templates"
    shutil.copytree(attngen.shipped.TEMPLATES, templates)       # every copy's ctime is now
    monkeypatch.setattr(attngen.shipped, "TEMPLATES", templates)
    memos = fsutil.cache_dir() / attngen.shipped.INPUTS_MEMO
    had = set(memos.iterdir()) if memos.is_dir() else set()
    attngen.shipped.render_inputs.cache_clear()
    try:
        attngen.shipped.render_inputs()
        assert (set(memos.iterdir()) if memos.is_dir() else set()) == had
    finally:
        attngen.shipped.render_inputs.cache_clear()


def test_a_hand_edited_generated_file_is_rendered(shipped_copy):
    spec = shipped_copy / "specs" / f"{BUNDLE}.yaml"
    part = render_spec_file(spec).plan.parts[1].file_name
    victim = shipped_copy / "generated" / part
    victim.write_text(victim.read_text().replace("\n", "\n// hand edit\n", 40))   # the header stays as it was
    assert committed_bundle(spec) is None
    assert bundle_of(spec)[1] == rendered(spec)


def test_a_garbage_manifest_means_rendering(shipped_copy):
    spec = shipped_copy / "specs" / f"{BUNDLE}.yaml"
    manifest = shipped_copy / "generated" / attngen.shipped.MANIFEST
    for text in ("{", "[]", json.dumps({"format": 1, "attngen": "0.1.0", "inputs": 3, "files": {}}), "[" * 5000):
        manifest.write_text(text)
        assert committed_bundle(spec) is None
    manifest.unlink()
    assert committed_bundle(spec) is None


def test_a_spec_outside_the_shipped_folder_is_rendered(tmp_path):
    spec = tmp_path / f"{BUNDLE}.yaml"
    shutil.copy(SPECS_DIR / spec.name, spec)
    assert committed_bundle(spec) is None


# -- imports -------------------------------------------------------------------------------------

def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sys.modules))"],
                         capture_output=True, text=True, cwd=ROOT, check=True)
    return set(out.stdout.split())


def test_import_attngen_loads_no_renderer_or_yaml():
    loaded = _modules_after("import attngen")
    assert not {"jinja2", "yaml", "pydantic", "attngen.render"} & loaded


def test_the_cached_call_path_loads_no_renderer():
    loaded = _modules_after("from attngen.ops.dispatch import DISPATCH\nfrom attngen.runtime.kernel import bundle_of\n"
                            f"DISPATCH.entries\nbundle_of(str(DISPATCH.specs_dir / '{BUNDLE}.yaml'))")
    assert "jinja2" not in loaded and "attngen.render" not in loaded
