import json, sys, torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import attngen
from attngen.ops import library
from attngen.eval.bench.decode import median_time_us, eager_time_us
d, dt = 128, torch.bfloat16
rows = []
for b, h, hkv, sk in ((1, 32, 8, 131072), (1, 32, 32, 32768), (1, 32, 8, 32768), (1, 64, 8, 131072), (1, 32, 32, 8192), (1, 64, 8, 2048), (2, 64, 8, 2048)):
    kv_bytes = 2 * b * hkv * sk * d * 2
    rot = max(2, min(8, int(3 * 60e6 // kv_bytes) + 1))
    qs = [torch.randn(b, h, 1, d, device="cuda", dtype=dt) for _ in range(rot)]
    ks = [torch.randn(b, hkv, sk, d, device="cuda", dtype=dt) for _ in range(rot)]
    vs = [torch.randn_like(k) for k in ks]
    entry = lambda i: attngen.attention_with_kvcache(qs[i], ks[i], vs[i])
    entry(0)
    key = next(kk for kk in library._DECODE if kk[2] == qs[0].shape and kk[3] == ks[0].shape)
    kern = library._DECODE[key]
    direct = lambda i: kern(qs[i], ks[i], vs[i])
    direct_lse = lambda i: kern(qs[i], ks[i], vs[i], return_lse=True)
    def cudnn(i):
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(qs[i], ks[i], vs[i], enable_gqa=h != hkv)
    t = {}
    for _ in range(3):
        for name, fn in (("entry", entry), ("direct", direct), ("direct_lse", direct_lse), ("cudnn", cudnn)):
            t.setdefault(name, []).append(round(median_time_us(torch, fn, 20, rot), 2))
            t.setdefault(name + "_eager", []).append(round(eager_time_us(torch, fn, 20, rot), 2))
    r = {"cell": f"B{b} {h}/{hkv} Sk{sk}", "spec": kern.plan.spec.name, "splits": kern.last_splits, **t}
    rows.append(r); print(json.dumps(r), flush=True)
    del qs, ks, vs; torch.cuda.empty_cache()
json.dump(rows, open(sys.argv[1], "w"), indent=1)
