"""Forced split counts of the contiguous (combine: auto) decode cells where the wave rule cuts one-tile
slices in more than one wave, and MLA at short caches; cuDNN beside. GPU us, queued, rotated past L2.
Usage (GPU machine, repository root): python3 docs/decode-h200/split_rule/forced_counts.py OUT.json"""
import json, sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from attngen.runtime import load
from attngen.eval.bench.decode import median_time_us

rows = []
def cell(spec, b, h, hkv, sk, counts, sdpa=True):
    kernel = load(spec)
    d, dv, v_in_k = kernel.plan.head_dim, kernel.plan.v_dim, kernel.plan.v_in_k
    dt = torch.bfloat16
    kv = (1 if v_in_k else 2) * b * hkv * sk * d * 2
    rot = max(1, min(16, int(3 * 60e6 // kv) + 1))
    qs = [torch.randn(b, h, 1, d, device="cuda", dtype=dt) for _ in range(rot)]
    ks = [torch.randn(b, hkv, sk, d, device="cuda", dtype=dt) for _ in range(rot)]
    vs = [k[..., :dv] if v_in_k else torch.randn_like(k) for k in ks]
    r = {"spec": spec.split("/")[-1][:-5], "cell": f"B{b} {h}/{hkv} Sk{sk}"}
    for s in counts:
        us = median_time_us(torch, lambda i: kernel(qs[i], ks[i], vs[i], num_splits=s), 40, rot)
        r[f"s{s if s else 'auto'}"] = round(us, 2)
        if s is None:
            r["auto_splits"] = kernel.last_splits
    if sdpa:
        def c(i):
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(qs[i], ks[i], vs[i], enable_gqa=h != hkv)
        r["cudnn"] = round(median_time_us(torch, c, 40, rot), 2)
    rows.append(r); print(json.dumps(r), flush=True)
    del qs, ks, vs; torch.cuda.empty_cache()

for d in (128, 64):
    spec = f"specs/h200_decode_d{d}_contiguous_bf16.yaml"
    for sk in (3072, 4224, 6272, 10368):
        cell(spec, 1, 32, 8, sk, (None, 8, 11, 12, 16, 24, 33))
    cell(spec, 2, 32, 8, 4224, (None, 6, 8, 11, 16, 33))
    for sk in (4096, 8192, 16384):
        cell(spec, 1, 8, 1, sk, (None, 8, 16, 32, 64, 128))
    cell(spec, 8, 8, 1, 4224, (None, 8, 11, 16, 33))
mla = "specs/h200_decode_d576_mla_bf16.yaml"
for sk in (576, 768, 1024, 1536):
    cell(mla, 1, 16, 1, sk, (None, 4, 6, 8, 12, 16, 24), sdpa=False)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
