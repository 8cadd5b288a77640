"""d128 bf16 decode, B1, GPU us per call at several split counts, the combine launched as a programmatic
dependent (pdl) or the usual way (nopdl: driver.programmatic_launches patched to False).
Usage: python3 docs/decode-h200/pdl_splits.py OUT.json pdl|nopdl"""
import json, sys
import torch
import attngen.runtime.driver as drv
mode = sys.argv[2]
if mode == "nopdl":
    drv.programmatic_launches = lambda arch: False
from attngen.runtime import load
from attngen.eval.bench.timing import time_calls
rows = []
for spec in ("specs/h200_decode_d128_bf16.yaml", "specs/h200_decode_d64_bf16.yaml"):
    kernel = load(spec)
    d = kernel.plan.head_dim
    for (h, hkv, sk) in ((64, 8, 2048), (32, 8, 2048), (64, 8, 8192)):
        sets = [(torch.randn(1, h, 1, d, device="cuda", dtype=torch.bfloat16),
                 torch.randn(1, hkv, sk, d, device="cuda", dtype=torch.bfloat16),
                 torch.randn(1, hkv, sk, d, device="cuda", dtype=torch.bfloat16)) for _ in range(8)]
        for splits in (None, 4, 8, 12, 16, 24):
            fn = lambda q, k, v: kernel(q, k, v, num_splits=splits)
            us, spread = time_calls(torch, fn, sets, reps=60)
            rows.append({"mode": mode, "d": d, "cell": f"B1 {h}/{hkv} {sk}", "splits": splits,
                         "used": getattr(kernel, "last_splits", None), "us": round(us, 2)})
            print(json.dumps(rows[-1]))
json.dump(rows, open(sys.argv[1], "w"))
