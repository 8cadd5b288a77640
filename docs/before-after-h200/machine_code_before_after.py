"""Machine code of specs before and after a change: each spec's sources as rendered today and as an
earlier checkout generated them (OLD_GENERATED_DIR, e.g. `git archive <commit> generated | tar -x`),
compiled with attngen's nvcc flags for an sm_90 GPU (sm_90a where the kernel needs it; every spec,
L4's included, is compiled for sm_90), 16 at a time, through attngen's cubin cache (so a timing
script run after it compiles nothing). Per part: whether the sections of each function's code and
launch (.text.*, .nv.info.*, .nv.shared.*, .nv.constant0.*) are byte-identical, and the names of
those that differ; a spec that fails to render or compile gets an "error" row. Needs nvcc, no GPU.

Usage: python3 docs/before-after-h200/machine_code_before_after.py OLD_GENERATED_DIR OUT.json SPEC [SPEC ...]
"""
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from attngen.cubin import sections

COMPARED = (".text.", ".nv.info.", ".nv.shared.", ".nv.constant0.")   # each function's code and launch


def code_sections(cubin: bytes) -> dict:
    """{name: contents} of the cubin's sections that decide what runs."""
    return {name: data for name, data in sections(cubin).items() if name.startswith(COMPARED)}


def one(args):
    """One spec: its parts' machine code, today's against OLD_GENERATED_DIR's."""
    old_dir, path = args
    try:
        return compare_spec(old_dir, path)
    except Exception as exc:   # a spec this checkout cannot render or compile: say so, go on
        return {"spec": str(path), "error": f"{type(exc).__name__}: {exc}", "parts": []}


def compare_spec(old_dir, path):
    from attngen.render import render_spec_file
    from attngen.compile import compile_source
    r = render_spec_file(path)
    arch = r.plan.compile_arch("sm_90")
    res = {"spec": r.plan.spec.name, "arch": arch, "parts": []}
    for part in r.parts:
        old_path = Path(old_dir) / part.file_name
        new = compile_source(part.source, arch, on_compile=lambda a: None)
        row = {"part": part.file_name, "functions": len(new.functions)}
        if not old_path.exists():
            row["old"] = "absent"
        else:
            old = compile_source(old_path.read_text(), arch, on_compile=lambda a: None)
            a, b = code_sections(old.cubin), code_sections(new.cubin)
            row["same_code"] = a == b
            row["differs"] = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        res["parts"].append(row)
    return res


if __name__ == "__main__":
    old_dir, out = sys.argv[1], sys.argv[2]
    with ProcessPoolExecutor(16) as ex:
        rows = list(ex.map(one, [(old_dir, p) for p in sys.argv[3:]]))
    for r in rows:
        print(r["spec"], r.get("error") or " ".join(f"{p['part']}:{p.get('same_code', p.get('old'))}" for p in r["parts"]),
              flush=True)
    Path(out).write_text(json.dumps(rows, indent=1) + "\n")
