"""Paged e4m3 d128 (pages of 16), the 3-stage cell as it was (out/pg8/e4m3_paged_s3.yaml) against the shipped
2-stage one, each at its own default split count, alternating twice; GPU us, queued, rotated.
Trial specs (not shipped): out/pg8/e4m3_paged_s2.yaml and out/pg8/e4m3_paged_s3.yaml, the kv_e4m3 cell of
specs/h200_decode_d128.yaml (fp16) written as single-cell files named trial_e4m3_paged_s2 / _s3 with
smem stages 2 / 3 (s3 is the cell as it was before it took 2 stages).
Usage (GPU machine, repository root): python3 docs/decode-h200/fp8_trials/paged_two_stages.py OUT.json"""
import json, sys
import torch
from attngen.runtime import load
from attngen.eval.bench.decode import median_time_us
from attngen.eval.verify.decode import paged_cache
kerns = {"before": load("out/pg8/e4m3_paged_s3.yaml"), "after": load("specs/h200_decode_d128_kv_e4m3.yaml")}
rows = []
for b, h, hkv, sk in ((1, 32, 8, 1024), (1, 32, 8, 4096), (1, 32, 8, 16384), (2, 32, 8, 8192), (4, 32, 8, 4096),
                      (8, 32, 8, 2048), (16, 32, 8, 1024), (1, 8, 1, 8192), (64, 32, 8, 4096), (8, 32, 32, 8192)):
    d = 128
    rot = max(2, min(8, int(3 * 60e6 // (2 * b * hkv * sk * d)) + 1))
    qs = [torch.randn(b, h, 1, d, device="cuda", dtype=torch.float16) for _ in range(rot)]
    lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
    pools = []
    for _ in range(rot):
        kp, vp, t = paged_cache(torch, torch.randn(b, hkv, sk, d, device="cuda", dtype=torch.float16),
                                torch.randn(b, hkv, sk, d, device="cuda", dtype=torch.float16), None, 16, "bhsd", spare=0)
        pools.append((kp.to(torch.float8_e4m3fn), vp.to(torch.float8_e4m3fn), t))
    kw = {"k_scale": torch.tensor([0.7], device="cuda"), "v_scale": torch.tensor([1.3], device="cuda")}
    r = {"cell": f"B{b} {h}/{hkv} Sk{sk}"}
    t = {k: [] for k in kerns}
    for _ in range(2):
        for name, kern in kerns.items():
            t[name].append(median_time_us(torch, lambda i: kern(qs[i], pools[i][0], pools[i][1], cache_seqlens=lens,
                                                              block_table=pools[i][2], **kw), 30, rot))
            r[f"{name}_splits"] = kern.last_splits
    for k, v in t.items():
        r[k] = [round(x, 2) for x in v]
    r["after/before"] = round(min(t["after"]) / min(t["before"]), 3)
    rows.append(r); print(json.dumps(r), flush=True)
    del pools, qs; torch.cuda.empty_cache()
json.dump(rows, open(sys.argv[1], "w"), indent=1)
