"""Eager time per call of attngen.attention beside SDPA's cuDNN forward at the causal shapes the table sends to the
middle_pairs members: 50 calls back to back cycling through input sets that defeat L2 reuse, the host clock from
the first call to the synchronize after the last (host and GPU both in it, as a model's eager calls feel them);
the two calls alternating over 5 rounds, the median of the rounds. Usage:
    python3 docs/hopper-h200/middle_pairs/entry_eager.py OUT.json [SHAPES]   (SHAPES: BxHxSxD,... ; default below)
"""
import json
import statistics
import sys
import time

import torch

import attngen
from attngen.eval.bench import Case, input_sets
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "measurements"))
from gpu_timing import cudnn_forward

SHAPES = ["16x16x384x128", "8x16x640x128", "16x16x640x128", "16x16x576x128", "16x16x640x192", "16x16x640x256",
          "8x16x640x256"]
N, ROUNDS = 50, 5


def eager_us(fn, sets):
    for i in range(10):
        fn(*sets[i % len(sets)])
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(N):
        fn(*sets[i % len(sets)])
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / N * 1e6


def main(out_path, shapes=",".join(SHAPES)):
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for shape in shapes.split(","):
        b, h, s, d = map(int, shape.split("x"))
        for dtype in ("fp16", "bf16"):
            sets = input_sets(torch, Case(b, h, s, d, dtype, True), torch.device("cuda"), gen)
            calls = {"attngen.attention": lambda q, k, v: attngen.attention(q, k, v, causal=True),
                     "sdpa:cudnn": cudnn_forward(True)}
            each = {n: [] for n in calls}
            for _ in range(ROUNDS):
                for n, fn in calls.items():
                    each[n].append(eager_us(fn, sets))
            med = {n: statistics.median(t) for n, t in each.items()}
            rows.append({"shape": shape, "dtype": dtype, "causal": True, "eager_us": med, "rounds": each})
            print(f"{shape:14} {dtype} causal eager " + "  ".join(f"{n} {t:.1f}" for n, t in med.items()),
                  flush=True)
    Path(out_path).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                          "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    main(*sys.argv[1:])
