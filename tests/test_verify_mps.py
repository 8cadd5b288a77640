"""verify's private MPS daemon (attngen/eval/verify/mps.py), with a stand-in nvidia-cuda-mps-control:
started with its own folder, named to this process only inside the block, quit and removed after it,
and the run goes on time-sliced (saying why) whenever MPS cannot be had. No GPU needed."""
import os
import stat

import pytest

from attngen.eval.verify import mps

FAKE_CONTROL = """#!/bin/sh
echo "$* pipe=$CUDA_MPS_PIPE_DIRECTORY stdin=$(cat)" >> "{log}"
{extra}
"""


@pytest.fixture
def control(tmp_path, monkeypatch):
    """A stand-in control program on PATH (no system daemon, no folder named by the caller); returns
    (its call log, a function that rewrites it with extra shell lines)."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()

    def write(extra=""):
        path = bin_dir / mps.CONTROL
        path.write_text(FAKE_CONTROL.format(log=log, extra=extra))
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    write()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.delenv(mps.PIPE_VARIABLE, raising=False)
    monkeypatch.delenv(mps.LOG_VARIABLE, raising=False)
    monkeypatch.setattr(mps, "SYSTEM_PIPE", str(tmp_path / "no-system-daemon"))
    return log, write


def test_private_daemon_named_inside_the_block_only(control, monkeypatch):
    log, _ = control
    monkeypatch.setattr(mps, "PROBE", "pass")       # the probe process reaches the server
    with mps.shared_gpu(True) as how:
        folder = os.environ[mps.PIPE_VARIABLE]
        assert how.startswith("MPS") and "private" in how
        assert os.environ[mps.LOG_VARIABLE] == folder and os.path.isdir(folder)
        assert os.path.basename(folder).startswith("attngen-mps-")
    assert mps.PIPE_VARIABLE not in os.environ and mps.LOG_VARIABLE not in os.environ
    assert not os.path.exists(folder)
    calls = log.read_text().splitlines()
    assert calls == [f"-d pipe={folder} stdin=", f" pipe={folder} stdin=quit"]


def test_daemon_quit_when_the_block_raises(control, monkeypatch):
    log, _ = control
    monkeypatch.setattr(mps, "PROBE", "pass")
    with pytest.raises(RuntimeError):
        with mps.shared_gpu(True):
            raise RuntimeError("a worker failed")
    assert log.read_text().splitlines()[-1].endswith("stdin=quit")
    assert mps.PIPE_VARIABLE not in os.environ


def test_probe_failure_goes_on_time_sliced_and_quits(control, monkeypatch):
    log, _ = control
    monkeypatch.setattr(mps, "PROBE", "import sys; sys.exit('CUDA error 805')")
    with mps.shared_gpu(True) as how:
        assert mps.PIPE_VARIABLE not in os.environ
    assert how == "time-sliced (the probe could not reach the MPS server: CUDA error 805)"
    assert log.read_text().splitlines()[-1].endswith("stdin=quit")


def test_daemon_that_does_not_start(control):
    log, write = control
    write('[ "$1" = -d ] && echo "cannot start: GPU in use" > "$CUDA_MPS_LOG_DIRECTORY/control.log" && exit 1')
    with mps.shared_gpu(True) as how:
        assert mps.PIPE_VARIABLE not in os.environ
    assert how == f"time-sliced ({mps.CONTROL} -d failed: cannot start: GPU in use)"
    assert len(log.read_text().splitlines()) == 1       # nothing to quit


def test_no_control_program(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv(mps.PIPE_VARIABLE, raising=False)
    monkeypatch.setattr(mps, "SYSTEM_PIPE", str(tmp_path / "none"))
    with mps.shared_gpu(True) as how:
        assert mps.PIPE_VARIABLE not in os.environ
    assert how == f"time-sliced (no {mps.CONTROL} on PATH)"


def test_disabled_and_existing_daemons_start_nothing(control, tmp_path, monkeypatch):
    log, _ = control
    with mps.shared_gpu(False) as how:
        assert how == "time-sliced (--no-mps)"
    (tmp_path / "no-system-daemon").mkdir()
    (tmp_path / "no-system-daemon" / "control").write_text("")
    with mps.shared_gpu(True) as how:
        assert how == "MPS (the system's daemon)"
    monkeypatch.setenv(mps.PIPE_VARIABLE, str(tmp_path / "theirs"))
    with mps.shared_gpu(True) as how:
        assert how == f"MPS (the daemon {mps.PIPE_VARIABLE} names)"
        assert os.environ[mps.PIPE_VARIABLE] == str(tmp_path / "theirs")
    assert not log.exists()
