"""nvcc: CUDA source -> cubin, the ptxas resource report, and an on-disk cubin cache."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from .errors import ToolError

NVCC_FLAGS = ("-O3", "-std=c++17", "--use_fast_math", "-lineinfo", "-Xptxas=-v")
CACHE_ENV = "ATTNGEN_CACHE_DIR"


@dataclass(frozen=True)
class FunctionReport:
    """What ptxas says about one kernel function."""

    name: str
    registers: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    smem_bytes: int      # static shared memory
    barriers: int

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class CompileResult:
    arch: str
    cubin: bytes
    functions: tuple[FunctionReport, ...]
    log: str
    cached: bool

    def function(self, name: str) -> FunctionReport:
        for f in self.functions:
            if f.name == name:
                return f
        raise KeyError(name)


def find_nvcc() -> str:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        for cand in (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"):
            p = Path(cand) / "bin" / "nvcc"
            if cand and p.is_file():
                return str(p)
        raise ToolError("nvcc not found: install the CUDA toolkit and put its bin/ on PATH (or set CUDA_HOME)")
    return nvcc


@lru_cache(maxsize=None)
def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release [\d.]+, V([\d.]+)", out)
    return m.group(1) if m else out.strip().splitlines()[-1] if out.strip() else "unknown"


_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(\w+)'")
_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(.*)")


def parse_ptxas(log: str) -> tuple[FunctionReport, ...]:
    """Parse `ptxas -v` output into one report per entry function."""
    reports, cur = [], None
    for line in log.splitlines():
        m = _ENTRY.search(line)
        if m:
            cur = {"name": m.group(1), "stack_bytes": 0, "spill_stores": 0, "spill_loads": 0}
            continue
        if cur is None:
            continue
        m = _PROPS.search(line)
        if m:
            cur.update(stack_bytes=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
            continue
        m = _USED.search(line)
        if m:
            rest = m.group(2)
            smem = re.search(r"(\d+) bytes smem", rest)
            bars = re.search(r"used (\d+) barriers", rest)
            reports.append(FunctionReport(cur["name"], int(m.group(1)), cur["spill_stores"], cur["spill_loads"],
                                          cur["stack_bytes"], int(smem.group(1)) if smem else 0,
                                          int(bars.group(1)) if bars else 0))
            cur = None
    return tuple(reports)


def cache_dir() -> Path:
    d = os.environ.get(CACHE_ENV)
    if d:
        return Path(d)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "attngen"


def cache_key(source: str, arch: str, nvcc: str) -> str:
    h = hashlib.sha256()
    for part in (source, arch, nvcc_version(nvcc), " ".join(NVCC_FLAGS)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def compile_source(source: str, arch: str, *, use_cache: bool = True, on_compile=None) -> CompileResult:
    """Compile CUDA source to a cubin for `arch` (e.g. sm_89). Cached by source, arch, nvcc, flags.

    `on_compile(arch)` is called before nvcc actually runs (a cache miss), so callers can say so.
    """
    if not re.fullmatch(r"sm_\d+a?", arch):
        raise ToolError(f"--arch must look like sm_89 or sm_90a (got {arch!r})")
    nvcc = find_nvcc()
    key = cache_key(source, arch, nvcc)
    cdir = cache_dir() / key
    if use_cache and (cdir / "kernel.cubin").is_file() and (cdir / "ptxas.log").is_file():
        log = (cdir / "ptxas.log").read_text()
        return CompileResult(arch, (cdir / "kernel.cubin").read_bytes(), parse_ptxas(log), log, True)
    if on_compile:
        on_compile(arch)
    with tempfile.TemporaryDirectory(prefix="attngen-") as tmp:
        src = Path(tmp) / "kernel.cu"
        out = Path(tmp) / "kernel.cubin"
        src.write_text(source)
        gencode = f"-gencode=arch=compute_{arch[3:]},code={arch}"
        cmd = [nvcc, "-cubin", gencode, *NVCC_FLAGS, "-o", str(out), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        log = proc.stdout + proc.stderr
        if proc.returncode != 0:
            raise ToolError(f"nvcc failed for {arch} (exit {proc.returncode}):\n{log.strip()}")
        cubin = out.read_bytes()
    if use_cache:
        try:
            cdir.mkdir(parents=True, exist_ok=True)
            (cdir / "kernel.cubin").write_bytes(cubin)
            (cdir / "ptxas.log").write_text(log)
        except OSError:
            pass  # a read-only cache only costs a recompile
    return CompileResult(arch, cubin, parse_ptxas(log), log, False)
