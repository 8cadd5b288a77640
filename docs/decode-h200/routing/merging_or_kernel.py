"""Two decode cells on the same contiguous caches, each at its default split count, alternating twice; cuDNN
beside for half-precision caches. GPU us, queued, rotated past L2.
Usage: python3 docs/decode-h200/routing/merging_or_kernel.py OUT.json CASE   (CASE: onehead = d128 bf16 merging vs combine-kernel cell over few-block
grids; e4m3 = d128 e4m3 contiguous 3-stage merging cell vs the 2-stage combine-kernel cell, fp16 queries)"""
import json, sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from attngen.runtime import load
from attngen.eval.bench.decode import median_time_us
case = sys.argv[2]
d = 128
if case == "onehead":
    kerns = {"merging": load("specs/h200_decode_d128_contiguous_bf16.yaml"), "kernel": load("specs/h200_decode_d128_bf16.yaml")}
    dt, e4 = torch.bfloat16, False
    grid = [(b, h, hkv, sk) for b, h, hkv in ((1, 8, 1), (1, 16, 1), (1, 32, 1), (2, 8, 1), (4, 8, 1), (8, 8, 1),
                                              (1, 16, 2), (2, 16, 2), (1, 32, 4), (1, 32, 8), (1, 64, 8), (2, 32, 8))
            for sk in (1024, 2048, 4096, 8192, 16384, 32768, 131072)]
else:
    kerns = {"merging": load("specs/h200_decode_d128_kv_e4m3_contiguous.yaml"), "kernel": load("specs/h200_decode_d128_kv_e4m3.yaml")}
    dt, e4 = torch.float16, True
    grid = [(b, 32, 8, sk) for b in (1, 2, 4, 8, 16, 32, 64) for sk in (1024, 2048, 4096, 8192, 32768) if b * sk <= 16 * 32768] \
        + [(b, 8, 1, sk) for b in (1, 4, 16) for sk in (4096, 32768)]
kw = {"k_scale": torch.tensor([0.7], device="cuda"), "v_scale": torch.tensor([1.3], device="cuda")} if e4 else {}
rows = []
for b, h, hkv, sk in grid:
    rot = max(2, min(16, int(3 * 60e6 // ((2 if e4 else 4) * b * hkv * sk * d)) + 1))
    qs = [torch.randn(b, h, 1, d, device="cuda", dtype=dt) for _ in range(rot)]
    ks = [torch.randn(b, hkv, sk, d, device="cuda", dtype=dt) for _ in range(rot)]
    vs = [torch.randn_like(k) for k in ks]
    if e4:
        ks = [k.to(torch.float8_e4m3fn) for k in ks]; vs = [v.to(torch.float8_e4m3fn) for v in vs]
    r = {"cell": f"B{b} {h}/{hkv} Sk{sk}", "rows": b * h}
    t = {k: [] for k in kerns}
    for _ in range(2):
        for name, kern in kerns.items():
            t[name].append(median_time_us(torch, lambda i: kern(qs[i], ks[i], vs[i], **kw), 20, rot))
            r[f"{name}_splits"] = kern.last_splits
    for k, v in t.items():
        r[k] = [round(x, 2) for x in v]
    if not e4:
        def c(i):
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(qs[i], ks[i], vs[i], enable_gqa=h != hkv)
        r["cudnn"] = round(median_time_us(torch, c, 20, rot), 2)
    rows.append(r); print(json.dumps(r), flush=True)
    del qs, ks, vs; torch.cuda.empty_cache()
json.dump(rows, open(sys.argv[1], "w"), indent=1)
