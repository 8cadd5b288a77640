"""MLA decode through attngen.attention_with_kvcache (bf16, one latent cache of 576 columns, V its first 512, the
table's cell: the seesaw at these shapes), each call eager, back to back, host included (attngen.eval.bench's
time_eager: `calls` calls and the synchronize after them, per call), several caches in rotation past the L2; the
median of ROUNDS. Run once per template (the script that ran it swaps the template between runs).
Usage: python3 docs/decode-h200/mla_seesaw/peel/eager_ab.py OUT.json [ROUNDS]"""
import json
import math
import sys

import torch

import attngen
from attngen.eval.bench.timing import time_eager

D, DV = 576, 512
SHAPES = ((32, 128, 4096), (16, 128, 16384), (8, 128, 8192), (128, 128, 1024))


def main():
    out_path, rounds = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 5
    rows = []
    for b, h, keys in SHAPES:
        q = torch.randn((b, 1, h, D), device="cuda", dtype=torch.bfloat16)
        copies = max(2, min(8, -(-200_000_000 // (b * keys * D * 2))))
        caches = [torch.randn((b, keys, 1, D), device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        lens = torch.full((b,), keys, dtype=torch.int32, device="cuda")
        def call(c):
            return attngen.attention_with_kvcache(q, c, c[..., :DV], cache_seqlens=lens, scale=1 / math.sqrt(192),
                                                  layout="bshd")
        us = time_eager(torch, call, [(c,) for c in caches], reps=30, rounds=rounds)
        rows.append({"batch": b, "heads": h, "keys": keys, "eager_us": us})
        print(f"B{b} {h}/1 {keys} keys: eager {us:.2f} us per call")
        del caches
        torch.cuda.empty_cache()
    with open(out_path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "command": "python3 docs/decode-h200/mla_seesaw/peel/eager_ab.py OUT.json %d" % rounds,
                   "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
