"""The Hopper forward launched as a programmatic dependent, timed back to back: forward_pdl_ab.py timed each call
between its own CUDA events, and a kernel cannot be placed before an event recorded ahead of it, so that timing
could not show what the launch hides. Here each library's calls run 30 at a time between two events ("b2b"), and
again with a small torch op ahead of each call ("op": a model's attention follows its projections), queued
behind a GPU sleep, the input sets cycling past L2; the libraries alternate over the rounds, the median is kept.

"pdl": the table's pick compiled from the sources in SOURCES (the forward as generated with its part awaiting its
predecessor: `await_predecessor()` first in each entry point, the producer's `allow_dependents()` once its last
load is issued) and launched as a programmatic dependent; "plain": the same spec as generated now, launched the
usual way; "cudnn": SDPA's cuDNN forward. The two attngen kernels give the same bits (checked per cell).

Usage: python3 docs/hopper-h200/fwd_pdl/forward_pdl_b2b.py SOURCES OUT.json [ROUNDS] [long]
SOURCES holds generated/<spec>.cu of each cell's pick as generated with forward_awaits.patch (beside this script):
  git apply docs/hopper-h200/fwd_pdl/forward_awaits.patch && python3 -m attngen build && mkdir SOURCES &&
  cp generated/h100_wgmma_d*_bf16.cu SOURCES/ && git checkout -- attngen templates generated"""
from pathlib import Path
import json
import statistics
import sys

import torch

import attngen
from attngen.compile import CompileJob, compile_many
from attngen.ops import library
from attngen.runtime.calls import kernel_class
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "measurements"))
from gpu_timing import back_to_back_us, cudnn_forward, forward_pick, write_report  # noqa: E402

SHAPES = ((16, 16, 512), (8, 16, 1024), (4, 16, 2048), (2, 16, 1024), (1, 8, 2048), (1, 8, 1024), (1, 8, 512))
LONG = ((2, 16, 8192), (1, 16, 16384))   # with a fourth argument "long": these instead


def main(sources_dir, out_path, rounds="3", cells="short"):
    rows, gen = [], torch.Generator(device="cuda")
    gen.manual_seed(0)
    side = torch.randn(4096, device="cuda")
    # both sources of every pick compiled up front, many nvcc at once (the picks come from generated/ alike)
    generated = Path(attngen.__file__).resolve().parents[1] / "generated"
    compile_many([CompileJob((folder / f.name).read_text(), "sm_90a")
                  for f in sorted(Path(sources_dir).glob("*.cu")) for folder in (Path(sources_dir), generated)])
    for d in (64, 128):
        for b, h, s in (LONG if cells == "long" else SHAPES):
            for causal in (False, True):
                sets, chosen = forward_pick(b, h, s, d, causal, gen)
                q, k, v = sets[0]
                plan = chosen.plan
                awaiting = [(Path(sources_dir) / part.file_name).read_text() for part in plan.parts]
                assert all("await_predecessor();" in src for src in awaiting), "SOURCES' forward does not await"
                plain = kernel_class(plan).from_sources(plan, chosen.sources, label=chosen.label)
                pdl = kernel_class(plan).from_sources(plan, awaiting, label=f"{chosen.label}_pdl")
                for name, fn in list(pdl.functions.items()):
                    pdl.functions[name] = fn._replace(programmatic=True)
                same = bool(torch.equal(pdl(q, k, v, causal=causal), plain(q, k, v, causal=causal)))
                calls = {"pdl": lambda q, k, v: pdl(q, k, v, causal=causal),
                         "plain": lambda q, k, v: plain(q, k, v, causal=causal),
                         "cudnn": cudnn_forward(causal)}
                each = {f"{w}_{m}": [] for w in calls for m in ("b2b", "op")}
                for _ in range(int(rounds)):
                    for w, fn in calls.items():
                        each[f"{w}_b2b"].append(back_to_back_us(fn, sets))
                        each[f"{w}_op"].append(back_to_back_us(fn, sets, side))
                med = {w: statistics.median(t) for w, t in each.items()}
                row = {"shape": f"{b}x{h}x{s}x{d}", "dtype": "bf16", "causal": causal, "spec": plan.spec.name,
                       "same_bits": same, "us": med, "rounds": each,
                       "x_cudnn": {w: med[f"cudnn_{w.split('_')[1]}"] / med[w] for w in med if w[0] == "p"}}
                print(json.dumps({k: row[k] for k in ("shape", "causal", "spec", "same_bits")})[:-1],
                      *(f"{w} {t:.2f}" for w, t in med.items()), flush=True)
                rows.append(row)
                sets = None
                library._FORWARD.clear()
    write_report(out_path, rows, f"python3 docs/hopper-h200/fwd_pdl/forward_pdl_b2b.py SOURCES OUT.json {rounds}"
                 + (" long" if cells == "long" else ""))


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(*sys.argv[1:])
