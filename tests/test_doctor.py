"""attngen doctor: the toolkit nvcc belongs to (a wrapper on PATH), and a report without torch or a GPU."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from click.testing import CliRunner

from attngen.cli import main
from attngen.doctor import cuda_toolkit, findings, install_hint


def fake_toolkit(tmp_path) -> tuple[Path, Path]:
    """A toolkit (bin/nvcc that reports its TOP, include/cuda.h) and a wrapper nvcc elsewhere."""
    top = tmp_path / "cuda"
    (top / "bin").mkdir(parents=True)
    (top / "include").mkdir()
    (top / "include" / "cuda.h").write_text("")
    real = top / "bin" / "nvcc"
    real.write_text(f"#!/bin/sh\necho '#$ TOP={top}/bin/..' >&2\n")
    wrapper = tmp_path / "wrap" / "nvcc"
    wrapper.parent.mkdir()
    wrapper.write_text(f"#!/bin/sh\nexec {real} \"$@\"\n")
    for f in (real, wrapper):
        f.chmod(f.stat().st_mode | stat.S_IEXEC)
    return top, wrapper


def test_a_wrapper_nvcc_leads_to_its_toolkit(tmp_path, monkeypatch):
    top, wrapper = fake_toolkit(tmp_path)
    assert cuda_toolkit(str(wrapper)) == top.resolve()
    monkeypatch.setenv("PATH", f"{wrapper.parent}{os.pathsep}{os.environ['PATH']}")
    found = {f.what: f for f in findings()}
    assert found["nvcc on PATH"].ok and found["CUDA headers (cuda.h)"].ok
    assert found["nvcc is the toolkit's own"].note and str(top.resolve() / "bin") in install_hint()


def test_doctor_reports_as_json():
    run = CliRunner().invoke(main, ["doctor", "--json"])
    data = json.loads(run.stdout)
    assert run.exit_code in (0, 1) and {"nvcc on PATH", "torch"} <= {f["what"] for f in data["findings"]}
    assert 'pip install -e ".[gpu]"' in data["install"]


def test_the_native_steps_compiler_is_the_one_its_build_takes(monkeypatch, tmp_path):
    """doctor reports the native training step's compiler by the build's own rule: $CXX first (split as a
    shell would), else g++ or c++ on PATH; one it cannot find is a note (training falls back to the Python
    node), not a missing part."""
    from attngen.doctor import native_compiler_finding
    from attngen.runtime.native import compiler_command
    monkeypatch.setenv("CXX", "ccache g++-99")
    assert compiler_command() == ["ccache", "g++-99"]
    fake = tmp_path / "ccache"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    found = native_compiler_finding()
    assert found.ok and found.detail == "ccache g++-99"
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    found = native_compiler_finding()
    assert not found.ok and found.note and "no-such-compiler-here" in found.detail
    monkeypatch.setenv("ATTNGEN_NATIVE", "0")
    assert native_compiler_finding().ok
