"""Batch-1 (and 2) long-context decode cells that the grid left below cuDNN (docs/decode-h200/decode_grid_entry.json):
the two d128 bf16 cells (one-launch contiguous, paged-capable with the combine kernel) at their default split count
and at forced ones, GPU us (queued, rotated past L2) and eager us, error against fp32; cuDNN beside.
Usage (GPU machine, repository root): python3 docs/decode-h200/split_rule/b1_long_counts.py OUT.json"""
import json
import sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from attngen.runtime import load
from attngen.eval.bench.decode import eager_time_us, median_time_us

SPECS = {"contiguous": load("specs/h200_decode_d128_contiguous_bf16.yaml"), "kernel": load("specs/h200_decode_d128_bf16.yaml")}
COUNTS = (4, 8, 12, 16, 24, 32, 33, 48, 64, 66)
CELLS = ((1, 32, 8, 8192), (1, 32, 8, 32768), (1, 32, 8, 131072), (1, 64, 8, 32768), (1, 64, 8, 131072),
         (1, 32, 32, 8192), (1, 32, 32, 32768), (1, 32, 32, 131072), (2, 32, 8, 32768), (2, 32, 32, 131072))
d, dt = 128, torch.bfloat16
rows = []
for b, h, hkv, sk in CELLS:
    kv_bytes = 2 * b * hkv * sk * d * 2
    rot = max(2, min(8, int(3 * 60e6 // kv_bytes) + 1))
    qs = [torch.randn(b, h, 1, d, device="cuda", dtype=dt) for _ in range(rot)]
    ks = [torch.randn(b, hkv, sk, d, device="cuda", dtype=dt) for _ in range(rot)]
    vs = [torch.randn_like(k) for k in ks]
    ref = None
    if b * h * sk * d * 4 <= 1e9:
        k32 = ks[0].float().repeat_interleave(h // hkv, 1); v32 = vs[0].float().repeat_interleave(h // hkv, 1)
        ref = ((qs[0].float() @ k32.transpose(-1, -2)) * d ** -0.5).softmax(-1) @ v32
        del k32, v32
    r = {"cell": f"B{b} {h}/{hkv} Sk{sk}", "KV_MB": round(kv_bytes / 1e6, 1)}
    def c(i):
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(qs[i], ks[i], vs[i], enable_gqa=h != hkv)
    r["cudnn_us"] = round(median_time_us(torch, c, 20, rot), 2)
    r["cudnn_eager_us"] = round(eager_time_us(torch, c, 20, rot), 2)
    for name, kernel in SPECS.items():
        for n in (None,) + COUNTS:
            extra = {} if n is None else {"num_splits": n}
            out = kernel(qs[0], ks[0], vs[0], **extra).float()
            tag = f"{name}_" + ("default" if n is None else f"at{n}")
            r[tag] = {"us": round(median_time_us(torch, lambda i: kernel(qs[i], ks[i], vs[i], **extra), 20, rot), 2),
                      "eager_us": round(eager_time_us(torch, lambda i: kernel(qs[i], ks[i], vs[i], **extra), 20, rot), 2),
                      "splits": kernel.last_splits, "err": None if ref is None else float((out - ref).abs().max())}
    rows.append(r)
    print(json.dumps(r), flush=True)
    del qs, ks, vs, ref
    torch.cuda.empty_cache()
json.dump(rows, open(sys.argv[1], "w"), indent=1)
