"""KV heads of 5-7 query rows (40/8, 48/8, 56/8 heads) on the contiguous_pairs cell against the contiguous cell
the table sent them to before the pairs (max_group_rows 4 keeps 4-row heads there), with 64/8 (8 rows, routed to
the pairs on measurement) and 32/8 (4 rows, not routed) beside. Each cell's default split count, both specs in one
process, two alternating rounds; GPU us (queued, K/V rotated past L2) and the error against fp32.
Usage (GPU machine, repository root): python3 docs/decode-h200/routing/merge_rows_trial/odd_rows.py OUT.json"""
import json
import sys
import torch
from attngen.runtime import load
from attngen.eval.bench.decode import median_time_us

dt = torch.bfloat16
KERNELS = {d: {"pairs": load(f"specs/h200_decode_d{d}_contiguous_pairs_bf16.yaml"),
               "plain": load(f"specs/h200_decode_d{d}_contiguous_bf16.yaml")} for d in (128, 64)}
rows = []
for d, kernels in KERNELS.items():
    for b in (1, 2, 8):
        for h, hkv in ((40, 8), (48, 8), (56, 8), (64, 8), (32, 8)):
            for sk in (2048, 8192, 16384):
                rot = max(2, min(16, int(3 * 60e6 // (4 * b * hkv * sk * d)) + 1))
                qs = [torch.randn(b, h, 1, d, device="cuda", dtype=dt) for _ in range(rot)]
                ks = [torch.randn(b, hkv, sk, d, device="cuda", dtype=dt) for _ in range(rot)]
                vs = [torch.randn_like(k) for k in ks]
                g = h // hkv
                ref = ((qs[0].float() @ ks[0].float().repeat_interleave(g, 1).transpose(-1, -2)) * d ** -0.5) \
                    .softmax(-1) @ vs[0].float().repeat_interleave(g, 1)
                r = {"cell": f"bf16 d{d} B{b} {h}/{hkv} Sk{sk}", "rows_per_kv_head": g}
                times = {}
                for _ in range(2):
                    for tag, kern in kernels.items():
                        us = median_time_us(torch, lambda i: kern(qs[i], ks[i], vs[i]), 20, rot)
                        times.setdefault(tag, []).append(round(us, 2))
                for tag, kern in kernels.items():
                    err = float((kern(qs[0], ks[0], vs[0]).float() - ref).abs().max())
                    r[tag] = {"us": times[tag], "splits": kern.last_splits, "err": err}
                rows.append(r)
                print(json.dumps(r), flush=True)
                del qs, ks, vs, ref
                torch.cuda.empty_cache()
json.dump(rows, open(sys.argv[1], "w"), indent=1)
