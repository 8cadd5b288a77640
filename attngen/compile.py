"""nvcc: CUDA source -> cubin, its resource report, and an on-disk cubin cache that is verified on
every read.

The report comes from the cubin: registers, stack frame, static shared memory and barriers are in
its sections; only the spill byte counts are ptxas's log alone, and the cache binds those to the
cubin (see the cache entry below)."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

from . import fsutil
from .errors import AttngenError, ToolError, WriteError
from .shipped import prebuilt_dir
from .cubin import KernelFacts, kernel_facts

NVCC_FLAGS = ("-O3", "-std=c++17", "--use_fast_math", "-lineinfo", "-Xptxas=-v")
CACHE_ENV = fsutil.CACHE_ENV
CACHE_FORMAT = 3          # part of every cache key: entries of other formats are never looked up
ARCH_RE = re.compile(r"sm_[1-9][0-9]+[af]?")


class FunctionReport(NamedTuple):
    """The resources of one kernel function, as ptxas reports them."""

    # A NamedTuple, not a frozen dataclass: a first call defines this class (core.frozen says why).
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
        return self._asdict()


class CompileResult(NamedTuple):
    # A NamedTuple, not a frozen dataclass: a first call defines this class (core.frozen says why).
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
    """nvcc's release (part of every cache key). Remembered in the cache folder per nvcc binary
    (known_nvcc_version), so a process whose cubins are all cached starts no nvcc at all."""
    memo = nvcc_memo_path(nvcc)
    known = known_nvcc_version(memo) if memo is not None else None
    if known is not None:
        return known
    version = run_nvcc_version(nvcc)
    if memo is not None and VERSION_TEXT.fullmatch(version):
        try:
            fsutil.ensure_dir(memo.parent)
            fsutil.atomic_write_text(memo, version)
        except (WriteError, OSError):
            pass                            # an unwritable cache costs the next process one nvcc --version
    return version


def run_nvcc_version(nvcc: str) -> str:
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, timeout=120).stdout.decode("utf-8", "replace")
    except (OSError, subprocess.SubprocessError) as exc:
        raise ToolError(f"cannot run {nvcc} --version: {getattr(exc, 'strerror', None) or exc}") from None
    m = re.search(r"release [\d.]+, V([\d.]+)", out)
    return m.group(1) if m else out.strip().splitlines()[-1] if out.strip() else "unknown"


NVCC_MEMO = "nvcc"                    # <cache_dir>/nvcc/<binary's identity>: the release it reported
VERSION_TEXT = re.compile(r"[0-9][0-9A-Za-z.+-]{0,63}")


def nvcc_memo_path(nvcc: str) -> Path | None:
    """Where nvcc_version remembers the release of the binary `nvcc` is now: named by the hash of its
    resolved path, inode, size and modification time, so a reinstalled or replaced toolkit (a new
    binary) is asked again. None when the binary cannot be looked at (nvcc_version then runs it)."""
    try:
        real = os.path.realpath(nvcc)
        st = os.stat(real)
    except (OSError, ValueError):
        return None
    identity = f"{real}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}"
    return cache_dir() / NVCC_MEMO / hashlib.sha256(identity.encode()).hexdigest()[:32]


def known_nvcc_version(memo: Path) -> str | None:
    """The release remembered at `memo`, when it holds one (a version number, nothing else)."""
    try:
        text = fsutil.utf8_text(fsutil.read_regular(memo, 64)).strip()
    except (OSError, fsutil.ReadRefused, ValueError):
        return None
    return text if VERSION_TEXT.fullmatch(text) else None


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


def report_from_cubin(cubin: bytes, log: str) -> tuple[FunctionReport, ...]:
    """One report per kernel of `cubin`, from its sections, with the spill byte counts of `log`
    (ptxas's output of the same compile; a kernel it does not name has none). ValueError when
    the cubin is malformed."""
    spills = {f.name: (f.spill_stores, f.spill_loads) for f in parse_ptxas(log)}
    return tuple(_report(facts, *spills.get(name, (0, 0))) for name, facts in sorted(kernel_facts(cubin).items()))


def _report(facts: KernelFacts, spill_stores: int, spill_loads: int) -> FunctionReport:
    return FunctionReport(facts.name, facts.registers, spill_stores, spill_loads, facts.stack_bytes,
                          facts.smem_bytes, facts.barriers)


# What a source promises its cubin holds: the kernels it defines (extern "C", so a kernel's name
# in the cubin is its name in the source) and, for those taking the Params struct by value (every
# generated kernel), a single parameter of the size the source's static_assert gives (core/abi.py).
# Anchored at the start of a line, so a comment cannot declare a kernel.
_KERNEL = re.compile(r'^extern\s+"C"\s+__global__\s+void\b(?:\s+__launch_bounds__\s*\((?:[^()]|\([^()]*\))*\))?'
                     r'\s+(\w+)\s*\(([^()]*)\)', re.M)
_PARAMS_SIZE = re.compile(r"^\s*static_assert\(sizeof\(Params\) == (\d+)\b", re.M)
_TAKES_PARAMS = re.compile(r"^\s*const\s+(?:__grid_constant__\s+)?(?:\w+::)*Params\s+\w+\s*$")


def source_kernels(source: str) -> dict[str, int | None]:
    """kernel name -> the size of its one Params parameter (None: a kernel that takes other
    parameters, whose layout is not checked) for every extern "C" kernel `source` defines."""
    sizes = {int(m.group(1)) for m in _PARAMS_SIZE.finditer(source)}
    size = sizes.pop() if len(sizes) == 1 else None
    return {m.group(1): size if _TAKES_PARAMS.match(m.group(2)) else None for m in _KERNEL.finditer(source)}


def plan_mismatch(cubin_kernels: dict[str, KernelFacts], source: str) -> str | None:
    """Why a cubin is not the one `source` compiles to (its kernels or their Params layout), or
    None. A cubin copied from another source's entry, whole manifest and all, fails here."""
    expected = source_kernels(source)
    if set(cubin_kernels) != set(expected):
        return (f"its kernels ({', '.join(sorted(cubin_kernels)) or 'none'}) are not the source's "
                f"({', '.join(sorted(expected)) or 'none'})")
    for name, size in sorted(expected.items()):
        params = cubin_kernels[name].params
        sizes = [s for _offset, s in params]
        if size is not None and sizes != [size]:
            return f"kernel {name} takes {sizes} bytes of parameters, not the source's Params of {size}"
    return None


def cache_dir() -> Path:
    return fsutil.cache_dir()


def cache_key(source: str, arch: str, nvcc: str) -> str:
    h = hashlib.sha256()
    for part in (f"cache format {CACHE_FORMAT}", source, arch, nvcc_version(nvcc), " ".join(NVCC_FLAGS)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


# -- the cache entry: <cache_dir>/<key>/{kernel.cubin, ptxas.log, manifest.json, .lock} -----------
#
# kernel.cubin and ptxas.log are written first, each atomically, then manifest.json, which records
# their sizes and sha256, the report, and entry_sha256: the hash of all of that together, key
# included. An entry counts only when the manifest is whole and both files match it, the cubin is
# the one this source compiles to (its kernels and their Params), the report's resources are the
# cubin's and the log's report is the same; a damaged entry is reported and rebuilt, never used.
# The .lock file serialises the compile and store of one key across processes, so concurrent
# compiles of one source run nvcc once. Every file is read as a regular file of bounded size, and
# an entry that is a link is damaged: a read never blocks, never runs on, and never leaves the cache.

CUBIN, LOG, MANIFEST, LOCK = "kernel.cubin", "ptxas.log", "manifest.json", ".lock"
READ_LIMIT = {MANIFEST: 1 << 20, CUBIN: 256 << 20, LOG: 16 << 20}
MANIFEST_DEPTH = 8           # the manifest nests 3 deep (entry, report, function)
REPORT_FIELDS = FunctionReport._fields


class BadCacheEntry(Exception):
    """A cache entry that must not be used; the message says why."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_file(path: Path) -> bytes:
    try:
        return fsutil.read_regular(path, READ_LIMIT[path.name])
    except FileNotFoundError:
        raise BadCacheEntry(f"{path.name} is missing") from None
    except fsutil.ReadRefused as exc:
        raise BadCacheEntry(str(exc)) from None
    except OSError as exc:
        raise BadCacheEntry(f"cannot read {path.name}: {fsutil.reason(exc)}") from None


def _entry_sha256(manifest: dict) -> str:
    """The hash that binds every field of the manifest (the cubin's and log's hashes, the key and
    the report) into one: a manifest edited in one place no longer matches it."""
    fields = {k: v for k, v in manifest.items() if k != "entry_sha256"}
    return _sha256(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode())


def _manifest(raw: bytes) -> dict:
    """The manifest's fields, checked for shape; BadCacheEntry when it is not a valid manifest."""
    try:
        text = raw.decode("utf-8")
        if fsutil.json_deeper_than(text, MANIFEST_DEPTH):
            raise ValueError("nested too deep")
        m = json.loads(text)
        ints = [m[k] for k in ("format", "cubin_bytes", "log_bytes", "functions")]
        strs = [m[k] for k in ("key", "arch", "cubin_sha256", "log_sha256", "entry_sha256")]
        report = tuple(_function_report(f) for f in m["report"])
    except (UnicodeDecodeError, ValueError, TypeError, KeyError, AttributeError, RecursionError):
        raise BadCacheEntry(f"{MANIFEST} is not a valid manifest") from None
    if not all(type(v) is int for v in ints) or not all(isinstance(v, str) for v in strs):
        raise BadCacheEntry(f"{MANIFEST} is not a valid manifest")
    return {**m, "report": report}


def _function_report(d: dict) -> FunctionReport:
    if set(d) != set(REPORT_FIELDS) or not isinstance(d["name"], str) or \
            not all(type(d[k]) is int and d[k] >= 0 for k in REPORT_FIELDS if k != "name"):
        raise ValueError("not a function report")
    return FunctionReport(**d)


def _read_manifest(cdir: Path) -> bytes | None:
    """The manifest's bytes; None when the entry does not exist or holds nothing yet."""
    if cdir.is_symlink():
        raise BadCacheEntry("the entry is a symbolic link, not a directory")
    try:
        return fsutil.read_regular(cdir / MANIFEST, READ_LIMIT[MANIFEST])
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
    except fsutil.ReadRefused as exc:
        raise BadCacheEntry(str(exc)) from None
    except OSError as exc:
        raise BadCacheEntry(f"cannot read {MANIFEST}: {fsutil.reason(exc)}") from None


def _check_cubin(cubin: bytes, report: tuple[FunctionReport, ...], source: str) -> None:
    """The cubin is this source's, and the report's resources are the ones it records."""
    if cubin[:4] != b"\x7fELF":
        raise BadCacheEntry(f"{CUBIN} is not an ELF file")
    try:
        facts = kernel_facts(cubin)
    except ValueError as exc:
        raise BadCacheEntry(f"{CUBIN} is not a readable cubin ({exc})") from None
    why = plan_mismatch(facts, source)
    if why:
        raise BadCacheEntry(f"{CUBIN} is not this source's: {why}")
    spills = {f.name: (f.spill_stores, f.spill_loads) for f in report}
    if set(spills) != set(facts) or \
            tuple(sorted(report, key=lambda f: f.name)) != tuple(_report(facts[n], *spills[n]) for n in sorted(facts)):
        raise BadCacheEntry(f"the report in {MANIFEST} is not the one {CUBIN} records")


def read_cache_entry(cdir: Path, key: str, arch: str, source: str) -> CompileResult | None:
    """The verified result stored in `cdir` for `source`, None when there is no entry;
    BadCacheEntry when the entry is damaged, incomplete, does not match its manifest, or holds
    another source's cubin."""
    raw = _read_manifest(cdir)
    if raw is None:
        return None
    m = _manifest(raw)
    if (m["format"], m["key"], m["arch"]) != (CACHE_FORMAT, key, arch):
        raise BadCacheEntry(f"{MANIFEST} describes another entry")
    if m["entry_sha256"] != _entry_sha256({**m, "report": [f.as_dict() for f in m["report"]]}):
        raise BadCacheEntry(f"{MANIFEST} does not match its own entry hash (edited?)")
    cubin = _read_file(cdir / CUBIN)
    log_bytes = _read_file(cdir / LOG)
    for name, data, size, sha in ((CUBIN, cubin, m["cubin_bytes"], m["cubin_sha256"]),
                                  (LOG, log_bytes, m["log_bytes"], m["log_sha256"])):
        if len(data) != size or _sha256(data) != sha:
            raise BadCacheEntry(f"{name} has {len(data)} bytes and does not match the {size} bytes recorded "
                                f"in {MANIFEST}")
    report = m["report"]
    if len(report) != m["functions"]:
        raise BadCacheEntry(f"{MANIFEST} reports {len(report)} kernel function(s) and counts {m['functions']}")
    _check_cubin(cubin, report, source)
    try:
        log = log_bytes.decode("utf-8")
    except UnicodeDecodeError:
        raise BadCacheEntry(f"{LOG} is not UTF-8 text") from None
    if sorted(parse_ptxas(log), key=lambda f: f.name) != sorted(report, key=lambda f: f.name):
        raise BadCacheEntry(f"{LOG} does not report what {CUBIN} and {MANIFEST} record")
    return CompileResult(arch, cubin, report, log, True)


def _clear_odd_files(cdir: Path) -> None:
    """Remove what stands at the entry's file names and is not a regular file within its size
    limit: a directory cannot be renamed over, and the atomic write reads the old file (to restore
    it on failure), which must not mean a link's target or gigabytes."""
    for name in (CUBIN, LOG, MANIFEST):
        path = cdir / name
        try:
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(path)
            elif not stat.S_ISREG(st.st_mode) or st.st_size > READ_LIMIT[name]:
                os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise WriteError(f"cannot remove {path}: {fsutil.reason(exc)}") from None


def write_cache_entry(cdir: Path, key: str, result: CompileResult) -> None:
    """Store a fresh result: both files atomically, then the manifest that makes them an entry."""
    log_bytes = result.log.encode("utf-8")
    manifest = {"format": CACHE_FORMAT, "key": key, "arch": result.arch,
                "cubin_bytes": len(result.cubin), "cubin_sha256": _sha256(result.cubin),
                "log_bytes": len(log_bytes), "log_sha256": _sha256(log_bytes),
                "functions": len(result.functions), "report": [f.as_dict() for f in result.functions]}
    manifest["entry_sha256"] = _entry_sha256(manifest)
    fsutil.ensure_dir(cdir)
    _clear_odd_files(cdir)
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
    """An entry path that is a file or a link (dangling, or to a directory elsewhere) is a damaged
    entry: report it and remove it, so that the entry can be rebuilt as a directory of the cache,
    not written through the link. Only a failed removal is an error."""
    # lexists first: checked the other way round, another thread creating the directory between
    # the two checks made a fresh entry look like a file.
    if not os.path.lexists(cdir) or (cdir.is_dir() and not cdir.is_symlink()):
        return
    kind = "a symbolic link" if cdir.is_symlink() else "a file"
    try:
        os.unlink(cdir)
    except (FileNotFoundError, IsADirectoryError):
        return                               # another thread or process removed it, or made it the entry
    except OSError as exc:
        raise WriteError(f"cannot remove {cdir}: {fsutil.reason(exc)}") from None
    on_warning(f"damaged cache entry {cdir} (the entry is {kind}, not a directory); rebuilding it")


def clear_odd_lock(cdir: Path, on_warning) -> None:
    """A .lock that is not a regular file (a FIFO, a device, a link out of the cache) is removed
    before it is opened: the lock is opened for writing, and created through a dangling link."""
    try:
        mode = os.lstat(cdir / LOCK).st_mode
    except OSError:
        return
    if stat.S_ISREG(mode):
        return
    try:
        os.unlink(cdir / LOCK)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise WriteError(f"cannot remove {cdir / LOCK}: {fsutil.reason(exc)}") from None
    on_warning(f"damaged cache entry {cdir} ({LOCK} is not a regular file); removed it")


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
    try:
        functions = report_from_cubin(cubin, log)
    except ValueError as exc:
        raise ToolError(f"nvcc wrote a cubin for {arch} that cannot be read: {exc}") from None
    return CompileResult(arch, cubin, functions, log, False)


# -- the prebuilt store a wheel carries: <store>/<arch>/{index.json, <key>.cubin} ------------------
#
# attngen/runtime/prebuilt.py writes it (a wheel build); compile_source reads it here before its
# user cache and before it needs nvcc. An entry counts only when its source hash and arch are the
# asked ones, the cubin's bytes hash to the index's sha256, and it passes the user cache's own
# checks (the source's kernels and Params size, the report the cubin records); anything else is a
# miss, never an error, and the caller compiles as it would without the store.

STORE_FORMAT = 1
STORE_INDEX = "index.json"
STORE_INDEX_LIMIT = 16 << 20              # ~120 entries with their ptxas logs take well under 1 MiB
STORE_INDEX_DEPTH = 6                     # index, entries, entry, report, function
STORE_CUBIN_LIMIT = READ_LIMIT[CUBIN]     # as the user cache's


def prebuilt_key(source: str, arch: str) -> str:
    """A store entry's name: the source, the arch, nvcc's flags and the cache format. Unlike the user
    cache's key it leaves out the nvcc version: the cubin was made by the wheel builder's nvcc,
    which the user's machine may not have at all."""
    h = hashlib.sha256()
    for part in (f"prebuilt, cache format {CACHE_FORMAT}", source, arch, " ".join(NVCC_FLAGS)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def prebuilt_result(source: str, arch: str) -> CompileResult | None:
    """The cubin a wheel ships for `source` on `arch` (cached=True), or None: no store, no entry, or
    an entry that fails any check. Never raises for what the store holds."""
    folder = prebuilt_dir() / arch
    try:
        entries = _store_index(folder)
        if not entries:
            return None
        key = prebuilt_key(source, arch)
        entry = entries.get(key)
        if entry is None:
            return None
        return _store_entry(folder, key, entry, source, arch)
    except (BadCacheEntry, OSError, fsutil.ReadRefused, ValueError, TypeError, KeyError, AttributeError):
        return None


def _store_index(folder: Path) -> dict:
    """The entries of `folder`'s index, read once per process per version of the file ({} when
    there is none or it is not an index)."""
    try:
        st = os.stat(folder / STORE_INDEX)
    except OSError:
        return {}
    return _read_store_index(str(folder), st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=8)
def _read_store_index(folder: str, _mtime_ns: int, _size: int) -> dict:
    try:
        text = fsutil.utf8_text(fsutil.read_regular(Path(folder) / STORE_INDEX, STORE_INDEX_LIMIT))
        if fsutil.json_deeper_than(text, STORE_INDEX_DEPTH):
            return {}
        index = json.loads(text)
    except (OSError, fsutil.ReadRefused, ValueError, RecursionError):
        return {}
    if not isinstance(index, dict) or index.get("format") != STORE_FORMAT or not isinstance(index.get("entries"), dict):
        return {}
    return index["entries"]


def _store_entry(folder: Path, key: str, entry: dict, source: str, arch: str) -> CompileResult | None:
    """The entry as a CompileResult when it is exactly this source's on this arch and its cubin is
    the one the index hashed and the source compiles to; None otherwise."""
    if entry["source_sha256"] != _sha256(source.encode()) or entry["arch"] != arch:
        return None
    cubin = fsutil.read_regular(folder / f"{key}.cubin", STORE_CUBIN_LIMIT)
    if _sha256(cubin) != entry["cubin_sha256"]:
        return None
    report = tuple(_function_report(f) for f in entry["report"])
    log = entry["log"]
    if not isinstance(log, str):
        return None
    _check_cubin(cubin, report, source)          # the user cache's checks: kernels, Params, report
    if sorted(parse_ptxas(log), key=lambda f: f.name) != sorted(report, key=lambda f: f.name):
        return None
    return CompileResult(arch, cubin, report, log, True)


def compile_source(source: str, arch: str, *, use_cache: bool = True, on_compile=None,
                   on_warning=_warn) -> CompileResult:
    """Compile CUDA source to a cubin for `arch` (e.g. sm_89). Cached by source, arch, nvcc, flags.

    `on_compile(arch)` is called before nvcc actually runs (a cache miss), so callers can say so;
    `on_warning(message)` hears of a damaged cache entry that is being rebuilt (default: a line on
    stderr). Writing the cache is part of the job: a cache that cannot be written is a WriteError.
    Concurrent calls for one source, in threads or processes, run nvcc once and share the entry.
    A cubin the wheel ships for the source (prebuilt_result) is taken first, with no nvcc at all.
    """
    if not ARCH_RE.fullmatch(arch):
        raise ToolError(f"--arch must look like sm_89 or sm_90a (got {arch!r})")
    if use_cache:
        shipped = prebuilt_result(source, arch)
        if shipped is not None:
            return shipped
    nvcc = find_nvcc()
    if not use_cache:
        if on_compile:
            on_compile(arch)
        return run_nvcc(source, arch, nvcc)
    key = cache_key(source, arch, nvcc)
    cdir = cache_dir() / key
    try:
        hit = read_cache_entry(cdir, key, arch, source)
        if hit is not None:
            return hit
    except BadCacheEntry:
        pass                                 # looked at again under the lock: it may be being written
    try:
        clear_non_directory_entry(cdir, on_warning)
        fsutil.ensure_dir(cdir)
        clear_odd_lock(cdir, on_warning)
        with fsutil.locked(cdir / LOCK):
            try:
                hit = read_cache_entry(cdir, key, arch, source)
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


# -- many compiles at once ------------------------------------------------------------------------
#
# nvcc is the work: each compile is a child process, and the Python around it (a cache lookup, the
# report) is small. So a pool of threads, each waiting on its own nvcc, keeps every core busy;
# unlike a pool of interpreters it starts at once, re-imports nothing, and is safe in a process
# that already holds a CUDA context (verify, bench and sweep compile after torch has one).

JOBS_ENV = "ATTNGEN_JOBS"            # how many nvcc at once (default: the CPUs this process may use)
PROGRESS_ENV = "ATTNGEN_PROGRESS"    # "1": draw the progress bar off a terminal too (a CI log); "0": never
MAX_JOBS = 256
DEFAULT_JOBS_CAP = 32                # an nvcc of a large kernel holds up to ~1 GB: past this, memory, not cores, limits


class CompileJob(NamedTuple):
    """One source to compile for one arch; `label` names it in messages (a spec and its part)."""

    # A NamedTuple, not a frozen dataclass: a first call defines this class (core.frozen says why).
    source: str
    arch: str
    label: str = ""


class CompileBatch(NamedTuple):
    """What compile_many did: per job, in the jobs' order, its CompileResult or the AttngenError
    that stopped it."""

    # A NamedTuple, not a frozen dataclass: a first call defines this class (core.frozen says why).
    jobs: tuple[CompileJob, ...]
    results: tuple
    workers: int
    seconds: float

    @property
    def cached(self) -> int:
        return sum(isinstance(r, CompileResult) and r.cached for r in self.results)

    @property
    def errors(self) -> list[tuple[CompileJob, Exception]]:
        return [(j, r) for j, r in zip(self.jobs, self.results) if not isinstance(r, CompileResult)]

    def summary(self) -> str:
        failed = len(self.errors)
        ran = len(self.jobs) > self.cached      # nvcc ran at all (else "on N processes" would be untrue)
        return (f"compiled {len(self.jobs)} source{'s' if len(self.jobs) != 1 else ''} ({self.cached} cached"
                + (f", {failed} failed" if failed else "") + f") in {self.seconds:.1f} s"
                + (f" on {self.workers} process{'es' if self.workers != 1 else ''}" if ran else ""))

    def raise_errors(self) -> None:
        """One error for the batch: an unwritable cache as itself (every job fails alike), else the
        first failure with its label and how many more failed."""
        errors = self.errors
        if not errors:
            return
        for _job, exc in errors:
            if isinstance(exc, WriteError):
                raise exc
        job, exc = errors[0]
        more = f" ({len(errors) - 1} more failed: {', '.join(j.label or j.arch for j, _ in errors[1:4])}" \
               f"{', ...' if len(errors) > 4 else ''})" if len(errors) > 1 else ""
        first, _, log = str(exc).partition("\n")
        raise ToolError(f"{job.label or 'a source'}: {first}{more}" + (f"\n{log}" if log else "")) from None


def default_jobs() -> int:
    """nvcc processes at once: $ATTNGEN_JOBS, else the CPUs this process may run on (its affinity,
    which a container or taskset narrows; os.cpu_count() counts the whole host), capped."""
    value = os.environ.get(JOBS_ENV, "").strip()
    if value:
        if not value.isdigit() or not 1 <= int(value) <= MAX_JOBS:
            raise AttngenError(f"{JOBS_ENV} must be a whole number from 1 to {MAX_JOBS} (got {value!r})")
        return int(value)
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, DEFAULT_JOBS_CAP))


def show_progress(asked: bool | None = None) -> bool:
    """Draw the bar when asked, else as $ATTNGEN_PROGRESS says, else when stderr is a terminal
    (a log file would get one line per redraw)."""
    if asked is not None:
        return asked
    env = os.environ.get(PROGRESS_ENV, "").strip()
    if env in ("0", "1"):
        return env == "1"
    return sys.stderr.isatty()


def cached_result(source: str, arch: str, nvcc: str) -> CompileResult | None:
    """The cache's verified entry for `source` on `arch`, or None (a miss, or an entry compile_source
    must look at again under its lock: damaged, or being written)."""
    key = cache_key(source, arch, nvcc)
    try:
        return read_cache_entry(cache_dir() / key, key, arch, source)
    except BadCacheEntry:
        return None


def compile_many(jobs, *, workers: int | None = None, progress: bool | None = None,
                 on_done=None) -> CompileBatch:
    """Compile every job through the cubin cache, `workers` nvcc at a time (default: default_jobs()).

    Cache hits are read here and never reach the pool; a source given twice compiles once. A job
    that fails leaves its error in the batch and the others go on (raise_errors() makes it one
    error). `progress` draws one bar on stderr with counts, rate and time left (see show_progress).
    `on_done(index, result_or_error)` hears of each job as it ends, from the calling thread.
    """
    start = time.monotonic()
    jobs = tuple(jobs)
    workers = min(workers or default_jobs(), MAX_JOBS)
    results: list = [None] * len(jobs)
    pending: dict[tuple[str, str], list[int]] = {}   # (source, arch) -> the jobs it answers
    shipped = [prebuilt_result(job.source, job.arch) if ARCH_RE.fullmatch(job.arch) else None for job in jobs]
    # No nvcc is one error for the batch, not one per job; a batch the wheel's cubins answer needs none.
    nvcc = find_nvcc() if any(r is None for r in shipped) else None
    for i, job in enumerate(jobs):
        hit = shipped[i] or (cached_result(job.source, job.arch, nvcc) if ARCH_RE.fullmatch(job.arch) else None)
        if hit is not None:
            results[i] = hit
            if on_done:
                on_done(i, hit)
        else:
            pending.setdefault((job.source, job.arch), []).append(i)
    for arch in {arch for _source, arch in pending if ARCH_RE.fullmatch(arch)}:
        _source_name_flags(nvcc, arch)  # asked once here, not by every worker at once
    workers = max(1, min(workers, len(pending)))
    if pending:
        # Only when something compiles: a batch the cache serves, and a process that never batches (a
        # first call), imports neither.
        from concurrent.futures import ThreadPoolExecutor, as_completed
        from tqdm import tqdm
        with tqdm(total=len(pending), desc="compiling", unit="src", file=sys.stderr, dynamic_ncols=True,
                  disable=not show_progress(progress)) as bar:
            def warn(message):
                bar.write(f"attngen: {message}", file=sys.stderr)

            def one(job):
                try:
                    return compile_source(job.source, job.arch, on_warning=warn)
                except AttngenError as exc:
                    return exc
            pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="attngen-nvcc")
            try:
                futures = {pool.submit(one, jobs[idx[0]]): idx for idx in pending.values()}
                for fut in as_completed(futures):
                    idx = futures[fut]
                    result = fut.result()
                    for i in idx:
                        results[i] = result
                        if on_done:
                            on_done(i, result)
                    bar.set_postfix_str(jobs[idx[0]].label, refresh=False)
                    bar.update(1)
            finally:
                # On an error or Ctrl-C, the queued compiles are dropped, not run to the end first;
                # the running ones finish (an nvcc cannot be taken back from its thread).
                pool.shutdown(wait=True, cancel_futures=True)
    return CompileBatch(jobs, tuple(results), workers, time.monotonic() - start)


def bundle_jobs(plan, sources, gpu_arch: str, label: str) -> list[CompileJob]:
    """The jobs of one spec's bundle for a GPU of `gpu_arch`: each part its own job, so a bundle's
    parts compile at once; the arch is the one the runtime loads (plan.compile_arch: sm_90a for
    wgmma). ValueError when the spec cannot run on that arch."""
    arch = plan.compile_arch(gpu_arch)
    sources = tuple(sources)
    return [CompileJob(source, arch, f"{label} ({part.name})" if len(sources) > 1 else label)
            for part, source in zip(plan.parts, sources)]


def jobs_per_bundle(bundles, gpu_arch: str) -> list[list[CompileJob]]:
    """Each (plan, sources, label) bundle's jobs for a GPU of `gpu_arch` (bundle_jobs); none for a spec
    that cannot run on that arch, which its load then says."""
    per_bundle = []
    for plan, sources, label in bundles:
        try:
            per_bundle.append(bundle_jobs(plan, sources, gpu_arch, label))
        except ValueError:
            per_bundle.append([])
    return per_bundle


def precompile(bundles, gpu_arch: str, *, workers: int | None = None, progress: bool | None = None) -> CompileBatch:
    """Compile every (plan, sources, label) bundle for a GPU of `gpu_arch` in one parallel batch, so
    that loading them afterwards (Kernel.from_sources) finds every cubin in the cache. A spec that
    cannot run on the arch is left to its load, which says so; a failed compile is one ToolError."""
    jobs = [job for jobs_of_one in jobs_per_bundle(bundles, gpu_arch) for job in jobs_of_one]
    batch = compile_many(jobs, workers=workers, progress=progress)
    batch.raise_errors()
    return batch


def print_summary(batch: CompileBatch) -> None:
    """The batch's one summary line, on stderr (where the bar was)."""
    print(batch.summary(), file=sys.stderr, flush=True)
