"""attngen's native training step (train_step.cpp): an eager training call's prepared forward and
backward replayed from a C++ autograd node, built once per installed torch and kept in the cache.

Why: the autograd engine runs a CUDA node's backward on its device thread, where a Python node has to
take the GIL; that costs a training step 46-68 us of host time more than a C++ node
(docs/performance/backward.md). The Python runtime still makes every first call and lays out each
launch; the C++ step replays it (Params bytes, pointer fields, tensor maps, launches) on new tensors.

The library is built with the C++ compiler ($CXX, else g++) against the installed torch's headers
and the CUDA toolkit's cuda.h (next to nvcc), into $ATTNGEN_CACHE_DIR/native/, keyed by the
source and torch's build. `attngen warm` builds it; so does the first eager training call of a
process that finds none, in a background thread (about 15-40 s of one core), while the training
steps take the Python node; a later step loads it. ATTNGEN_NATIVE=0 turns it off (the Python node
then serves every step); a build that fails says why once and leaves the Python node in place.

Imports torch only inside its functions: `attngen warm` runs where torch may be missing.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

from ...errors import ToolError
from ...fsutil import cache_dir

SOURCE = Path(__file__).with_name("train_step.cpp")
ENV = "ATTNGEN_NATIVE"          # "0": never build or load it
NAMESPACE = "attngen_native"

_lock = threading.Lock()
_state = {"loaded": False, "failed": None, "building": None}


def enabled() -> bool:
    return os.environ.get(ENV, "").strip() != "0"


def _torch_build(torch) -> str:
    """What a built library is tied to: torch's release, its commit and its C++ ABI."""
    return f"{torch.__version__}|{getattr(torch.version, 'git_version', '')}|{int(torch._C._GLIBCXX_USE_CXX11_ABI)}"


def library_path(torch=None) -> Path:
    """Where the library of this source and this torch lives in the cache."""
    if torch is None:
        import torch
    digest = hashlib.sha256(SOURCE.read_bytes() + _torch_build(torch).encode()).hexdigest()[:16]
    return cache_dir() / "native" / f"train_step-{digest}.so"


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
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise ToolError("the native training step needs a C++ compiler (g++, or set CXX)")
    root = Path(torch.__file__).resolve().parent
    include, lib = root / "include", root / "lib"
    return [cxx, "-std=c++17", "-O2", "-fPIC", "-shared", "-w",
            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            f"-I{include}", f"-I{include / 'torch' / 'csrc' / 'api' / 'include'}", f"-I{_cuda_include()}",
            str(SOURCE), "-o", str(output), f"-L{lib}", "-lc10", "-lc10_cuda", "-ltorch_cpu", "-ltorch",
            f"-Wl,-rpath,{lib}", "-ldl"]


def build(torch=None) -> Path:
    """Compile the library into the cache (nothing when it is there); its path. ToolError says why
    it could not be built (no compiler, no cuda.h, the compiler's own message)."""
    if torch is None:
        import torch
    path = library_path(torch)
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.stem}.{os.getpid()}.{threading.get_ident()}.tmp.so")
    cmd = build_command(torch, partial)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:
        raise ToolError(f"cannot run {cmd[0]} for the native training step: {exc}") from None
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise ToolError(f"the native training step did not compile ({cmd[0]} exited {done.returncode}):\n{tail}")
    os.replace(partial, path)     # whole or not at all, for processes building at once
    return path


def _build_in_background(torch) -> None:
    def run():
        try:
            build(torch)
        except ToolError as exc:
            _state["failed"] = str(exc)
            print(f"attngen: {exc}\nattngen: training steps keep the Python autograd node "
                  f"({ENV}=0 stops this attempt)", file=sys.stderr)
        except Exception as exc:   # never let a background build take the process down
            _state["failed"] = f"{type(exc).__name__}: {exc}"

    thread = threading.Thread(target=run, name="attngen-native-build", daemon=True)
    _state["building"] = thread
    thread.start()


def unavailable() -> bool:
    """Whether this process will not have the library (turned off, its build or load failed)."""
    return _state["failed"] is not None or not enabled()


def ready(torch) -> bool:
    """Whether the native step's ops are loaded: loads the library when it is built; starts its build
    in the background the first time it is not (ATTNGEN_NATIVE=0: never)."""
    if _state["loaded"]:
        return True
    if _state["failed"] is not None or not enabled():
        return False
    with _lock:
        if _state["loaded"]:
            return True
        building = _state["building"]
        if building is not None and building.is_alive():
            return False
        try:
            path = library_path(torch)
        except OSError:
            _state["failed"] = "no source"
            return False
        if not path.is_file():
            if building is None:
                _build_in_background(torch)
            return False
        try:
            torch.ops.load_library(str(path))
        except (OSError, RuntimeError) as exc:
            _state["failed"] = f"cannot load {path}: {exc}"
            print(f"attngen: {_state['failed']}; training steps keep the Python autograd node", file=sys.stderr)
            return False
        _state["loaded"] = True
        return True


def make_step(torch, forward_prepared, forward_args, backward_prepared, backward_args, options):
    """The C++ Step of one call shape (ready() must have said yes): its forward and backward from the
    conventions' native_forward / native_backward, `options` the call's (causal, alignment, scale,
    layout, deterministic), which the Step hands to attngen's own ops for tensors it was not prepared
    for. None where the two calls are on different GPUs."""
    info = forward_prepared.info
    if backward_prepared.info.index != info.index:
        return None
    causal, alignment, scale, layout, deterministic = options
    step = torch.classes.attngen_native.Step(info.index, info.context, bool(causal), alignment,
                                             None if scale is None else float(scale), layout, bool(deterministic))
    step.set_forward(*forward_args)
    step.set_backward(*backward_args)
    return step


__all__ = ["ENV", "NAMESPACE", "SOURCE", "build", "build_command", "enabled", "library_path", "make_step", "ready", "unavailable"]
