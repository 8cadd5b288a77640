"""fp16 queries, contiguous e4m3 d128: the 3-stage cell against the 2-stage one at their default counts (the 2-stage
cell counting two blocks per SM from 16 tiles), caches of 1k-4k keys, alternating rounds; GPU us queued.
Usage: python3 docs/decode-h200/e4m3_route_short/route_short.py OUT.json [bf16 [GRIDS]]
(bf16: bf16 queries and the _bf16 cells; GRIDS, e.g. 16x32x8,4x32x32: only those B x H x Hkv)"""
import json, os, statistics, sys
import torch
from attngen.runtime import load
from attngen.eval.bench.decode import median_time_us
BF16 = len(sys.argv) > 2 and sys.argv[2] == "bf16"
QDT = torch.bfloat16 if BF16 else torch.float16
names = tuple(n + ("_bf16" if BF16 else "") for n in ("h200_decode_d128_kv_e4m3_contiguous",
                                                       "h200_decode_d128_kv_e4m3_contiguous_s2"))
GRIDS = ({tuple(map(int, g.split("x"))) for g in sys.argv[3].split(",")} if len(sys.argv) > 3 else None)
cells = {n: load(f"specs/{n}.yaml") for n in names}
out = {"rows": []}
for b in (1, 2, 4, 8, 16, 32):
    for h, hkv in ((32, 8), (8, 1), (32, 32)):
        if GRIDS and (b, h, hkv) not in GRIDS:
            continue
        for sk in (1024, 2048, 4096):
            rot = max(2, min(8, int(3 * 60e6 // (2 * b * hkv * sk * 128)) + 1))
            qs = [torch.randn(b, h, 1, 128, device="cuda", dtype=QDT) for _ in range(rot)]
            k8 = [torch.randn(b, hkv, sk, 128, device="cuda", dtype=torch.float16).to(torch.float8_e4m3fn) for _ in range(rot)]
            v8 = [torch.randn(b, hkv, sk, 128, device="cuda", dtype=torch.float16).to(torch.float8_e4m3fn) for _ in range(rot)]
            kw = {"k_scale": torch.tensor([0.7], device="cuda"), "v_scale": torch.tensor([1.3], device="cuda")}
            t = {n: [] for n in names}; sp = {}
            for r in range(4):
                for n in (names if r % 2 == 0 else names[::-1]):
                    t[n].append(median_time_us(torch, lambda i: cells[n](qs[i], k8[i], v8[i], **kw), 30, rot)); sp[n] = cells[n].last_splits
            row = {"dtype": "bf16" if BF16 else "fp16", "grid": f"B{b} {h}/{hkv} Sk{sk}", "rows": b * h, "s3_us": round(statistics.median(t[names[0]]), 2),
                   "s2_us": round(statistics.median(t[names[1]]), 2), "splits": [sp[n] for n in names]}
            row["s3_over_s2"] = round(row["s3_us"] / row["s2_us"], 3)
            out["rows"].append(row); print(json.dumps(row), flush=True)
            json.dump(out, open(sys.argv[1], "w"), indent=1)
