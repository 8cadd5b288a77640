"""verify's worker processes share the GPU through a private CUDA MPS daemon (NVIDIA's multi-process
service), started for the run and stopped after it.

Why: without MPS the GPU runs one process's context at a time. verify's cases are small (a few
kernels, then a synchronization), so with 8 workers the GPU spends much of its time switching between
their contexts: on the H200, a warm run over every spec took 127 s time-sliced (90 % "utilization")
and 79 s under MPS, where the workers' kernels run side by side in one server's context.

Private: the daemon's pipe and log folder is a fresh temporary folder, named to this run's processes
through CUDA_MPS_PIPE_DIRECTORY; every other CUDA program on the machine keeps the default folder and
never sees it. Nothing on the GPU is changed (no compute mode, no MIG setting). Where MPS cannot be
had (no nvidia-cuda-mps-control, a daemon that does not start, a server a probe process cannot reach),
the run goes on time-sliced and says why.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile

CONTROL = "nvidia-cuda-mps-control"
PIPE_VARIABLE = "CUDA_MPS_PIPE_DIRECTORY"
LOG_VARIABLE = "CUDA_MPS_LOG_DIRECTORY"
SYSTEM_PIPE = "/tmp/nvidia-mps"     # where a system-wide daemon listens when no folder is named
TIMEOUT_S = 20
QUIT_WAIT_S = 5     # quit returns once the server's clients are gone; past this it completes on its own

# A process that becomes an MPS client of the daemon its environment names: initialises the driver,
# makes the device's primary context current and allocates on it (the first allocation starts the
# server). Exit 0 when all of that worked. ctypes alone, so it starts in milliseconds.
PROBE = """
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
device, context, pointer = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
steps = (lambda: cuda.cuInit(0), lambda: cuda.cuDeviceGet(ctypes.byref(device), int(sys.argv[1])),
         lambda: cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device),
         lambda: cuda.cuCtxSetCurrent(context), lambda: cuda.cuMemAlloc_v2(ctypes.byref(pointer), 256))
for step in steps:
    code = step()
    if code:
        sys.exit(f"CUDA error {code}")
"""


@contextlib.contextmanager
def shared_gpu(enabled: bool, device_index: int = 0):
    """The block with this process's environment naming a private MPS daemon (worker processes started
    in it inherit it); yields how the workers share the GPU, in words ("MPS (...)" or "time-sliced
    (<why>)"). `enabled` False: time-sliced, nothing started. Initialise CUDA in this process before
    the block (torch.cuda.current_device()): CUDA chooses MPS or not as it initialises, and a process
    that became a client holds the daemon's quit until it exits."""
    if not enabled:
        yield "time-sliced (--no-mps)"
        return
    if os.environ.get(PIPE_VARIABLE):
        yield f"MPS (the daemon {PIPE_VARIABLE} names)"
        return
    if os.path.exists(os.path.join(SYSTEM_PIPE, "control")):
        yield "MPS (the system's daemon)"
        return
    control = shutil.which(CONTROL)
    if control is None:
        yield f"time-sliced (no {CONTROL} on PATH)"
        return
    folder = tempfile.mkdtemp(prefix="attngen-mps-")
    env = {**os.environ, PIPE_VARIABLE: folder, LOG_VARIABLE: folder}
    started = False
    try:
        why = _start(control, env, device_index)
        started = why is None or why.startswith("the probe")
        if why is not None:
            yield f"time-sliced ({why})"
            return
        with _environment({PIPE_VARIABLE: folder, LOG_VARIABLE: folder}):
            yield "MPS (a private daemon for this run)"
    finally:
        if started:
            _run([control], env, "quit\n", timeout=QUIT_WAIT_S)
        shutil.rmtree(folder, ignore_errors=True)


def _start(control: str, env: dict, device_index: int) -> str | None:
    """Start the daemon and probe it; None when a client reached its server, else why not."""
    # The daemon keeps no pipe of ours open (it would hold subprocess.run until the timeout): it writes
    # to control.log in the folder, read when it fails.
    result = _run([control, "-d"], env, capture=False)
    if result is None or result.returncode != 0:
        return f"{CONTROL} -d failed" + _log_tail(env[LOG_VARIABLE])
    probe = _run([sys.executable, "-c", PROBE, str(device_index)], env)
    if probe is None or probe.returncode != 0:
        return "the probe could not reach the MPS server" + (f": {_last_line(probe)}" if probe is not None else "")
    return None


def _run(command: list[str], env: dict, stdin: str | None = None, capture: bool = True, timeout: float = TIMEOUT_S):
    """The finished process, or None when it could not start or ran past `timeout` seconds; its output
    in .stdout/.stderr when `capture`, else sent to /dev/null."""
    streams = {"capture_output": True} if capture else {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    try:
        return subprocess.run(command, env=env, input=stdin, text=True, timeout=timeout,
                              stdin=None if stdin is not None else subprocess.DEVNULL, **streams)
    except (OSError, subprocess.SubprocessError):
        return None


def _log_tail(folder: str) -> str:
    """': <the daemon log's last line>', or '' when it wrote none."""
    try:
        lines = open(os.path.join(folder, "control.log"), encoding="utf-8", errors="replace").read().splitlines()
    except OSError:
        return ""
    return f": {lines[-1]}" if lines else ""


def _last_line(result) -> str:
    lines = (result.stderr or result.stdout or "").strip().splitlines()
    return lines[-1] if lines else f"exit code {result.returncode}"


@contextlib.contextmanager
def _environment(values: dict):
    """os.environ with `values` set for the block, then as it was."""
    old = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
