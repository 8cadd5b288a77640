"""Prebuilt cubins: a read-only store a wheel carries, so that a served cell loads with no compile.

    attngen/prebuilt/<arch>/index.json      key -> the entry below
    attngen/prebuilt/<arch>/<key>.cubin

A wheel built where nvcc is present holds one cubin per source the dispatch table serves on sm_89
and sm_90 (sm_90a for wgmma kernels); see attngen/runtime/wheel_backend.py. compile_source looks here
before its user cache and before it needs nvcc. An entry counts only when its source hash and arch
are the asked ones, the cubin's bytes hash to the index's sha256, and it passes the user cache's
own checks (the source's kernels and Params size, the report the cubin records); anything else is
a miss, never an error, and the caller compiles as it would without the store.

No file here is ever committed or written by an editable install: the store exists only in a
built wheel (or in a folder a test names with $ATTNGEN_PREBUILT_DIR).
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from functools import lru_cache
from pathlib import Path

from .. import fsutil
from ..shipped import PREBUILT_ENV, prebuilt_dir

STORE_FORMAT = 1
INDEX = "index.json"
INDEX_LIMIT = 16 << 20                    # ~120 entries with their ptxas logs take well under 1 MiB
INDEX_DEPTH = 6                           # index, entries, entry, report, function
CUBIN_LIMIT = 256 << 20                   # as the user cache's
ARCHS = ("sm_89", "sm_90")                # the GPUs a wheel's store serves: L4, H100/H200


def store_dir() -> Path:
    """$ATTNGEN_PREBUILT_DIR, else attngen/prebuilt (attngen.shipped.prebuilt_dir)."""
    return prebuilt_dir()


def prebuilt_key(source: str, arch: str) -> str:
    """The entry's name: the source, the arch, nvcc's flags and the cache format. Unlike the user
    cache's key it leaves out the nvcc version: the cubin was made by the wheel builder's nvcc,
    which the user's machine may not have at all."""
    from ..compile import CACHE_FORMAT, NVCC_FLAGS
    h = hashlib.sha256()
    for part in (f"prebuilt, cache format {CACHE_FORMAT}", source, arch, " ".join(NVCC_FLAGS)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- reading ----------------------------------------------------------------------------------

def lookup(source: str, arch: str):
    """The store's CompileResult for `source` on `arch` (cached=True), or None: no store, no entry,
    or an entry that fails any check. Never raises for what the store holds."""
    from ..compile import BadCacheEntry
    folder = store_dir() / arch
    try:
        entries = _index(folder)
        if not entries:
            return None
        key = prebuilt_key(source, arch)
        entry = entries.get(key)
        if entry is None:
            return None
        return _checked(folder, key, entry, source, arch)
    except (BadCacheEntry, OSError, fsutil.ReadRefused, ValueError, TypeError, KeyError, AttributeError):
        return None


def _index(folder: Path) -> dict:
    """The entries of `folder`'s index, read once per process per version of the file ({} when
    there is none or it is not an index)."""
    try:
        st = os.stat(folder / INDEX)
    except OSError:
        return {}
    return _read_index(str(folder), st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=8)
def _read_index(folder: str, _mtime_ns: int, _size: int) -> dict:
    try:
        text = fsutil.utf8_text(fsutil.read_regular(Path(folder) / INDEX, INDEX_LIMIT))
        if fsutil.json_deeper_than(text, INDEX_DEPTH):
            return {}
        index = json.loads(text)
    except (OSError, fsutil.ReadRefused, ValueError, RecursionError):
        return {}
    if not isinstance(index, dict) or index.get("format") != STORE_FORMAT or not isinstance(index.get("entries"), dict):
        return {}
    return index["entries"]


def _checked(folder: Path, key: str, entry: dict, source: str, arch: str):
    """The entry as a CompileResult when it is exactly this source's on this arch and its cubin is
    the one the index hashed and the source compiles to; None otherwise."""
    from ..compile import CompileResult, _check_cubin, _function_report, parse_ptxas
    if entry["source_sha256"] != _sha256(source.encode()) or entry["arch"] != arch:
        return None
    cubin = fsutil.read_regular(folder / f"{key}.cubin", CUBIN_LIMIT)
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


# -- writing (a wheel build, or a test) -------------------------------------------------------

def write_store(folder, compiled) -> int:
    """Write the store into `folder` from `compiled`, (label, source, CompileResult) triples; returns
    how many entries it holds. Each arch's index is written last, so a store cut short reads as
    empty for that arch, not as entries without cubins."""
    from .. import __version__
    by_arch: dict[str, dict] = {}
    for label, source, result in compiled:
        key = prebuilt_key(source, result.arch)
        arch_dir = fsutil.ensure_dir(Path(folder) / result.arch)
        fsutil.atomic_write_bytes(arch_dir / f"{key}.cubin", result.cubin)
        by_arch.setdefault(result.arch, {})[key] = {
            "label": label, "arch": result.arch, "source_sha256": _sha256(source.encode()),
            "cubin_sha256": _sha256(result.cubin), "cubin_bytes": len(result.cubin),
            "report": [f.as_dict() for f in result.functions], "log": result.log}
    for arch, entries in by_arch.items():
        index = {"format": STORE_FORMAT, "attngen": __version__, "nvcc": _builder_nvcc(), "arch": arch,
                 "entries": dict(sorted(entries.items()))}
        fsutil.atomic_write_text(Path(folder) / arch / INDEX, json.dumps(index, indent=1, sort_keys=True) + "\n")
    return sum(len(e) for e in by_arch.values())


def _builder_nvcc() -> str:
    """The nvcc version that made the cubins, for people reading the index (no key holds it)."""
    from ..compile import find_nvcc, nvcc_version
    from ..errors import ToolError
    try:
        return nvcc_version(find_nvcc())
    except ToolError:
        return "unknown"


def served_jobs(archs=ARCHS, specs_dir=None) -> list:
    """A CompileJob for every part of every spec the dispatch table serves on each of `archs`, for
    the target the runtime loads it as (sm_90a for wgmma kernels): what `attngen warm` compiles."""
    from ..compile import bundle_jobs
    from ..ops.dispatch import SPECS_DIR
    from ..ops.table import load_table, table_path
    from .kernel import render_bundle
    where = Path(specs_dir or SPECS_DIR)
    entries = load_table(table_path(where))
    jobs = []
    for arch in archs:
        for name in dict.fromkeys(e.spec for e in entries if e.arch == arch):
            plan, sources, _label = render_bundle(str(where / f"{name}.yaml"))
            jobs += bundle_jobs(plan, sources, arch, name)
    return jobs


def build_store(folder, archs=ARCHS, *, jobs=None, workers=None, say=None) -> tuple[int, list[str]]:
    """Compile `jobs` (default: served_jobs(archs)) in parallel and write the store into `folder`;
    (entries written, one line per failed compile). A failed compile leaves its cell to be compiled
    on first use, as without a store."""
    from ..compile import CompileResult, compile_many
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    jobs = served_jobs(archs) if jobs is None else list(jobs)
    say(f"attngen: prebuilding {len(jobs)} cubins for {', '.join(archs)} (ATTNGEN_PREBUILD=0 skips this)")
    batch = compile_many(jobs, workers=workers)
    say(f"attngen: {batch.summary()}")
    written = write_store(folder, [(j.label, j.source, r) for j, r in zip(batch.jobs, batch.results)
                                   if isinstance(r, CompileResult)])
    failed = [f"{j.label} ({j.arch}): {str(e).partition(chr(10))[0]}" for j, e in batch.errors]
    write_table_memo(folder)
    return written, failed


def write_table_memo(folder) -> None:
    """The shipped dispatch table, parsed and checked here, into <folder>/tables: a process of the
    installed wheel reads it instead of parsing the YAML on its first call (attngen.ops.table)."""
    from ..ops.dispatch import SPECS_DIR
    from ..ops.table import TABLES, table_path, write_prepared
    write_prepared(table_path(SPECS_DIR), Path(folder) / TABLES)


__all__ = ["ARCHS", "PREBUILT_ENV", "build_store", "lookup", "prebuilt_key", "served_jobs", "store_dir",
           "write_store"]
