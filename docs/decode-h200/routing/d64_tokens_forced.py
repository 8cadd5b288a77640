"""(a) d64 bf16 merging vs combine-kernel cell on contiguous caches; (b) d128 bf16 with 2 and 4 new tokens;
(c) the combine-kernel cell at forced split counts for one KV head; cuDNN beside where it applies.
GPU us, queued, rotated past L2. Usage: python3 docs/decode-h200/routing/d64_tokens_forced.py OUT.json"""
import json, sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from attngen.runtime import load
from attngen.eval.bench.decode import median_time_us
K = {d: {"merging": load(f"specs/h200_decode_d{d}_contiguous_bf16.yaml"), "kernel": load(f"specs/h200_decode_d{d}_bf16.yaml")}
     for d in (64, 128)}
E4 = {"merging": load("specs/h200_decode_d128_kv_e4m3_contiguous.yaml"), "kernel": load("specs/h200_decode_d128_kv_e4m3.yaml")}
rows = []
def cell(part, d, b, h, hkv, sk, sq=1, forced=(), e4=False):
    dt = torch.float16 if e4 else torch.bfloat16
    rot = max(2, min(16, int(3 * 60e6 // ((2 if e4 else 4) * b * hkv * sk * d)) + 1))
    qs = [torch.randn(b, h, sq, d, device="cuda", dtype=dt) for _ in range(rot)]
    ks = [torch.randn(b, hkv, sk, d, device="cuda", dtype=dt) for _ in range(rot)]
    vs = [torch.randn_like(k) for k in ks]
    kw = {}
    if e4:
        ks = [k.to(torch.float8_e4m3fn) for k in ks]; vs = [v.to(torch.float8_e4m3fn) for v in vs]
        kw = {"k_scale": torch.tensor([0.7], device="cuda"), "v_scale": torch.tensor([1.3], device="cuda")}
    kerns = E4 if e4 else K[d]
    causal = {"causal": True} if sq > 1 else {}
    r = {"part": part, "d": d, "cell": f"B{b} {h}/{hkv} Sk{sk} Sq{sq}", "group_rows": h // hkv * sq, "rows": b * h * sq}
    runs = [(n, kern, None) for n, kern in kerns.items()] + [(f"kernel@{s}", kerns["kernel"], s) for s in forced]
    t = {n: [] for n, _, _ in runs}
    for _ in range(2):
        for n, kern, s in runs:
            extra = {"num_splits": s} if s else {}
            t[n].append(median_time_us(torch, lambda i: kern(qs[i], ks[i], vs[i], **kw, **causal, **extra), 20, rot))
            r[f"{n}_splits"] = kern.last_splits
    for n, v in t.items():
        r[n] = [round(x, 2) for x in v]
    if not e4 and sq == 1:
        def c(i):
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(qs[i], ks[i], vs[i], enable_gqa=h != hkv)
        r["cudnn"] = round(median_time_us(torch, c, 20, rot), 2)
    rows.append(r); print(json.dumps(r), flush=True)
    del qs, ks, vs; torch.cuda.empty_cache()
for b, h, hkv in ((1, 8, 1), (1, 32, 1), (4, 8, 1), (1, 16, 2), (1, 32, 4), (1, 32, 8), (1, 64, 8), (8, 64, 8), (16, 32, 8)):
    for sk in (2048, 8192, 32768):
        cell("d64", 64, b, h, hkv, sk)
for b, h, hkv, sq in ((1, 32, 8, 2), (1, 32, 8, 4), (8, 32, 8, 4), (1, 8, 1, 4), (4, 32, 8, 2), (32, 32, 8, 4)):
    for sk in (2048, 8192, 32768):
        cell("sq", 128, b, h, hkv, sk, sq)
for b, sk in ((1, 16384), (1, 32768), (2, 32768), (8, 32768)):
    cell("forced", 128, b, 8, 1, sk, forced=(16, 32, 64))
for b, sk in ((16, 32768), (16, 8192), (1, 32768)):
    cell("forced_e4m3", 128, b, 8, 1, sk, forced=(8, 16, 32), e4=True)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
