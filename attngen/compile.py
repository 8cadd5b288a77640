"""nvcc: CUDA source -> cubin, the ptxas resource report, and an on-disk cubin cache that is verified
on every read."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from . import fsutil
from .errors import ToolError, WriteError

NVCC_FLAGS = ("-O3", "-std=c++17", "--use_fast_math", "-lineinfo", "-Xptxas=-v")
CACHE_ENV = "ATTNGEN_CACHE_DIR"
CACHE_FORMAT = 2          # part of every cache key: entries of other formats are never looked up
ARCH_RE = re.compile(r"sm_[1-9][0-9]+[af]?")


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

    @property
    def wgmma_warnings(self) -> tuple[str, ...]:
        """ptxas warnings that mean a kernel lost what it was written for: setmaxnreg ignored (C7508)
        or wgmma serialized / an arrive inserted (C7510-C7520)."""
        return tuple(line.strip() for line in self.log.splitlines() if WGMMA_WARNING.search(line))

    def function(self, name: str) -> FunctionReport:
        for f in self.functions:
            if f.name == name:
                return f
        raise KeyError(name)


WGMMA_WARNING = re.compile(r"\bC75(08|1\d|20)\b")


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
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, timeout=120).stdout.decode("utf-8", "replace")
    except (OSError, subprocess.SubprocessError) as exc:
        raise ToolError(f"cannot run {nvcc} --version: {getattr(exc, 'strerror', None) or exc}") from None
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
    for part in (f"cache format {CACHE_FORMAT}", source, arch, nvcc_version(nvcc), " ".join(NVCC_FLAGS)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


# -- the cache entry: <cache_dir>/<key>/{kernel.cubin, ptxas.log, manifest.json, .lock} -----------
#
# kernel.cubin and ptxas.log are written first, each atomically, then manifest.json, which records
# their sizes and sha256. An entry counts only when the manifest is there and both files match it;
# a damaged entry is reported and rebuilt, never used. The .lock file serialises the compile and
# store of one key across processes, so concurrent compiles of one source run nvcc once.

CUBIN, LOG, MANIFEST, LOCK = "kernel.cubin", "ptxas.log", "manifest.json", ".lock"


class BadCacheEntry(Exception):
    """A cache entry that must not be used; the message says why."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_file(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise BadCacheEntry(f"{path.name} is missing") from None
    except OSError as exc:
        raise BadCacheEntry(f"cannot read {path.name}: {fsutil.reason(exc)}") from None


def read_cache_entry(cdir: Path, key: str, arch: str) -> CompileResult | None:
    """The verified result stored in `cdir`, None when there is no entry; BadCacheEntry when the
    entry is damaged, incomplete or does not match its manifest."""
    try:
        raw = (cdir / MANIFEST).read_bytes()
    except FileNotFoundError:
        try:
            names = {p.name for p in cdir.iterdir()} - {LOCK}
        except OSError:
            return None
        if names:
            raise BadCacheEntry(f"{MANIFEST} is missing (an interrupted write?)") from None
        return None
    except NotADirectoryError:
        raise BadCacheEntry("the entry is a file, not a directory") from None
    except OSError as exc:
        raise BadCacheEntry(f"cannot read {MANIFEST}: {fsutil.reason(exc)}") from None
    try:
        m = json.loads(raw.decode("utf-8"))
        fields = (m["format"], m["key"], m["arch"], m["cubin_bytes"], m["cubin_sha256"], m["log_bytes"],
                  m["log_sha256"], m["functions"])
    except (UnicodeDecodeError, ValueError, TypeError, KeyError):
        raise BadCacheEntry(f"{MANIFEST} is not a valid manifest") from None
    if fields[:3] != (CACHE_FORMAT, key, arch):
        raise BadCacheEntry(f"{MANIFEST} describes another entry")
    cubin = _read_file(cdir / CUBIN)
    log_bytes = _read_file(cdir / LOG)
    for name, data, size, sha in ((CUBIN, cubin, m["cubin_bytes"], m["cubin_sha256"]),
                                  (LOG, log_bytes, m["log_bytes"], m["log_sha256"])):
        if len(data) != size or _sha256(data) != sha:
            raise BadCacheEntry(f"{name} has {len(data)} bytes and does not match the {size} bytes recorded "
                                f"in {MANIFEST}")
    if cubin[:4] != b"\x7fELF":
        raise BadCacheEntry(f"{CUBIN} is not an ELF file")
    try:
        log = log_bytes.decode("utf-8")
    except UnicodeDecodeError:
        raise BadCacheEntry(f"{LOG} is not UTF-8 text") from None
    functions = parse_ptxas(log)
    if len(functions) != m["functions"]:
        raise BadCacheEntry(f"{LOG} reports {len(functions)} kernel function(s), {MANIFEST} {m['functions']}")
    return CompileResult(arch, cubin, functions, log, True)


def write_cache_entry(cdir: Path, key: str, result: CompileResult) -> None:
    """Store a fresh result: both files atomically, then the manifest that makes them an entry."""
    log_bytes = result.log.encode("utf-8")
    manifest = {"format": CACHE_FORMAT, "key": key, "arch": result.arch,
                "cubin_bytes": len(result.cubin), "cubin_sha256": _sha256(result.cubin),
                "log_bytes": len(log_bytes), "log_sha256": _sha256(log_bytes),
                "functions": len(result.functions)}
    fsutil.ensure_dir(cdir)
    try:
        (cdir / MANIFEST).unlink()          # the entry is not valid while its files change
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise WriteError(f"cannot write {cdir / MANIFEST}: {fsutil.reason(exc)}") from None
    fsutil.atomic_write_bytes(cdir / CUBIN, result.cubin)
    fsutil.atomic_write_bytes(cdir / LOG, log_bytes)
    fsutil.atomic_write_bytes(cdir / MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode())


def clear_non_directory_entry(cdir: Path, on_warning) -> None:
    """An entry path that is a file (or a dangling link) is a damaged entry: report it and remove
    it, so that the entry can be rebuilt as a directory. Only a failed removal is an error."""
    # lexists first: checked the other way round, another thread creating the directory between
    # the two checks made a fresh entry look like a file.
    if not os.path.lexists(cdir) or cdir.is_dir():
        return
    try:
        os.unlink(cdir)
    except (FileNotFoundError, IsADirectoryError):
        return                               # another thread or process removed it, or made it the entry
    except OSError as exc:
        raise WriteError(f"cannot remove {cdir}: {fsutil.reason(exc)}") from None
    on_warning(f"damaged cache entry {cdir} (the entry is a file, not a directory); rebuilding it")


def _warn(message: str) -> None:
    print(f"attngen: {message}", file=sys.stderr, flush=True)


# -- nvcc --------------------------------------------------------------------------------------

# The name nvcc records for the source (line info, the seed of internal symbol names). A fixed
# name instead of the temporary directory's makes two builds of one source byte-identical.
SOURCE_NAME = "/attngen/kernel.cu"


@lru_cache(maxsize=None)
def _source_name_flags(nvcc: str, arch: str) -> tuple[str, ...]:
    """Flags that make cicc record SOURCE_NAME as the source's path, when this nvcc passes cicc
    one (it seeds the `_INTERNAL_<hash>` symbol names); () otherwise."""
    try:
        with tempfile.TemporaryDirectory(prefix="attngen-") as tmp:
            out = subprocess.run([nvcc, "--dryrun", "-cubin", f"-arch={arch}", "-o", "k.cubin", "k.cu"], cwd=tmp,
                                 capture_output=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return ()
    if b"--orig_src_path_name" in out.stdout + out.stderr:
        return ("-Xcicc", "--orig_src_path_name", "-Xcicc", SOURCE_NAME)
    return ()


def run_nvcc(source: str, arch: str, nvcc: str) -> CompileResult:
    """Compile `source` with nvcc in a fresh temporary directory; no cache."""
    gencode = f"-gencode=arch=compute_{arch[3:]},code={arch}"
    cmd = [nvcc, "-cubin", gencode, *NVCC_FLAGS, *_source_name_flags(nvcc, arch), "-o", "kernel.cubin", "kernel.cu"]
    try:
        with tempfile.TemporaryDirectory(prefix="attngen-") as tmp:
            src = Path(tmp) / "kernel.cu"
            # Line numbers stay those of the generated file; the file name is SOURCE_NAME, and a
            # fixed mtime keeps ptxas's line table the same from build to build.
            src.write_text(f'#line 1 "{SOURCE_NAME}"\n' + source, encoding="utf-8")
            os.utime(src, (0, 0))
            proc = subprocess.run(cmd, capture_output=True, cwd=tmp)
            log = (proc.stdout + proc.stderr).decode("utf-8", errors="replace")
            if proc.returncode != 0:
                raise ToolError(f"nvcc failed for {arch} (exit {proc.returncode}):\n{log.strip()}")
            cubin = (Path(tmp) / "kernel.cubin").read_bytes()
    except OSError as exc:
        raise ToolError(f"cannot run nvcc for {arch}: {fsutil.reason(exc)}"
                        + (f" ({exc.filename})" if exc.filename else "")) from None
    return CompileResult(arch, cubin, parse_ptxas(log), log, False)


def compile_source(source: str, arch: str, *, use_cache: bool = True, on_compile=None,
                   on_warning=_warn) -> CompileResult:
    """Compile CUDA source to a cubin for `arch` (e.g. sm_89). Cached by source, arch, nvcc, flags.

    `on_compile(arch)` is called before nvcc actually runs (a cache miss), so callers can say so;
    `on_warning(message)` hears of a damaged cache entry that is being rebuilt (default: a line on
    stderr). Writing the cache is part of the job: a cache that cannot be written is a WriteError.
    Concurrent calls for one source, in threads or processes, run nvcc once and share the entry.
    """
    if not ARCH_RE.fullmatch(arch):
        raise ToolError(f"--arch must look like sm_89 or sm_90a (got {arch!r})")
    nvcc = find_nvcc()
    if not use_cache:
        if on_compile:
            on_compile(arch)
        return run_nvcc(source, arch, nvcc)
    key = cache_key(source, arch, nvcc)
    cdir = cache_dir() / key
    try:
        hit = read_cache_entry(cdir, key, arch)
        if hit is not None:
            return hit
    except BadCacheEntry:
        pass                                 # looked at again under the lock: it may be being written
    try:
        clear_non_directory_entry(cdir, on_warning)
        fsutil.ensure_dir(cdir)
        with fsutil.locked(cdir / LOCK):
            try:
                hit = read_cache_entry(cdir, key, arch)
                if hit is not None:
                    return hit               # another process compiled it while this one waited
            except BadCacheEntry as bad:
                on_warning(f"damaged cache entry {cdir} ({bad}); rebuilding it")
            if on_compile:
                on_compile(arch)
            result = run_nvcc(source, arch, nvcc)
            write_cache_entry(cdir, key, result)
            return result
    except WriteError as exc:
        raise WriteError(f"{exc}; the cubin cache must be writable: fix it or set {CACHE_ENV} to another "
                         "directory") from None
