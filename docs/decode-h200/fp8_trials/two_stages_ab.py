"""e4m3 decode, one tree (the 3-stage before, the 2-stage after), in one process each, alternating
processes twice: contiguous and paged (pages of 16) caches, default split counts; GPU us, queued, rotated.
Usage (PYTHONPATH selects the tree): python3 docs/decode-h200/fp8_trials/two_stages_ab.py OUT.json SPEC HEAD_DIM"""
import json, sys
import torch
from attngen.runtime import load
from attngen.eval.bench.decode import median_time_us
from attngen.eval.verify.decode import paged_cache
spec, d = sys.argv[2], int(sys.argv[3])
kern = load(spec)
rows = []
for b, h, hkv, sk in ((1, 32, 8, 1024), (1, 32, 8, 4096), (1, 32, 8, 32768), (2, 32, 8, 8192), (4, 32, 8, 4096),
                      (8, 32, 8, 2048), (8, 32, 8, 8192), (8, 32, 8, 32768), (16, 32, 8, 1024), (16, 32, 8, 16384),
                      (1, 8, 1, 8192), (64, 32, 8, 4096)):
    rot = max(2, min(8, int(3 * 60e6 // (2 * b * hkv * sk * d)) + 1))
    qs = [torch.randn(b, h, 1, d, device="cuda", dtype=torch.float16) for _ in range(rot)]
    k16 = [torch.randn(b, hkv, sk, d, device="cuda", dtype=torch.float16) for _ in range(rot)]
    v16 = [torch.randn(b, hkv, sk, d, device="cuda", dtype=torch.float16) for _ in range(rot)]
    kw = {"k_scale": torch.tensor([0.7], device="cuda"), "v_scale": torch.tensor([1.3], device="cuda")}
    r = {"cell": f"B{b} {h}/{hkv} Sk{sk}"}
    if kern.plan.paged:
        lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
        pools = [tuple(x.to(torch.float8_e4m3fn) if i < 2 else x for i, x in
                       enumerate(paged_cache(torch, k, v, None, 16, "bhsd", spare=0))) for k, v in zip(k16, v16)]
        r["paged_us"] = round(median_time_us(torch, lambda i: kern(qs[i], pools[i][0], pools[i][1], cache_seqlens=lens,
                                                                   block_table=pools[i][2], **kw), 30, rot), 2)
        r["paged_splits"] = kern.last_splits
        del pools
    k8 = [k.to(torch.float8_e4m3fn) for k in k16]; v8 = [v.to(torch.float8_e4m3fn) for v in v16]
    del k16, v16
    r["contiguous_us"] = round(median_time_us(torch, lambda i: kern(qs[i], k8[i], v8[i], **kw), 30, rot), 2)
    r["contiguous_splits"] = kern.last_splits
    rows.append(r); print(json.dumps(r), flush=True)
    del k8, v8, qs; torch.cuda.empty_cache()
json.dump(rows, open(sys.argv[1], "w"), indent=1)
