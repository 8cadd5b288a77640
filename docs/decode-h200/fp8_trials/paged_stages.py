"""Paged e4m3 decode (pages of 16): the shipped cell against a 2-stage copy (80.5 KiB: two blocks per SM),
forced split counts; fp16 cache beside. GPU us, queued, rotated. Trial specs (not shipped): out/pg8/e4m3_paged_s2.yaml and out/pg8/e4m3_paged_s3.yaml, the kv_e4m3 cell of
specs/h200_decode_d128.yaml (fp16) written as single-cell files named trial_e4m3_paged_s2 / _s3 with
smem stages 2 / 3 (s3 is the cell as it was before it took 2 stages).
Usage (GPU machine, repository root): python3 docs/decode-h200/fp8_trials/paged_stages.py OUT.json"""
import json, sys
import torch
from attngen.runtime import load
from attngen.eval.bench.decode import median_time_us
from attngen.eval.verify.decode import paged_cache
kerns = {"shipped": load("specs/h200_decode_d128_kv_e4m3.yaml"), "s2": load("out/pg8/e4m3_paged_s2.yaml")}
fp16 = load("specs/h200_decode_d128.yaml")
rows = []
for b, sk, counts in ((8, 8192, (2, 4, 8)), (8, 32768, (2, 4, 8)), (16, 32768, (1, 2, 4)), (1, 32768, (16, 32)), (32, 8192, (1, 2))):
    h, hkv, d = 32, 8, 128
    rot = max(2, min(8, int(3 * 60e6 // (2 * b * hkv * sk * d)) + 1))
    qs = [torch.randn(b, h, 1, d, device="cuda", dtype=torch.float16) for _ in range(rot)]
    lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
    k16 = [torch.randn(b, hkv, sk, d, device="cuda", dtype=torch.float16) for _ in range(rot)]
    v16 = [torch.randn(b, hkv, sk, d, device="cuda", dtype=torch.float16) for _ in range(rot)]
    p16 = [paged_cache(torch, k, v, None, 16, "bhsd", spare=0) for k, v in zip(k16, v16)]
    r = {"cell": f"B{b} {h}/{hkv} Sk{sk}"}
    r["fp16_paged"] = round(median_time_us(torch, lambda i: fp16(qs[i], p16[i][0], p16[i][1], cache_seqlens=lens, block_table=p16[i][2]), 30, rot), 2)
    p8 = [(kp.to(torch.float8_e4m3fn), vp.to(torch.float8_e4m3fn), t) for kp, vp, t in p16]
    del k16, v16, p16; torch.cuda.empty_cache()
    kw = {"k_scale": torch.tensor([0.7], device="cuda"), "v_scale": torch.tensor([1.3], device="cuda")}
    ref = None
    for name, kern in kerns.items():
        for s in (None,) + counts:
            fn = lambda i: kern(qs[i], p8[i][0], p8[i][1], cache_seqlens=lens, block_table=p8[i][2], num_splits=s, **kw)
            o = fn(0).float()
            ref = o if ref is None else ref
            r[f"{name}:{s or 'auto'}"] = round(median_time_us(torch, fn, 30, rot), 2)
            if (o - ref).abs().max().item() > 2e-2: r.setdefault("bad", []).append(f"{name}:{s}")
    rows.append(r); print(json.dumps(r), flush=True)
    del p8, qs; torch.cuda.empty_cache()
json.dump(rows, open(sys.argv[1], "w"), indent=1)
