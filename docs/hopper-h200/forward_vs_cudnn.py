"""#24's short-sequence cells through `attngen.attention` (the dispatch table's pick for the call's
rows) against SDPA's cuDNN forward, alternating in one process so that the GPU's drift reaches both.

Usage: python3 docs/hopper-h200/forward_vs_cudnn.py OUT.json [ROUNDS]   (default 5 rounds)

Cells: 16x16x512, 8x16x1024, 4x16x2048, 2x16x1024, 1x8x2048, 1x8x1024, 1x8x512 (B x H x S, bhsd),
d64 and d128, fp16 and bf16, causal and not. Each round times both calls with `attngen bench`'s
queued timing (30 calls behind a GPU sleep, the median), cycling through input sets that defeat L2
reuse (bench.input_sets); a cell's figure is the median of its rounds. The spec each call ran is
the table's entry for its rows (`attngen dispatch --rows`).
"""
from pathlib import Path
import sys

import torch

import attngen
from attngen.eval.bench import Case, input_sets
from attngen.ops import library
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))   # the helpers the scripts share
from gpu_timing import alternating_sets, cudnn_forward, write_report

SHAPES = ((16, 16, 512), (8, 16, 1024), (4, 16, 2048), (2, 16, 1024), (1, 8, 2048), (1, 8, 1024), (1, 8, 512))


def picked(q, causal) -> str:
    """The spec attngen.attention ran for this call (the kernel its first call cached)."""
    b, h, s, d = q.shape
    call = (q.get_device(), q.dtype, d, causal, s, d, b * h * s)   # the cache key's fields before the route's mask
    kernel = next((k for key, k in list(library._FORWARD.items()) if key[:len(call)] == call), None)
    spec = getattr(getattr(kernel, "plan", None), "spec", None)
    return spec.name if spec is not None else "?"


def main(out_path, rounds="5"):
    rows, gen = [], torch.Generator(device="cuda")
    gen.manual_seed(0)
    for d in (64, 128):
        for dtype in ("fp16", "bf16"):
            for b, h, s in SHAPES:
                for causal in (False, True):
                    sets = input_sets(torch, Case(b, h, s, d, dtype, causal), torch.device("cuda"), gen)

                    def ours(q, k, v):
                        return attngen.attention(q, k, v, causal=causal)
                    med, each = alternating_sets({"attngen": (ours, sets), "cudnn": (cudnn_forward(causal), sets)},
                                                 int(rounds))
                    row = {"shape": f"{b}x{h}x{s}x{d}", "dtype": dtype, "causal": causal,
                           "spec": picked(sets[0][0], causal), "attngen_us": med["attngen"],
                           "cudnn_us": med["cudnn"], "x_cudnn": med["cudnn"] / med["attngen"], "rounds": each}
                    print(f"{row['shape']:14} {dtype} {'causal' if causal else 'none':6} {row['spec']:40} "
                          f"{med['attngen']:8.1f} {med['cudnn']:8.1f}  x{row['x_cudnn']:.3f}", flush=True)
                    rows.append(row)
                    sets = None
    write_report(out_path, rows, f"python3 docs/hopper-h200/forward_vs_cudnn.py OUT.json {rounds}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(*sys.argv[1:])
