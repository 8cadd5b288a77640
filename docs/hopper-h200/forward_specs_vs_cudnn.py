"""Forward specs against each other and SDPA's cuDNN forward, alternating in one process: for
choosing a dispatch table's entry where single `attngen bench` runs disagree.

Usage: python3 docs/hopper-h200/forward_specs_vs_cudnn.py OUT.json SHAPES SPEC [SPEC ...]
       (SHAPES: BxHxSxD,... ; each SPEC is timed in its own dtype on the shapes of its head dim)

Per shape, mask (none, causal) and dtype: every spec of that dtype and head dim and cuDNN, each
timed with `attngen bench`'s queued timing (30 calls behind a GPU sleep, input sets that defeat L2
reuse), all alternating over 5 rounds (ATTNGEN_ROUNDS=N in the environment: N); a figure is the median
of its rounds. A spec is timed on the masks it serves; ATTNGEN_ENTRY=1 adds attngen.attention (the
dispatch table's pick) to each alternation.
"""
import os
from pathlib import Path
import sys

import torch

import attngen
from attngen.eval.bench import Case, input_sets
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))   # the helpers the scripts share
from gpu_timing import alternating_sets, cudnn_forward, write_report

ROUNDS = int(os.environ.get("ATTNGEN_ROUNDS", "5"))   # rounds of the alternation
ENTRY = os.environ.get("ATTNGEN_ENTRY") == "1"         # also time attngen.attention (the table's pick)


def main(out_path, shapes, *spec_paths):
    kernels = [attngen.load(p) for p in spec_paths]
    gen, rows = torch.Generator(device="cuda"), []
    gen.manual_seed(0)
    for shape in shapes.split(","):
        b, h, s, d = map(int, shape.split("x"))
        for dtype in ("fp16", "bf16"):
            mine = [k for k in kernels if k.plan.spec.dtype == dtype and k.plan.head_dim == d]
            if not mine:
                continue
            for causal in (False, True):
                sets = input_sets(torch, Case(b, h, s, d, dtype, causal), torch.device("cuda"), gen)
                mask = "causal" if causal else "none"
                calls = {k.plan.spec.name: ((lambda q, k_, v, k=k: k(q, k_, v, causal=causal)), sets)
                         for k in mine if mask in k.plan.spec.masks}
                if ENTRY:
                    calls["attngen.attention"] = (lambda q, k_, v: attngen.attention(q, k_, v, causal=causal)), sets
                calls["sdpa:cudnn"] = cudnn_forward(causal), sets
                med, each = alternating_sets(calls, ROUNDS)
                row = {"shape": shape, "dtype": dtype, "causal": causal, "us": med, "rounds": each}
                print(f"{shape:14} {dtype} {'causal' if causal else 'none':6} "
                      + "  ".join(f"{n.replace('h100_wgmma_', '')} {t:.1f}" for n, t in med.items()), flush=True)
                rows.append(row)
                sets = None
    write_report(out_path, rows)


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
