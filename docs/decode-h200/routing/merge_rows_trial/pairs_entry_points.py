"""Contiguous decode through attngen.attention_with_kvcache in one tree (PYTHONPATH selects it), on the calls the
contiguous_pairs routing changes (KV heads of more than 4 query rows) and controls it leaves (32/8 heads): GPU us
(queued, K/V rotated past L2), eager us (back to back, host included), the spec the table picked, its split count,
and the error against fp32 beside torch SDPA's own in the same dtype.
Usage: python3 docs/decode-h200/routing/merge_rows_trial/pairs_entry_points.py OUT.json [--e4m3]"""
import json
import sys
import torch
import torch.nn.functional as F
import attngen
from attngen.eval.bench.decode import eager_time_us, median_time_us
from attngen.ops import library

bf, hf = torch.bfloat16, torch.float16
CELLS = [(bf, 128, 1, 64, 8, 1, 2048), (bf, 128, 1, 64, 8, 1, 4096), (bf, 128, 1, 64, 8, 1, 8192),
         (bf, 128, 1, 64, 8, 1, 16384), (bf, 128, 2, 64, 8, 1, 2048), (bf, 128, 2, 64, 8, 1, 8192),
         (bf, 128, 32, 64, 8, 1, 2048), (bf, 128, 1, 8, 1, 1, 4096), (bf, 128, 1, 8, 1, 1, 16384),
         (bf, 128, 1, 8, 1, 1, 32768), (bf, 128, 2, 8, 1, 1, 32768), (bf, 128, 1, 16, 1, 1, 4096),
         (bf, 128, 1, 32, 1, 1, 8192), (bf, 128, 1, 32, 8, 4, 2048), (bf, 128, 8, 32, 8, 4, 2048),
         (hf, 128, 1, 64, 8, 1, 4096), (bf, 64, 1, 8, 1, 1, 8192), (bf, 64, 1, 32, 1, 1, 8192),
         (bf, 64, 1, 64, 8, 1, 4096), (bf, 64, 4, 32, 1, 1, 32768), (bf, 64, 16, 64, 8, 1, 8192),
         (bf, 128, 1, 32, 8, 1, 4096), (bf, 128, 8, 32, 8, 1, 8192), (bf, 64, 1, 32, 8, 1, 8192)]
if "--e4m3" in sys.argv:   # the e4m3 contiguous cells (fp16 queries): rerouted KV heads of 8+ rows, 32/8 controls
    CELLS = [("e4m3", 128, 1, 8, 1, 1, 4096), ("e4m3", 128, 16, 8, 1, 1, 8192), ("e4m3", 128, 1, 64, 8, 1, 4096),
             ("e4m3", 128, 1, 32, 1, 1, 16384), ("e4m3", 128, 2, 8, 1, 1, 32768), ("e4m3", 64, 1, 32, 1, 1, 8192),
             ("e4m3", 128, 1, 32, 8, 1, 4096), ("e4m3", 128, 8, 32, 8, 1, 8192)]


def reference(q, k, v, sq, dtype=torch.float32):
    h, hkv = q.shape[1], k.shape[1]
    k = k.repeat_interleave(h // hkv, 1).to(dtype); v = v.repeat_interleave(h // hkv, 1).to(dtype)
    s = (q.to(dtype) @ k.transpose(-1, -2)).float() * q.shape[-1] ** -0.5
    if sq > 1:
        sk = k.shape[2]
        keep = torch.arange(sk, device=q.device)[None, :] <= (sk - sq + torch.arange(sq, device=q.device))[:, None]
        s = s.masked_fill(~keep, float("-inf"))
    return (s.softmax(-1).to(dtype) @ v).float()


rows = []
for dt, d, b, h, hkv, sq, sk in CELLS:
    e4 = dt == "e4m3"
    dt = hf if e4 else dt
    rot = max(2, min(16, int(3 * 60e6 // ((2 if e4 else 4) * b * hkv * sk * d)) + 1))
    qs = [torch.randn(b, h, sq, d, device="cuda", dtype=dt) for _ in range(rot)]
    ks = [torch.randn(b, hkv, sk, d, device="cuda", dtype=dt) for _ in range(rot)]
    vs = [torch.randn_like(k) for k in ks]
    kw = {"causal": sq > 1}
    if e4:
        ks = [k.to(torch.float8_e4m3fn) for k in ks]; vs = [v.to(torch.float8_e4m3fn) for v in vs]
        kw.update(k_scale=torch.tensor([0.7], device="cuda"), v_scale=torch.tensor([1.3], device="cuda"))
    fn = lambda i: attngen.attention_with_kvcache(qs[i], ks[i], vs[i], **kw)
    out = fn(0).float()
    cache = library._DECODE_E4M3 if e4 else library._DECODE
    kern = cache[next(kk for kk in cache if kk[1] == dt and kk[2] == qs[0].shape and kk[3] == ks[0].shape)]
    kref = ks[0].float() * 0.7 if e4 else ks[0]; vref = vs[0].float() * 1.3 if e4 else vs[0]
    ref = reference(qs[0], kref, vref, sq)
    low = reference(qs[0], kref.to(dt), vref.to(dt), sq, dtype=dt)
    r = {"cell": f"{'e4m3' if e4 else str(dt)[6:]} d{d} B{b} {h}/{hkv} Sq{sq} Sk{sk}", "spec": kern.plan.spec.name,
         "gpu_us": round(median_time_us(torch, fn, 20, rot), 2), "splits": kern.last_splits,
         "eager_us": round(eager_time_us(torch, fn, 20, rot), 2),
         "err": float((out - ref).abs().max()), "err_lowp": float((low - ref).abs().max())}
    rows.append(r)
    print(json.dumps(r), flush=True)
    del qs, ks, vs, out, ref, low
    torch.cuda.empty_cache()
json.dump(rows, open(sys.argv[1], "w"), indent=1)
