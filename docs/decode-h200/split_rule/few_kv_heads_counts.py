"""The combine-kernel decode cells (paged-capable, the split count from the wave rule with two-tile slices) on
grids of few KV heads: their default split count against forced ones, on contiguous caches, cuDNN beside for the
half-precision cells. GPU us, queued, rotated past L2; each count's error against fp32.
Usage (GPU machine, repository root): python3 docs/decode-h200/split_rule/few_kv_heads_counts.py OUT.json"""
import json
import sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from attngen.runtime import load
from attngen.eval.bench.decode import median_time_us

SPECS = {"d128_bf16": ("specs/h200_decode_d128_bf16.yaml", 128, False),
         "d64_bf16": ("specs/h200_decode_d64_bf16.yaml", 64, False),
         "d128_e4m3": ("specs/h200_decode_d128_kv_e4m3.yaml", 128, True)}
COUNTS = (8, 16, 32, 64, 128)
rows = []
for name, (spec, d, e4) in SPECS.items():
    kernel = load(spec)
    dt = torch.float16 if e4 else torch.bfloat16
    for b, h, hkv in ((1, 8, 1), (2, 8, 1), (4, 8, 1), (16, 8, 1), (1, 32, 1), (1, 16, 2), (1, 32, 4)):
        for sk in (4096, 16384, 32768, 131072):
            rot = max(2, min(16, int(3 * 60e6 // ((2 if e4 else 4) * b * hkv * sk * d)) + 1))
            qs = [torch.randn(b, h, 1, d, device="cuda", dtype=dt) for _ in range(rot)]
            ks = [torch.randn(b, hkv, sk, d, device="cuda", dtype=dt) for _ in range(rot)]
            vs = [torch.randn_like(k) for k in ks]
            kw = {}
            if e4:
                ks = [k.to(torch.float8_e4m3fn) for k in ks]; vs = [v.to(torch.float8_e4m3fn) for v in vs]
                kw = {"k_scale": torch.tensor([0.7], device="cuda"), "v_scale": torch.tensor([1.3], device="cuda")}
            kf = ks[0].float() * (0.7 if e4 else 1.0); vf = vs[0].float() * (1.3 if e4 else 1.0)
            ref = ((qs[0].float() @ kf.repeat_interleave(h // hkv, 1).transpose(-1, -2)) * d ** -0.5).softmax(-1) \
                @ vf.repeat_interleave(h // hkv, 1)
            r = {"spec": name, "cell": f"B{b} {h}/{hkv} Sk{sk}"}
            for n in (None,) + COUNTS:
                extra = {} if n is None else {"num_splits": n}
                err = float((kernel(qs[0], ks[0], vs[0], **kw, **extra).float() - ref).abs().max())
                us = median_time_us(torch, lambda i: kernel(qs[i], ks[i], vs[i], **kw, **extra), 20, rot)
                tag = "default" if n is None else f"at{n}"
                r[tag] = {"us": round(us, 2), "splits": kernel.last_splits, "err": err}
            if not e4:
                def c(i):
                    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                        return F.scaled_dot_product_attention(qs[i], ks[i], vs[i], enable_gqa=h != hkv)
                r["cudnn_us"] = round(median_time_us(torch, c, 20, rot), 2)
            rows.append(r)
            print(json.dumps(r), flush=True)
            del qs, ks, vs, kf, vf, ref
            torch.cuda.empty_cache()
json.dump(rows, open(sys.argv[1], "w"), indent=1)
