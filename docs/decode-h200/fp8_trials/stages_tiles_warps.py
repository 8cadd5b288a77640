"""e4m3 contiguous decode trials (stages, block_n, warps) against the shipped cell and the fp16 cache;
GPU us, queued, caches rotated past L2; each output checked against the shipped cell's.
Trial specs: the kv_e4m3_contiguous cell of specs/h200_decode_d128.yaml (fp16) as single-cell files in a folder
TRIALS with one key changed each: stages 5 (e4m3_s5) or 6 (e4m3_s6), block_n 256 (e4m3_n256), 8 warps
(e4m3_w8), 8 warps and 5 stages (e4m3_w8s5).
Usage (GPU machine, repository root): python3 docs/decode-h200/fp8_trials/stages_tiles_warps.py OUT.json TRIALS"""
import json, sys, glob
import torch
from attngen.runtime import load
from attngen.eval.bench.decode import median_time_us

specs = ["specs/h200_decode_d128_kv_e4m3_contiguous.yaml"] + sorted(glob.glob(sys.argv[2] + "/e4m3_*.yaml"))
fp16 = load("specs/h200_decode_d128_contiguous.yaml")
kernels = {s.split("/")[-1][:-5]: load(s) for s in specs}
rows = []
for (b, sk, counts) in ((8, 8192, (None, 1, 2, 4)), (8, 32768, (None, 1, 2, 4)), (1, 32768, (None, 8, 16, 32))):
    h, hkv, d = 32, 8, 128
    kvb = 2 * b * hkv * sk * d
    rot = max(2, min(16, int(3 * 60e6 // kvb) + 1))
    qs = [torch.randn(b, h, 1, d, device="cuda", dtype=torch.float16) for _ in range(rot)]
    k16 = [torch.randn(b, hkv, sk, d, device="cuda", dtype=torch.float16) for _ in range(rot)]
    v16 = [torch.randn(b, hkv, sk, d, device="cuda", dtype=torch.float16) for _ in range(rot)]
    r = {"cell": f"B{b} {h}/{hkv} Sk{sk}", "fp16_cache": round(median_time_us(torch, lambda i: fp16(qs[i], k16[i], v16[i]), 40, rot), 2)}
    k8 = [x.to(torch.float8_e4m3fn) for x in k16]; v8 = [x.to(torch.float8_e4m3fn) for x in v16]
    del k16, v16; torch.cuda.empty_cache()
    ks = torch.tensor([0.7], device="cuda"); vs = torch.tensor([1.3], device="cuda")
    ref = None
    for name, kern in kernels.items():
        for s in counts:
            fn = lambda i: kern(qs[i], k8[i], v8[i], num_splits=s, k_scale=ks, v_scale=vs)
            o = fn(0).float()
            if ref is None: ref = o
            err = (o - ref).abs().max().item()
            us = median_time_us(torch, fn, 40, rot)
            r[f"{name.replace('h200_decode_d128_kv_e4m3_contiguous','shipped').replace('trial_e4m3_','')}:{s if s else 'auto'}"] = round(us, 2)
            if err > 2e-2: r.setdefault("bad", []).append(f"{name}:{s} {err:.3g}")
    rows.append(r); print(json.dumps(r), flush=True)
    del k8, v8, qs; torch.cuda.empty_cache()
json.dump(rows, open(sys.argv[1], "w"), indent=1)
