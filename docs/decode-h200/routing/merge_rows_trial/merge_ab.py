"""The merging (one-launch) contiguous decode cells in one tree (PYTHONPATH selects it), each at its default split
count, and forced counts for a few; GPU us queued, rotated past L2; error against fp32 beside torch's own.
Usage: python3 merge_ab.py OUT.json"""
import json, sys
import torch
from attngen.runtime import load
from attngen.eval.bench.decode import median_time_us
bf, hf = torch.bfloat16, torch.float16
K = {("bf16", 128): load("specs/h200_decode_d128_contiguous_bf16.yaml"), ("fp16", 64): load("specs/h200_decode_d64_contiguous.yaml"),
     ("e4m3", 128): load("specs/h200_decode_d128_kv_e4m3_contiguous.yaml"), ("fp16f", 128): load("specs/h200_decode_d128_fused.yaml")}
CELLS = [("bf16", 128, b, h, hkv, sq, sk) for b, h, hkv, sq, sk in (
            (1, 8, 1, 1, 4096), (1, 8, 1, 1, 16384), (1, 8, 1, 1, 32768), (1, 16, 1, 1, 4096), (1, 32, 1, 1, 8192),
            (2, 8, 1, 1, 8192), (1, 64, 8, 1, 4096), (1, 64, 8, 1, 16384), (1, 16, 2, 1, 8192), (1, 32, 8, 4, 2048),
            (8, 32, 8, 4, 2048), (1, 32, 8, 1, 4096), (1, 32, 8, 1, 32768), (8, 32, 8, 1, 8192), (16, 32, 8, 1, 1024))] \
        + [("fp16", 64, 1, 8, 1, 1, 8192), ("fp16", 64, 1, 32, 1, 1, 8192), ("fp16", 64, 1, 32, 8, 1, 8192),
           ("e4m3", 128, 1, 8, 1, 1, 4096), ("e4m3", 128, 16, 8, 1, 1, 8192), ("e4m3", 128, 1, 32, 8, 1, 4096),
           ("fp16f", 128, 1, 8, 1, 1, 8192), ("fp16f", 128, 1, 32, 8, 1, 8192)]
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
for name, d, b, h, hkv, sq, sk in CELLS:
    kern = K[(name, d)]; e4 = name == "e4m3"; dt = bf if name == "bf16" else hf
    rot = max(2, min(16, int(3 * 60e6 // ((2 if e4 else 4) * b * hkv * sk * d)) + 1))
    qs = [torch.randn(b, h, sq, d, device="cuda", dtype=dt) for _ in range(rot)]
    ks = [torch.randn(b, hkv, sk, d, device="cuda", dtype=dt) for _ in range(rot)]
    vs = [torch.randn_like(k) for k in ks]
    kw = {"causal": sq > 1}
    if e4:
        ks = [k.to(torch.float8_e4m3fn) for k in ks]; vs = [v.to(torch.float8_e4m3fn) for v in vs]
        kw.update(k_scale=torch.tensor([0.7], device="cuda"), v_scale=torch.tensor([1.3], device="cuda"))
    kref = ks[0].float() * 0.7 if e4 else ks[0]; vref = vs[0].float() * 1.3 if e4 else vs[0]
    ref = reference(qs[0], kref, vref, sq); low = reference(qs[0], kref.to(dt), vref.to(dt), sq, dtype=dt)
    r = {"cell": f"{name} d{d} B{b} {h}/{hkv} Sq{sq} Sk{sk}", "err_lowp": float((low - ref).abs().max())}
    for n in (None, 32, 128) if sk >= 8192 and b == 1 else (None,):
        extra = {} if n is None else {"num_splits": n}
        out = kern(qs[0], ks[0], vs[0], **kw, **extra)
        tag = "default" if n is None else f"at{n}"
        r[tag + "_us"] = round(median_time_us(torch, lambda i: kern(qs[i], ks[i], vs[i], **kw, **extra), 20, rot), 2)
        r[tag + "_splits"] = kern.last_splits
        r[tag + "_err"] = float((out.float() - ref).abs().max())
    rows.append(r); print(json.dumps(r), flush=True)
    del qs, ks, vs; torch.cuda.empty_cache()
json.dump(rows, open(sys.argv[1], "w"), indent=1)
