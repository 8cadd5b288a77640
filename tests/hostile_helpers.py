"""What the hostile-input tests share: one in-process CLI run, the error lines of its stderr, the
check that a refusal is one clean line in bounded time, a stand-in for nvcc in the cache, and a
small copy of the project to run the CLI inside."""
from __future__ import annotations

import shutil
import time
from pathlib import Path

from click.testing import CliRunner

from attngen import compile as compile_mod
from attngen.cli import main

ROOT = Path(__file__).resolve().parents[1]
SECONDS = 5.0      # every hostile input is answered within this


def _runner() -> CliRunner:
    try:
        return CliRunner(mix_stderr=False)     # click < 8.2
    except TypeError:
        return CliRunner()                     # click >= 8.2 keeps stderr apart


def invoke(args, **kw):
    """(exit code, stdout, stderr, exception, seconds) of one in-process CLI run."""
    start = time.monotonic()
    r = _runner().invoke(main, [str(a) for a in args], **kw)
    return r.exit_code, r.stdout, r.stderr, r.exception, time.monotonic() - start


def error_lines(stderr: str) -> list[str]:
    """The lines that carry an error: click's usage boilerplate, progress lines (a progress bar
    off a terminal prints its label; verify's line of what it loaded), bench's note of the cells of a
    family file it leaves out, and the table that follows a budget refusal left out. Any other line
    counts, indented or not."""
    lines, table = [], False
    for ln in stderr.splitlines():
        if not ln.strip() or ln.startswith(("Usage:", "Try '", "compiling ", "loaded ", "bench: leaving out ")) \
                or ln == "verifying":
            continue
        if table and ln.startswith("  "):
            continue
        table = "exceeds the budget" in ln
        lines.append(ln)
    return lines


def assert_clean(code, out, err, exc, seconds, *, exit_code=2):
    """The run refused cleanly: no traceback, the exit code, exactly one error line, in time; that line."""
    assert "Traceback" not in out + err, err
    assert exc is None or isinstance(exc, SystemExit), repr(exc)
    assert code == exit_code, (code, out, err)
    lines = error_lines(err)
    assert len(lines) == 1, err
    assert seconds < SECONDS, f"took {seconds:.1f} s"
    return lines[0]


def use_fake_nvcc(monkeypatch, tmp_path, fake):
    """Compile with `fake` in place of nvcc (any version), into a cache under tmp_path; returns fake."""
    monkeypatch.setattr(compile_mod, "find_nvcc", lambda: "nvcc")
    monkeypatch.setattr(compile_mod, "nvcc_version", lambda nvcc: "0.0.fake")
    monkeypatch.setattr(compile_mod, "run_nvcc", fake)
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path / "cache"))
    return fake


def mini_project(tmp_path, *folders: str) -> Path:
    """A copy of the project's top level with one spec: pyproject.toml, specs/ and generated/ holding
    phase4, and an empty folder for each of `folders`."""
    root = tmp_path / "project"
    (root / "specs").mkdir(parents=True)
    (root / "generated").mkdir()
    for folder in folders:
        (root / folder).mkdir()
    shutil.copy(ROOT / "pyproject.toml", root)
    shutil.copy(ROOT / "specs" / "phase4.yaml", root / "specs")
    shutil.copy(ROOT / "generated" / "phase4.cu", root / "generated")
    return root
