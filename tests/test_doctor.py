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
