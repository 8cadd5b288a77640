"""attngen's native training step (train_step.cpp): an eager training call's prepared forward and
backward replayed from a C++ autograd node, built once per installed torch and kept in the cache.

Why: the autograd engine runs a CUDA node's backward on its device thread, where a Python node has to
take the GIL; that costs a training step 46-68 us of host time more than a C++ node
(docs/performance/backward.md). The Python runtime still makes every first call and lays out each
launch; the C++ step replays it (Params bytes, pointer fields, tensor maps, launches) on new tensors.

The library is built with the C++ compiler ($CXX, else g++) against the installed torch's headers
and the CUDA toolkit's cuda.h (next to nvcc), linking the libstdc++ torch's process has loaded, into
$ATTNGEN_CACHE_DIR/native/, keyed by the source, the compiler's command line and torch's build. A child
process loads each build and fails one of its checks (self_test): unless that raises RuntimeError, the
build counts as failed. `attngen warm` builds it. The first eager training call
of a process that finds none starts its build as a process of its own
(`python -m attngen.runtime.native`, about 15-40 s of one core), which finishes even if the training
process ends first; the steps take the Python node meanwhile and load the library once it is there.
Processes building at once take turns on a lock file: one compiles, the others find its library. A
build that fails leaves a note beside the library's place with the compiler's message, printed once
per process, and no process builds again until `attngen warm` is asked to (it retries). A library
that will not load is moved aside and built again by the next process. ATTNGEN_NATIVE=0 turns it
all off: every step then takes the Python node.

The library also serves torch.compile's calls of attngen::attention_train and attngen::attention_backward
(take_ops): a C++ kernel ahead of the ops' Python ones replays the native step of a shape it was
registered for (register_step) and hands every other call on to them; ATTNGEN_NATIVE_OPS=0 turns that
off alone. attngen.ops loads a built library at import (it starts no build), so that the kernels are in
place before any thread calls the ops; a library built during the run takes them when it loads.

Imports torch only inside its functions: `attngen warm` runs where torch may be missing.
"""
from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from ...errors import ToolError
from ...fsutil import cache_dir

SOURCE = Path(__file__).with_name("train_step.cpp")
ENV = "ATTNGEN_NATIVE"          # "0": never build or load it
OPS_ENV = "ATTNGEN_NATIVE_OPS"  # "0": the library does not serve attngen's training ops (take_ops)
NAMESPACE = "attngen_native"
POLL_SECONDS = 0.5              # how often a training step looks for a library being built elsewhere
FLAGS = ("-std=c++17", "-O2", "-fPIC", "-shared", "-w")

_lock = threading.Lock()
_state = {"loaded": False, "failed": None, "building": None, "next_look": 0.0}


def enabled() -> bool:
    return os.environ.get(ENV, "").strip() != "0"


def ops_enabled() -> bool:
    return enabled() and os.environ.get(OPS_ENV, "").strip() != "0"


def compiler_command() -> list[str]:
    """The command that builds the library: $CXX (split as a shell would: "ccache g++"), else g++ or c++
    on PATH; [] where there is neither. `attngen doctor` reports the same."""
    return shlex.split(os.environ.get("CXX", "")) or [c for c in (shutil.which("g++") or shutil.which("c++"),) if c]


def _compiler() -> list[str]:
    """compiler_command(); ToolError if there is none."""
    cxx = compiler_command()
    if not cxx:
        raise ToolError("the native training step needs a C++ compiler (g++, or set CXX)")
    return cxx


_libstdcxx: list[str] = []     # loaded_libstdcxx's answer, once found


def loaded_libstdcxx() -> str | None:
    """The libstdc++ this process has loaded (torch's C++ runtime), or None (not Linux, none mapped). The
    library links this one by its path: a compiler whose own libstdc++ is only a static archive (found on a
    GPU machine: g++ under /opt/gcc) would otherwise put a second C++ runtime into the library, whose first
    iostream use (any error message with a number in it) ends the process. Read once per process: a
    training process's library_path looks for the library at every poll while it is built."""
    if _libstdcxx:
        return _libstdcxx[0]
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                name = line.rsplit(None, 1)[-1]
                if "/libstdc++.so" in name:
                    _libstdcxx.append(name)
                    return name
    except OSError:
        pass
    return None


def _torch_build(torch) -> str:
    """What a built library is tied to: torch's release, its commit and its C++ ABI."""
    return f"{torch.__version__}|{getattr(torch.version, 'git_version', '')}|{int(torch._C._GLIBCXX_USE_CXX11_ABI)}"


def library_path(torch=None) -> Path:
    """Where the library of this source, these flags and this torch lives in the cache (no compiler is
    run to find it: a first training step only reads the source)."""
    if torch is None:
        import torch
    key = SOURCE.read_bytes() + "|".join((*FLAGS, os.environ.get("CXX", ""), _torch_build(torch),
                                          loaded_libstdcxx() or "")).encode()
    return cache_dir() / "native" / f"train_step-{hashlib.sha256(key).hexdigest()[:16]}.so"


def failure_note(path: Path) -> Path:
    """Where a failed build of `path` leaves the compiler's message."""
    return path.with_suffix(".failed")


def _cuda_include() -> Path:
    """The CUDA toolkit's include folder (cuda.h): next to nvcc, else $CUDA_HOME, else /usr/local/cuda."""
    candidates = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(Path(nvcc).resolve().parent.parent / "include")
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root:
            candidates.append(Path(root) / "include")
    for c in candidates:
        if (c / "cuda.h").is_file():
            return c
    raise ToolError("the native training step needs the CUDA toolkit's cuda.h (put nvcc on PATH or set CUDA_HOME)")


def build_command(torch, output: Path) -> list[str]:
    """The compiler's command line for the library at `output`."""
    cxx = _compiler()
    root = Path(torch.__file__).resolve().parent
    include, lib = root / "include", root / "lib"
    return [*cxx, *FLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            f"-I{include}", f"-I{include / 'torch' / 'csrc' / 'api' / 'include'}", f"-I{_cuda_include()}",
            str(SOURCE), *filter(None, [loaded_libstdcxx()]), "-o", str(output), f"-L{lib}", "-lc10", "-lc10_cuda",
            "-ltorch_cpu", "-ltorch", f"-Wl,-rpath,{lib}", "-ldl"]


def build(torch=None, retry: bool = True) -> Path:
    """Compile the library into the cache (nothing when it is there); its path. One process at a time
    per library (a lock file beside it; the others wait and find it built). A failure is ToolError with
    the compiler's message, also left in failure_note(path); with retry=False a failure noted before
    is raised again without compiling."""
    if torch is None:
        import torch
    try:
        path = library_path(torch)
        if path.is_file():
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        import fcntl
        with open(path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)      # released when the file closes, also if this process dies
            if path.is_file():
                return path
            note = failure_note(path)
            if note.is_file() and not retry:
                raise ToolError(note.read_text(errors="replace").strip())
            return _compile(torch, path, note)
    except OSError as exc:
        raise ToolError(f"the native training step cannot be built in {cache_dir() / 'native'}: {exc}") from None


def _compile(torch, path: Path, note: Path) -> Path:
    partial = path.with_name(f"{path.stem}.{os.getpid()}.tmp.so")
    try:
        cmd = build_command(torch, partial)
        try:
            done = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as exc:
            raise ToolError(f"cannot run {cmd[0]} for the native training step: {exc}") from None
        if done.returncode != 0:
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
            raise ToolError(f"the native training step did not compile ({cmd[0]} exited {done.returncode}):\n{tail}")
        self_test(partial, cmd[0])
    except ToolError as exc:
        partial.unlink(missing_ok=True)
        note.write_text(f"{exc}\n")
        raise
    os.replace(partial, path)     # whole or not at all
    note.unlink(missing_ok=True)
    return path


SELF_TEST = """
import sys, torch
torch.ops.load_library(sys.argv[1])
try:
    torch.ops.attngen_native.check_message(7)
except RuntimeError as exc:
    sys.exit(0 if "self-test 7" in str(exc) else 3)
sys.exit(4)
"""


def self_test(path: Path, compiler: str = "the compiler") -> None:
    """Load the library at `path` in a child process and fail one of its checks, whose message formats a
    number: the error must come back as RuntimeError. ToolError where it does not (a C++ runtime of its own
    in the library ends the process there instead: the training process keeps the Python node)."""
    try:
        done = subprocess.run([sys.executable, "-c", SELF_TEST, str(path)], capture_output=True, text=True,
                              timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolError(f"the native training step's self-test did not run: {exc}") from None
    if done.returncode != 0:
        how = f"signal {-done.returncode}" if done.returncode < 0 else f"exit {done.returncode}"
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise ToolError(f"the native training step's library failed its self-test ({how}): a C++ error inside it "
                        f"would end the process, not raise RuntimeError. {compiler} built it; another compiler (CXX) "
                        f"may do" + (f"\n{tail}" if tail else ""))


def _start_build() -> None:
    """The build as a process of its own (it outlives this one; its messages go to the failure note)."""
    _state["building"] = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          start_new_session=True)


def _give_up(message: str) -> None:
    _state["failed"] = message
    print(f"attngen: {message}\nattngen: eager training calls keep the Python autograd node ({ENV}=0 silences "
          f"this; `attngen warm` tries the build again)", file=sys.stderr)


def unavailable() -> bool:
    """Whether this process will not have the library (turned off, its build or load failed)."""
    return _state["failed"] is not None or not enabled()


def ready(torch) -> bool:
    """Whether the native step's ops are loaded: loads the library when it is built; starts its build
    the first time it is not (ATTNGEN_NATIVE=0: never). While it is being built, looks again at most
    every POLL_SECONDS."""
    if _state["loaded"]:
        return True
    if unavailable() or time.monotonic() < _state["next_look"]:
        return False
    with _lock:
        if _state["loaded"]:
            return True
        _state["next_look"] = time.monotonic() + POLL_SECONDS
        try:
            path = library_path(torch)
            if not path.is_file():
                note = failure_note(path)
                if note.is_file():
                    _give_up(note.read_text(errors="replace").strip())
                elif _state["building"] is None:
                    _start_build()
                elif _state["building"].poll() is not None and not path.is_file() and not note.is_file():
                    _give_up("the native training step's build process ended without a library")
                return False
        except (OSError, ToolError) as exc:
            _give_up(f"the native training step cannot be built: {exc}")
            return False
        try:
            torch.ops.load_library(str(path))
        except (OSError, RuntimeError) as exc:
            try:       # the next process builds it again (another compiler, libstdc++ or torch wrote it)
                os.replace(path, path.with_suffix(".bad"))
            except OSError:
                pass
            _give_up(f"cannot load {path}: {exc}")
            return False
        _state["loaded"] = True
        if ops_enabled():
            _take_ops(torch)
        return True


def load_built(torch) -> bool:
    """ready(), where the library is already built; no build is started (an import's: a process that never
    trains builds nothing)."""
    if _state["loaded"]:
        return True
    if unavailable():
        return False
    try:
        built = library_path(torch).is_file()
    except OSError:
        return False
    return built and ready(torch)


def _take_ops(torch) -> None:
    """The library's kernels for attngen's training ops (take_ops); a library that cannot register them
    says so once and leaves the ops to their Python kernels."""
    try:
        take_ops(torch)
    except (AttributeError, RuntimeError) as exc:
        print(f"attngen: the native step does not serve attngen's training ops ({exc}); they keep their Python "
              f"kernels", file=sys.stderr)


TAKEN_OPS = ("attention_train", "attention_backward")   # the attngen ops whose kernels take_ops puts in front


def take_ops(torch, cpu_too: bool = False) -> None:
    """Put the library's kernels in front of attngen's training ops (loaded library; once). torch's
    dispatcher reads its tables without a lock: where other threads may call attngen's ops, take them
    before those threads start (attngen.ops takes them at import where the library is built, unless
    ATTNGEN_NATIVE_OPS=0). cpu_too: attention_train's kernel for CPU tensors too (the tests' CPU stand-ins)."""
    torch.ops.attngen_native.take_ops(cpu_too)
    _forget_python_dispatch(torch)


def release_ops(torch) -> None:
    """Take the library's kernels away from attngen's training ops again (the tests')."""
    torch.ops.attngen_native.release_ops()
    _forget_python_dispatch(torch)


def _forget_python_dispatch(torch) -> None:
    """Empty the ops' Python dispatch caches: while tracing, torch's Python dispatcher remembers which key's
    kernel served each key, and would keep calling a key whose kernel was since taken away (release_ops:
    the calls that need a gradient then lost it)."""
    for name in TAKEN_OPS:
        cache = getattr(getattr(torch.ops.attngen, name).default, "_dispatch_cache", None)
        if cache is not None:
            cache.clear()


def op_counts(torch) -> dict:
    """How the library's op kernels took attngen's training ops' calls since it loaded."""
    names = ("train_replayed", "train_to_autograd", "train_below", "backward_replayed", "backward_below")
    return dict(zip(names, torch.ops.attngen_native.op_counts()))


def register_step(torch, step, q, k, v, output_strides) -> None:
    """Let the library's op kernels (take_ops) replay `step` (a plain call's) for calls of q, k and v's key
    with the step's options, its backward where out and lse have `output_strides` (the Python step's).
    Nothing where ATTNGEN_NATIVE_OPS=0."""
    if not ops_enabled():
        return
    o_strides, lse_strides = output_strides
    torch.ops.attngen_native.register_plain(step.address(), q, k, v, list(o_strides), list(lse_strides))


def forget_steps(torch) -> None:
    """The library's op kernels forget every step registered (the Python steps' cache was emptied)."""
    if _state["loaded"]:
        torch.ops.attngen_native.forget_steps()


def make_step(torch, forward_prepared, forward_args, backward_prepared, backward_args, options, variants=None):
    """The C++ Step of one call shape (ready() must have said yes): its forward and backward from the
    conventions' native_forward / native_backward, `options` the call's (causal, alignment, scale,
    layout, deterministic) and `variants` its (window, softcap) or None, which the Step hands to
    attngen's own ops for tensors it was not prepared for. None where the two calls are on different GPUs."""
    info = forward_prepared.info
    if backward_prepared.info.index != info.index:
        return None
    causal, alignment, scale, layout, deterministic = options
    step = torch.classes.attngen_native.Step(info.index, info.context, bool(causal), alignment,
                                             None if scale is None else float(scale), layout, bool(deterministic))
    if variants is not None:
        window, softcap = variants
        step.set_variants(None if window is None else [int(w) for w in window],
                          None if softcap is None else float(softcap))
    step.set_forward(*forward_args)
    step.set_backward(*backward_args)
    return step


def main() -> int:
    """`python -m attngen.runtime.native`: build the library (a training process starts this)."""
    try:
        import torch
        build(torch, retry=False)
    except ToolError:
        return 1       # the failure note holds the message
    return 0


__all__ = ["ENV", "NAMESPACE", "OPS_ENV", "SOURCE", "TAKEN_OPS", "build", "build_command", "enabled",
           "failure_note", "forget_steps", "library_path", "load_built", "main", "make_step", "op_counts",
           "ops_enabled", "ready", "register_step", "release_ops", "take_ops", "unavailable"]
