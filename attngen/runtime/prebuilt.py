"""Prebuilt cubins, the build side: a read-only store a wheel carries, so that a served cell loads
with no compile.

    attngen/prebuilt/<arch>/index.json      key -> the entry below
    attngen/prebuilt/<arch>/<key>.cubin

A wheel built where nvcc is present holds one cubin per source the dispatch table serves on sm_89
and sm_90 (sm_90a for wgmma kernels); see attngen/runtime/wheel_backend.py. compile_source reads the
store (attngen.compile.prebuilt_result: which entry counts, and why a bad one is a miss).

No file here is ever committed or written by an editable install: the store exists only in a
built wheel (or in a folder a test names with $ATTNGEN_PREBUILT_DIR).
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from .. import fsutil
from ..compile import (STORE_FORMAT, STORE_INDEX, CompileResult, bundle_jobs, compile_many, find_nvcc, nvcc_version,
                       prebuilt_key)
from ..errors import ToolError
from ..ops.dispatch import SPECS_DIR
from ..ops.table import TABLES, load_table, table_path, write_prepared
from ..shipped import VERSION
from .kernel import bundle_of

ARCHS = ("sm_89", "sm_90")                # the GPUs a wheel's store serves: L4, H100/H200


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- writing (a wheel build, or a test) -------------------------------------------------------

def write_store(folder, compiled) -> int:
    """Write the store into `folder` from `compiled`, (label, source, CompileResult) triples; returns
    how many entries it holds. Each arch's index is written last, so a store cut short reads as
    empty for that arch, not as entries without cubins."""
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
        index = {"format": STORE_FORMAT, "attngen": VERSION, "nvcc": _builder_nvcc(), "arch": arch,
                 "entries": dict(sorted(entries.items()))}
        fsutil.atomic_write_text(Path(folder) / arch / STORE_INDEX, json.dumps(index, indent=1, sort_keys=True) + "\n")
    return sum(len(e) for e in by_arch.values())


def _builder_nvcc() -> str:
    """The nvcc version that made the cubins, for people reading the index (no key holds it)."""
    try:
        return nvcc_version(find_nvcc())
    except ToolError:
        return "unknown"


def served_jobs(archs=ARCHS, specs_dir=None) -> list:
    """A CompileJob for every part of every spec the dispatch table serves on each of `archs`, for
    the target the runtime loads it as (sm_90a for wgmma kernels): what `attngen warm` compiles."""
    where = Path(specs_dir or SPECS_DIR)
    entries = load_table(table_path(where))
    jobs = []
    for arch in archs:
        for name in dict.fromkeys(e.spec for e in entries if e.arch == arch):
            plan, sources, _label = bundle_of(str(where / f"{name}.yaml"))
            jobs += bundle_jobs(plan, sources, arch, name)
    return jobs


def build_store(folder, archs=ARCHS, *, jobs=None, workers=None, say=None) -> tuple[int, list[str]]:
    """Compile `jobs` (default: served_jobs(archs)) in parallel and write the store into `folder`;
    (entries written, one line per failed compile). A failed compile leaves its cell to be compiled
    on first use, as without a store."""
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
    write_prepared(table_path(SPECS_DIR), Path(folder) / TABLES)


__all__ = ["ARCHS", "build_store", "served_jobs", "write_store", "write_table_memo"]
