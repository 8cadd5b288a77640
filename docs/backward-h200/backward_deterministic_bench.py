"""Deterministic mode's cost: the backward specs h100_bwd_d64 / h100_bwd_d128, default and
deterministic=True, in one process on the GPU at hand (H200: docs/backward-h200/deterministic.json).

Usage: python3 docs/backward-h200/backward_deterministic_bench.py OUT.json

GPU time of one backward call (preprocess + main + convert), CUDA events, median of 11 after 2
warm-up calls; fp16 (B, H, S, D), causal and not. 1x4x32768 at d128 has 256 key blocks per head,
more than the GPU holds at once: it also shows that the turns cannot wait on a block not launched.
deterministic_repeats: a second deterministic call gave the same bits of dq, dk and dv.
"""
import json, sys, statistics, time
import torch
import attngen
out = sys.argv[1]
def med(fn, reps=11):
    for _ in range(2): fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts)
rows = []
for d in (64, 128):
    bwd = attngen.load(f"specs/h100_bwd_d{d}.yaml")
    fwd = attngen.load(f"specs/h100_mma_d{d}.yaml")
    for b, h, s in ((4, 16, 2048), (1, 16, 8192), (1, 4, 32768)):
        for causal in (False, True):
            if s == 32768 and d == 64: continue
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v, do = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16, generator=g) for _ in range(4))
            o, lse = fwd(q, k, v, causal=causal, return_lse=True)
            t0 = time.time()
            a = bwd(q, k, v, o, lse, do, causal=causal, deterministic=True); torch.cuda.synchronize()
            row = {"d": d, "shape": f"{b}x{h}x{s}", "causal": causal, "first_det_call_s": time.time() - t0,
                   "us": med(lambda: bwd(q, k, v, o, lse, do, causal=causal)),
                   "deterministic_us": med(lambda: bwd(q, k, v, o, lse, do, causal=causal, deterministic=True))}
            row["deterministic_repeats"] = all(torch.equal(x, y) for x, y in zip(a, bwd(q, k, v, o, lse, do, causal=causal, deterministic=True)))
            row["cost"] = row["deterministic_us"] / row["us"] - 1
            print(json.dumps(row), flush=True)
            rows.append(row)
json.dump(rows, open(out, "w"), indent=1)
