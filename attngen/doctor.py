"""`attngen doctor`: what this machine has for each part of attngen, and what is missing, before
pip spends minutes on the `gpu` extra. Nothing here needs torch, a GPU or network access."""
from __future__ import annotations

import ctypes.util
import functools
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Finding:
    what: str           # the part checked
    ok: bool            # False: missing (or, with note, a warning that the install hint works around)
    detail: str         # what was found, or what is missing and how to get it
    needed_for: str     # which use needs it
    note: bool = False  # a warning, not a missing part

    @property
    def label(self) -> str:
        return "ok" if self.ok else "note" if self.note else "MISSING"


def native_compiler_finding() -> Finding:
    """The compiler the native training step is built with, by its own rule ($CXX, else g++ or c++): without
    it eager training calls keep the Python autograd node (slower on the host, the same gradients)."""
    from .runtime.native import ENV, compiler_command
    needed = "the native training step (eager training's C++ autograd node)"
    if os.environ.get(ENV, "").strip() == "0":
        return Finding("C++ compiler (native training step)", True, f"not needed: {ENV}=0 turns the step off", needed)
    cmd = compiler_command()
    found = bool(cmd) and shutil.which(cmd[0]) is not None
    detail = (" ".join(cmd) if found else
              f"$CXX is {os.environ['CXX']!r}, and {cmd[0]} is not on PATH" if cmd else
              "not found (g++ or c++, or $CXX): eager training calls take the Python node; install g++")
    return Finding("C++ compiler (native training step)", found, detail, needed, note=not found)


@functools.lru_cache(maxsize=None)
def cuda_toolkit(nvcc: str) -> Path | None:
    """The toolkit the nvcc on PATH belongs to, as nvcc itself says (its TOP): a wrapper script on
    PATH points elsewhere, and the headers are in the toolkit, not beside the wrapper."""
    try:
        out = subprocess.run([nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"^#\$ TOP=(.+)$", out.stdout + out.stderr, flags=re.M)
    return Path(m.group(1).strip()).resolve() if m else None


def toolkit_headers(top: Path) -> Path | None:
    for d in (top / "include", *sorted((top / "targets").glob("*/include"))):
        if (d / "cuda.h").is_file():
            return d
    return None


def findings() -> list[Finding]:
    out = []
    nvcc = shutil.which("nvcc")
    top = cuda_toolkit(nvcc) if nvcc else None
    out.append(Finding("nvcc on PATH", nvcc is not None,
                       (f"{nvcc} (toolkit {top})" if top else nvcc) if nvcc else
                       "not found: install the CUDA toolkit and put its bin/ on PATH",
                       "compiling kernels (attngen compile, verify, bench; the library's first call per spec)"))
    headers = toolkit_headers(top) if top else None
    out.append(Finding("CUDA headers (cuda.h)", headers is not None, str(headers) if headers else
                       "not found in the toolkit nvcc reports" if top else "no toolkit to look in",
                       "building pycuda (the gpu extra)"))
    if nvcc and top and Path(nvcc).resolve().parent != (top / "bin").resolve():
        out.append(Finding("nvcc is the toolkit's own", False,
                           f"{nvcc} is a wrapper of {top / 'bin' / 'nvcc'}: pycuda's build looks for headers beside "
                           f"the nvcc on PATH; install with PATH={top / 'bin'}:$PATH CUDA_ROOT={top}",
                           "building pycuda (the gpu extra)", note=True))
    cxx = next((shutil.which(c) for c in ("c++", "g++", "clang++") if shutil.which(c)), None)
    out.append(Finding("C++ compiler", cxx is not None, cxx or "not found: install g++ (build-essential)",
                       "nvcc's host compiler; building pycuda"))
    out.append(native_compiler_finding())
    py_include = Path(sysconfig.get_paths()["include"])
    has_py = (py_include / "Python.h").is_file()
    out.append(Finding("Python headers (Python.h)", has_py, str(py_include) if has_py else
                       f"not in {py_include}: install python3-dev (or your Python's headers)",
                       "building pycuda (the gpu extra)"))
    driver = ctypes.util.find_library("cuda")
    out.append(Finding("CUDA driver (libcuda)", driver is not None, driver or
                       "not found: no NVIDIA driver on this machine (compiling works; running does not)",
                       "running kernels"))
    try:
        import torch                                     # noqa: F401  (only whether it imports)
        has_torch, torch_text = True, f"torch {torch.__version__}, CUDA {torch.version.cuda}"
    except ImportError:
        has_torch, torch_text = False, "not installed: pip install -e '.[gpu]' (after the checks above pass)"
    out.append(Finding("torch", has_torch, torch_text, "running kernels, verify, bench"))
    if has_torch:
        out.append(native_step_finding(torch))
    return out


def native_step_finding(torch) -> Finding:
    """Whether the native training step (attngen/runtime/native, a C++ autograd node) is built for this
    torch; not built is a note: training calls take the Python node until it is."""
    from .runtime import native
    need = "eager training calls' host time (a C++ autograd node instead of a Python one)"
    if not native.enabled():
        return Finding("native training step", False, f"turned off ({native.ENV}=0)", need, note=True)
    path = native.library_path(torch)
    if path.is_file():
        ops = ("; its kernels serve torch.compile's attngen training ops" if native.ops_enabled()
               else f"; its kernels do not serve torch.compile's attngen training ops ({native.OPS_ENV}=0)")
        return Finding("native training step", True, f"built: {path}{ops}", need)
    note = native.failure_note(path)
    if note.is_file():
        first = (note.read_text(errors="replace").strip().splitlines() or ["(no message)"])[0].rstrip(":")
        return Finding("native training step", False, f"its build failed ({first}; the whole message: {note}); "
                       "`attngen warm` tries again", need, note=True)
    return Finding("native training step", False, "not built for this torch: `attngen warm` builds it (or a training "
                   "process, in the background, taking the Python autograd node meanwhile)", need, note=True)


def install_hint() -> str:
    """The command that installs the gpu extra on this machine, with the toolkit first on PATH
    (nvcc asked once: cuda_toolkit remembers its answer per nvcc)."""
    nvcc = shutil.which("nvcc")
    top = cuda_toolkit(nvcc) if nvcc else None
    env = f"PATH={top / 'bin'}:$PATH CUDA_ROOT={top} " if top else ""
    return f'{env}{Path(sys.executable).name} -m pip install -e ".[gpu]"'


__all__ = ["Finding", "cuda_toolkit", "findings", "install_hint", "native_step_finding"]
