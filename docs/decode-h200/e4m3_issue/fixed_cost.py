"""Where the contiguous d128 decode's time goes as the cache grows: the e4m3 2-stage cell (default and forced split
counts) and the fp16 cell, B8 32/8 heads, fp16 queries, 256 to 32768 keys; GPU us queued (median of 30 calls, caches
rotated past L2), 3 rounds. A line through the long caches' times gives each cell's streaming rate and its
fixed cost (the time at no keys).
Usage: python3 docs/decode-h200/e4m3_issue/fixed_cost.py OUT.json"""
import json, sys
import torch
from attngen.runtime import load
from attngen.eval.bench.decode import median_time_us

b, h, hkv, d = 8, 32, 8, 128
cells = {"e4m3_s2": load("specs/h200_decode_d128_kv_e4m3_contiguous_s2.yaml"),
         "fp16": load("specs/h200_decode_d128_contiguous.yaml")}
out = {"command": "python3 docs/decode-h200/e4m3_issue/fixed_cost.py OUT.json", "gpu": torch.cuda.get_device_name(),
       "torch": torch.__version__, "rows": []}
for sk in (256, 512, 1024, 2048, 4096, 8192, 16384, 32768):
    rot = max(2, min(8, int(3 * 60e6 // (2 * b * hkv * sk * d)) + 1))
    g = torch.Generator(device="cuda").manual_seed(1)
    qs = [torch.randn((b, h, 1, d), generator=g, device="cuda").half() for _ in range(rot)]
    ks = [torch.randn((b, hkv, sk, d), generator=g, device="cuda").half() for _ in range(rot)]
    vs = [torch.randn((b, hkv, sk, d), generator=g, device="cuda").half() for _ in range(rot)]
    k8 = [k.to(torch.float8_e4m3fn) for k in ks]; v8 = [v.to(torch.float8_e4m3fn) for v in vs]
    kw = {"k_scale": torch.tensor([0.7], device="cuda"), "v_scale": torch.tensor([1.3], device="cuda")}
    runs = [("fp16", None, lambda i, n: cells["fp16"](qs[i], ks[i], vs[i]))]
    for n in (None, 1, 2, 4, 8, 16):
        runs.append(("e4m3_s2", n, lambda i, n: cells["e4m3_s2"](qs[i], k8[i], v8[i], num_splits=n, **kw)
                     if n else cells["e4m3_s2"](qs[i], k8[i], v8[i], **kw)))
    for name, n, fn in runs:
        if n is not None and n * 128 > sk:
            continue
        times = [median_time_us(torch, lambda i: fn(i, n), 30, rot) for _ in range(3)]
        row = {"cell": name, "keys": sk, "forced_splits": n, "splits": cells[name].last_splits,
               "us": round(sorted(times)[1], 2), "rounds": [round(t, 2) for t in times]}
        out["rows"].append(row); print(json.dumps(row), flush=True)
    json.dump(out, open(sys.argv[1], "w"), indent=1)
    del qs, ks, vs, k8, v8; torch.cuda.empty_cache()
