"""nvcc: every spec compiles for sm_89 and sm_90 without spills, and ptxas's shared memory equals
the planner's. The ptxas parser is tested on a literal log and needs no nvcc."""
from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from click.testing import CliRunner

from attngen import compile as compile_mod
from attngen.cli import main
from attngen.compile import compile_source, parse_ptxas
from attngen.errors import ToolError
from attngen.render import render_spec_file

ROOT = Path(__file__).resolve().parents[1]
SPEC_FILES = sorted((ROOT / "specs").glob("*.y*ml"))
ARCHS = ("sm_89", "sm_90")
CASES = [(p, a) for p in SPEC_FILES for a in ARCHS]


PTXAS_LOG = """\
/tmp/attngen-x/kernel.cu(40): warning #177-D: variable "attngen_t::kHeadDim" was declared but never referenced
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'attngen_t_causal' for 'sm_90'
ptxas info    : Function properties for attngen_t_causal
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 40960 bytes smem
ptxas info    : Compile time = 50.090 ms
ptxas info    : Compiling entry function 'attngen_t_none' for 'sm_90'
ptxas info    : Function properties for attngen_t_none
    48 bytes stack frame, 44 bytes spill stores, 40 bytes spill loads
ptxas info    : Used 255 registers, used 5 barriers, 29312 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function 'attngen_t_dyn' for 'sm_89'
ptxas info    : Function properties for attngen_t_dyn
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 96 registers, 384 bytes cmem[0]
"""


def test_parse_ptxas():
    fs = parse_ptxas(PTXAS_LOG)
    assert [f.name for f in fs] == ["attngen_t_causal", "attngen_t_none", "attngen_t_dyn"]
    a, b, c = fs
    assert (a.registers, a.spill_stores, a.spill_loads, a.stack_bytes, a.smem_bytes, a.barriers) == (168, 0, 0, 0, 40960, 1)
    assert not a.spills
    assert (b.registers, b.spill_stores, b.spill_loads, b.stack_bytes, b.smem_bytes, b.barriers) == (255, 44, 40, 48, 29312, 5)
    assert b.spills
    # dynamic shared memory only: ptxas prints no smem and no barriers
    assert (c.registers, c.smem_bytes, c.barriers, c.spills) == (96, 0, 0, False)
    assert b.as_dict()["spill_stores"] == 44


def test_parse_ptxas_empty():
    assert parse_ptxas("") == ()
    assert parse_ptxas("nvcc warning : something unrelated\n") == ()


@pytest.fixture(scope="session")
def compiled():
    """Every (spec, arch) compiled once, in parallel: nvcc runs as a subprocess, so threads suffice."""
    cwd = os.getcwd()
    os.chdir(ROOT)  # headers name specs relative to the repository root, as in generated/
    try:
        rendered = {p: render_spec_file(p.relative_to(ROOT)) for p in SPEC_FILES}
    finally:
        os.chdir(cwd)

    def one(case):
        path, arch = case
        try:
            return case, compile_source(rendered[path].source, arch)
        except Exception as exc:  # reported by the test of that case
            return case, exc

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        results = dict(pool.map(one, CASES))
    return rendered, results


@pytest.mark.nvcc
@pytest.mark.parametrize("path, arch", CASES, ids=[f"{p.stem}-{a}" for p, a in CASES])
def test_compiles_without_spills_and_smem_matches_plan(compiled, path, arch):
    rendered, results = compiled
    res = results[(path, arch)]
    if isinstance(res, Exception):
        pytest.fail(f"{path.name} for {arch}: {res}")
    plan = rendered[path].plan
    assert sorted(f.name for f in res.functions) == sorted(fn for _, fn in plan.functions)
    want = 0 if plan.smem_dynamic else plan.smem_bytes
    for f in res.functions:
        assert not f.spills, f"{f.name} ({arch}) spills: {f.spill_stores} B stored, {f.spill_loads} B loaded"
        assert f.smem_bytes == want, (f"{f.name} ({arch}): ptxas static smem {f.smem_bytes} B, plan {plan.smem_bytes} B"
                                      f" ({'dynamic' if plan.smem_dynamic else 'static'})")
        assert f.registers <= 255
    assert res.cubin[:4] == b"\x7fELF"


@pytest.mark.nvcc
def test_cache_hit(compiled):
    rendered, _ = compiled
    path = SPEC_FILES[0]
    res = compile_source(rendered[path].source, "sm_89")
    assert res.cached


@pytest.mark.nvcc
def test_compile_command(compiled, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    spec = str(SPEC_FILES[0].relative_to(ROOT))
    result = CliRunner().invoke(main, ["compile", spec, "--arch", "sm_89", "--json", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output[result.output.index("["):])
    assert report and all(e["smem_matches_plan"] and e["arch"] == "sm_89" for e in report)
    assert list(tmp_path.glob("*.sm_89.cubin"))


def test_find_nvcc_uses_cuda_home(monkeypatch, tmp_path):
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text("")
    monkeypatch.setattr(compile_mod.shutil, "which", lambda name: None)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert compile_mod.find_nvcc() == str(nvcc)


def test_compile_without_nvcc_exits_3(monkeypatch):
    # A missing tool is one message and exit 3, not a traceback.
    def no_nvcc():
        raise ToolError("nvcc not found: install the CUDA toolkit and put its bin/ on PATH (or set CUDA_HOME)")
    monkeypatch.setattr(compile_mod, "find_nvcc", no_nvcc)
    monkeypatch.chdir(ROOT)
    result = CliRunner().invoke(main, ["compile", str(SPEC_FILES[0].relative_to(ROOT)), "--arch", "sm_89"])
    assert result.exit_code == 3, result.output
    assert "attngen: nvcc not found" in result.output and "Traceback" not in result.output


def test_bad_arch_exits_3(monkeypatch):
    monkeypatch.chdir(ROOT)
    result = CliRunner().invoke(main, ["compile", str(SPEC_FILES[0].relative_to(ROOT)), "--arch", "89"])
    assert result.exit_code == 3 and "sm_89 or sm_90a" in result.output
