"""Prebuilt cubins (attngen/runtime/prebuilt.py and wheel_backend.py write them, attngen/compile.py reads them): a wheel's store answers
compile_source with an empty user cache and no nvcc; a stale or tampered entry is a miss that falls
through to the usual path; the build hook prebuilds only for a wheel, with nvcc, off CI.

A stand-in nvcc (test_hostile_cache.FakeNvcc: small, well-formed cubins) builds the stores; the test
marked `nvcc` builds and loads a real one."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from attngen import compile as compile_mod
from attngen.runtime import prebuilt
from attngen.runtime import wheel_backend as build_backend
from attngen.compile import CompileJob, compile_many, compile_source
from attngen.errors import ToolError
from attngen.shipped import PREBUILT_ENV
from hostile_helpers import use_fake_nvcc
from test_hostile_cache import FAKE_SOURCE, WIDER_SOURCE, FakeNvcc

ROOT = Path(__file__).resolve().parent.parent
SOURCES = {"t": FAKE_SOURCE, "wider": WIDER_SOURCE.replace("attngen_t_none", "attngen_w_none")}


def _store(folder: Path, sources=SOURCES, arch="sm_89") -> Path:
    """A store of `sources` (label -> source) built by the stand-in nvcc."""
    fake = FakeNvcc()
    prebuilt.write_store(folder, [(label, src, fake(src, arch, "nvcc")) for label, src in sources.items()])
    return folder


def _no_nvcc(monkeypatch, tmp_path):
    """No nvcc anywhere (find_nvcc fails as it does without a toolkit; running one fails the test) and an
    empty user cache."""
    def missing():
        raise ToolError("nvcc not found: install the CUDA toolkit and put its bin/ on PATH (or set CUDA_HOME)")

    def ran(*args):
        raise AssertionError("nvcc ran")
    monkeypatch.setattr(compile_mod, "find_nvcc", missing)
    monkeypatch.setattr(compile_mod, "run_nvcc", ran)
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path / "empty-cache"))


@pytest.fixture
def store(tmp_path, monkeypatch):
    folder = _store(tmp_path / "prebuilt")
    monkeypatch.setenv(PREBUILT_ENV, str(folder))
    _no_nvcc(monkeypatch, tmp_path)
    return folder


def _cubin_of(folder: Path, source: str, arch="sm_89") -> Path:
    return folder / arch / f"{compile_mod.prebuilt_key(source, arch)}.cubin"


def test_a_prebuilt_cubin_answers_with_no_cache_and_no_nvcc(store):
    for source in SOURCES.values():
        result = compile_source(source, "sm_89")
        assert result.cached
        assert result.cubin == _cubin_of(store, source).read_bytes()
        assert result.functions == FakeNvcc()(source, "sm_89", "nvcc").functions
    assert not any((Path(compile_mod.cache_dir())).glob("*")), "a prebuilt hit writes nothing to the user cache"


def test_a_batch_the_store_answers_needs_no_nvcc(store):
    batch = compile_many([CompileJob(src, "sm_89", label) for label, src in SOURCES.items()], progress=False)
    assert batch.cached == len(SOURCES) and not batch.errors


def test_a_batch_with_a_source_the_store_lacks_needs_nvcc(store):
    jobs = [CompileJob(FAKE_SOURCE, "sm_89"), CompileJob(FAKE_SOURCE + "// changed\n", "sm_89")]
    with pytest.raises(ToolError, match="nvcc not found"):
        compile_many(jobs, progress=False)


def test_a_stale_entry_is_never_loaded(store):
    """The source changed since the wheel was built: a miss, so the usual path runs (here: no nvcc)."""
    changed = FAKE_SOURCE.replace("int n;", "int n;  ")
    assert compile_mod.prebuilt_result(changed, "sm_89") is None
    with pytest.raises(ToolError) as exc:
        compile_source(changed, "sm_89")
    assert str(exc.value).startswith("nvcc not found") and "\n" not in str(exc.value)


def test_another_arch_is_a_miss(store):
    assert compile_mod.prebuilt_result(FAKE_SOURCE, "sm_90") is None
    assert compile_mod.prebuilt_result(FAKE_SOURCE, "sm_89") is not None


def test_a_tampered_cubin_is_never_loaded(store):
    path = _cubin_of(store, FAKE_SOURCE)
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    assert compile_mod.prebuilt_result(FAKE_SOURCE, "sm_89") is None
    with pytest.raises(ToolError, match="nvcc not found"):
        compile_source(FAKE_SOURCE, "sm_89")


def _edit_entry(folder: Path, source: str, **fields) -> None:
    index_path = folder / "sm_89" / compile_mod.STORE_INDEX
    index = json.loads(index_path.read_text())
    index["entries"][compile_mod.prebuilt_key(source, "sm_89")].update(fields)
    index_path.write_text(json.dumps(index))


def test_another_sources_cubin_with_its_hash_in_the_index_is_never_loaded(store):
    """A cubin whose sha256 the index records but which is not this source's (its kernels and
    Params differ) fails the user cache's own checks."""
    other = _cubin_of(store, SOURCES["wider"]).read_bytes()
    _cubin_of(store, FAKE_SOURCE).write_bytes(other)
    _edit_entry(store, FAKE_SOURCE, cubin_sha256=prebuilt._sha256(other))
    assert compile_mod.prebuilt_result(FAKE_SOURCE, "sm_89") is None


def test_an_entry_for_another_source_hash_is_never_loaded(store):
    _edit_entry(store, FAKE_SOURCE, source_sha256="0" * 64)
    assert compile_mod.prebuilt_result(FAKE_SOURCE, "sm_89") is None


def test_an_edited_report_is_never_loaded(store):
    index = json.loads((store / "sm_89" / compile_mod.STORE_INDEX).read_text())
    report = index["entries"][compile_mod.prebuilt_key(FAKE_SOURCE, "sm_89")]["report"]
    _edit_entry(store, FAKE_SOURCE, report=[{**report[0], "registers": 32}])
    assert compile_mod.prebuilt_result(FAKE_SOURCE, "sm_89") is None


@pytest.mark.parametrize("index", ["", "not json", "[]", '{"format": 99, "entries": {}}', "[" * 100000])
def test_a_broken_index_is_no_store(store, index):
    (store / "sm_89" / compile_mod.STORE_INDEX).write_text(index)
    assert compile_mod.prebuilt_result(FAKE_SOURCE, "sm_89") is None


def test_no_store_is_a_miss(tmp_path, monkeypatch):
    monkeypatch.setenv(PREBUILT_ENV, str(tmp_path / "nowhere"))
    assert compile_mod.prebuilt_result(FAKE_SOURCE, "sm_89") is None


def test_the_key_holds_flags_and_cache_format_but_not_the_nvcc_version(monkeypatch):
    key = compile_mod.prebuilt_key(FAKE_SOURCE, "sm_89")
    monkeypatch.setattr(compile_mod, "nvcc_version", lambda nvcc: "99.9")
    assert compile_mod.prebuilt_key(FAKE_SOURCE, "sm_89") == key
    monkeypatch.setattr(compile_mod, "NVCC_FLAGS", compile_mod.NVCC_FLAGS + ("-G",))
    assert compile_mod.prebuilt_key(FAKE_SOURCE, "sm_89") != key
    monkeypatch.undo()
    monkeypatch.setattr(compile_mod, "CACHE_FORMAT", compile_mod.CACHE_FORMAT + 1)
    assert compile_mod.prebuilt_key(FAKE_SOURCE, "sm_89") != key


def test_build_store_compiles_in_parallel_and_writes_what_compiled(tmp_path, monkeypatch):
    fake = use_fake_nvcc(monkeypatch, tmp_path, FakeNvcc())
    monkeypatch.setattr(compile_mod, "_source_name_flags", lambda nvcc, arch: ())
    broken = "this is no kernel"
    jobs = [CompileJob(src, "sm_89", label) for label, src in SOURCES.items()] + [CompileJob(broken, "sm_8x", "bad")]
    written, failed = prebuilt.build_store(tmp_path / "store", jobs=jobs, say=lambda line: None)
    assert (written, fake.calls) == (2, 2)
    assert len(failed) == 1 and failed[0].startswith("bad (sm_8x)")
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == ["sm_89", "tables"]   # and the table, prepared


def test_served_jobs_are_what_warm_compiles():
    jobs = prebuilt.served_jobs(("sm_89",))        # sm_90's 115 specs take seconds to plan
    assert {j.arch for j in jobs} == {"sm_89"}
    assert len({(j.source, j.arch) for j in jobs}) == len(jobs)
    assert any(j.label == "l4_mma_d64" and j.arch == "sm_89" for j in jobs)


def test_the_package_store_is_git_ignored():
    if not shutil.which("git") or not (ROOT / ".git").exists():
        pytest.skip("needs the git checkout")
    probe = "attngen/prebuilt/sm_89/index.json"
    assert subprocess.run(["git", "check-ignore", "-q", probe], cwd=ROOT).returncode == 0


# -- the build hook -----------------------------------------------------------------------------

def _has_nvcc(name):
    return "/opt/cuda/bin/nvcc"


def test_the_hook_prebuilds_only_for_a_wheel_with_nvcc_off_ci():
    reason = build_backend.skip_reason
    assert reason(environ={}, which=_has_nvcc) is None
    assert reason(editable=True, environ={}, which=_has_nvcc) == "an editable install"
    assert reason(environ={"ATTNGEN_PREBUILD": "0"}, which=_has_nvcc) == "ATTNGEN_PREBUILD=0"
    assert "CI" in reason(environ={"CI": "true"}, which=_has_nvcc)
    assert reason(environ={"CI": "true", "ATTNGEN_PREBUILD": "1"}, which=_has_nvcc) is None
    assert reason(environ={"ATTNGEN_PREBUILD": "1"}, which=lambda name: None) == "no nvcc on PATH"


def test_without_nvcc_the_wheel_builds_without_cubins_and_says_so(tmp_path):
    stale = tmp_path / "attngen" / "prebuilt" / "sm_89"
    stale.mkdir(parents=True)
    (stale / "index.json").write_text("{}")
    lines = []
    assert build_backend.prebuild(tmp_path, environ={}, which=lambda name: None, say=lines.append) == 0
    assert not (tmp_path / "attngen" / "prebuilt").exists(), "an earlier build's store is not shipped"
    assert len(lines) == 1 and "no nvcc on PATH" in lines[0]


def test_an_editable_install_prebuilds_nothing_and_says_nothing(tmp_path):
    lines = []
    assert build_backend.prebuild(tmp_path, editable=True, environ={}, which=_has_nvcc, say=lines.append) == 0
    assert lines == [] and not (tmp_path / "attngen" / "prebuilt").exists()


def test_ci_prebuilds_nothing(tmp_path):
    lines = []
    assert build_backend.prebuild(tmp_path, environ={"CI": "true"}, which=_has_nvcc, say=lines.append) == 0
    assert len(lines) == 1 and "CI" in lines[0]


def test_a_prebuilding_wheel_asks_for_the_dependencies_rendering_needs(monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(build_backend._setuptools, "get_requires_for_build_wheel", lambda settings=None: [])
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("ATTNGEN_PREBUILD", raising=False)
    monkeypatch.setattr(build_backend.shutil, "which", _has_nvcc)
    assert any(r.startswith("pydantic") for r in build_backend.get_requires_for_build_wheel())
    monkeypatch.setenv("ATTNGEN_PREBUILD", "0")
    assert build_backend.get_requires_for_build_wheel() == []


def test_the_hook_writes_a_store_the_lookup_reads(tmp_path, monkeypatch):
    use_fake_nvcc(monkeypatch, tmp_path, FakeNvcc())
    monkeypatch.setattr(compile_mod, "_source_name_flags", lambda nvcc, arch: ())
    jobs = [CompileJob(src, "sm_89", label) for label, src in SOURCES.items()]
    monkeypatch.setattr(prebuilt, "served_jobs", lambda archs=prebuilt.ARCHS, specs_dir=None: jobs)
    lines = []
    assert build_backend.prebuild(tmp_path / "lib", environ={}, which=_has_nvcc, say=lines.append) == 2
    assert lines[-1] == "attngen: the wheel carries 2 prebuilt cubins"
    monkeypatch.setenv(PREBUILT_ENV, str(tmp_path / "lib" / "attngen" / "prebuilt"))
    _no_nvcc(monkeypatch, tmp_path)
    assert compile_source(FAKE_SOURCE, "sm_89").cached


@pytest.mark.nvcc
def test_a_real_prebuilt_cubin_of_phase4_loads_without_nvcc(tmp_path, monkeypatch):
    from attngen.runtime.kernel import bundle_of
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path / "build-cache"))
    plan, sources, _label = bundle_of(str(ROOT / "specs" / "phase4.yaml"))
    jobs = compile_mod.bundle_jobs(plan, sources, "sm_89", "phase4")
    written, failed = prebuilt.build_store(tmp_path / "store", jobs=jobs, say=lambda line: None)
    assert (written, failed) == (len(jobs), [])
    built = [compile_source(j.source, j.arch) for j in jobs]       # the build cache's entries
    monkeypatch.setenv(PREBUILT_ENV, str(tmp_path / "store"))
    _no_nvcc(monkeypatch, tmp_path)
    for job, made in zip(jobs, built):
        loaded = compile_source(job.source, job.arch)
        assert (loaded.cubin, loaded.functions, loaded.log) == (made.cubin, made.functions, made.log)
        assert loaded.cached


# -- the dispatch table, prepared when the wheel is built ------------------------------------------

def _prepared_table(tmp_path, monkeypatch):
    """A store holding the shipped table's memo; an empty user cache; (table path, its entries)."""
    from attngen.ops import table
    from attngen.ops.dispatch import SPECS_DIR
    monkeypatch.setenv(PREBUILT_ENV, str(tmp_path / "store"))
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(table, "_PARSED", {})
    path = table.table_path(SPECS_DIR)
    prebuilt.write_table_memo(tmp_path / "store")
    return table, path, table.parse_table(path.read_text(), str(path))


def test_a_prepared_table_is_read_without_parsing_yaml(tmp_path, monkeypatch):
    table, path, entries = _prepared_table(tmp_path, monkeypatch)
    monkeypatch.setattr(table, "parse_table", lambda *a: pytest.fail("parsed the YAML"))
    monkeypatch.setattr(table, "write_memo", lambda *a, **k: pytest.fail("wrote a user memo"))
    assert table.load_table(path) == entries


@pytest.mark.parametrize("damage", ["garbage", "other spec"])
def test_a_damaged_prepared_table_is_parsed_instead(tmp_path, monkeypatch, damage):
    table, path, entries = _prepared_table(tmp_path, monkeypatch)
    (memo,) = (tmp_path / "store" / table.TABLES).iterdir()
    if damage == "garbage":
        memo.write_text("{not json")
    else:
        data = json.loads(memo.read_text())
        data["entries"][0][table.ENTRY_FIELDS.index("spec")] = "../elsewhere/x"
        memo.write_text(json.dumps(data))
    parsed = []
    real = table.parse_table
    monkeypatch.setattr(table, "parse_table", lambda *a: parsed.append(1) or real(*a))
    assert table.load_table(path) == entries and parsed == [1]
