"""#60's decode grid through the entry point: attngen.attention_with_kvcache (the table's pick for each call) beside
torch SDPA's flash and cuDNN backends, one new token, contiguous caches, bf16, d128; B 1-128, 32/8 (GQA 4), 64/8
(GQA 8) and 32/32 (GQA 1) heads, 2k-128k keys (cells whose K + V pass --max-gb skipped). Per cell: GPU us (queued
behind a GPU sleep, K/V rotated past L2), eager us (back to back, host included), the spec picked and its split count,
K + V bytes, GB/s and % of the device-to-device copy bandwidth measured in the same run, the error against fp32 beside
SDPA's own. Each library is also timed back to back ("*_b2b_us": 40 calls between two CUDA events, queued behind a GPU
sleep, the input sets cycling; the median of 5 such runs, per call), as a decode loop calls it: with an event between
every two calls (the "*_us" columns) a kernel launched as a programmatic dependent cannot start before the event, so
those columns cannot show what such a launch hides (the split kernel's, since 535f0b0b).
Usage: python3 docs/decode-h200/decode_grid_entry.py OUT.json [--max-gb 24] [--batches 1,2,...]"""
import argparse
import json
import sys
from pathlib import Path
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import attngen
from attngen.eval.bench.decode import copy_bandwidth, eager_time_us, median_time_us
from attngen.ops import library
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))
from gpu_timing import back_to_back_us  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--max-gb", type=float, default=24.0)
ap.add_argument("--batches", default="1,2,4,8,16,32,64,128")
ap.add_argument("--keys", default="2048,8192,32768,131072")
ap.add_argument("--heads", default="32/8,64/8,32/32")
args = ap.parse_args()
d, dt = 128, torch.bfloat16
copy = copy_bandwidth(torch)
rows = [{"copy_GBps": round(copy / 1e9, 1)}]
print(json.dumps(rows[0]), flush=True)


def sdpa(backend, q, k, v, gqa):
    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)


for heads in args.heads.split(","):
    h, hkv = map(int, heads.split("/"))
    for sk in map(int, args.keys.split(",")):
        for b in map(int, args.batches.split(",")):
            kv_bytes = 2 * b * hkv * sk * d * 2
            if kv_bytes > args.max_gb * 1e9 / 2:      # two rotating sets must fit
                continue
            rot = max(2, min(8, int(3 * 60e6 // kv_bytes) + 1))
            qs = [torch.randn(b, h, 1, d, device="cuda", dtype=dt) for _ in range(rot)]
            ks = [torch.randn(b, hkv, sk, d, device="cuda", dtype=dt) for _ in range(rot)]
            vs = [torch.randn_like(k) for k in ks]
            fn = lambda i: attngen.attention_with_kvcache(qs[i], ks[i], vs[i])
            out = fn(0).float()
            ref = None
            if b * h * sk * d * 4 <= 1e9:         # an fp32 reference where it fits beside the caches
                k32 = ks[0].float().repeat_interleave(h // hkv, 1); v32 = vs[0].float().repeat_interleave(h // hkv, 1)
                ref = ((qs[0].float() @ k32.transpose(-1, -2)) * d ** -0.5).softmax(-1) @ v32
                del k32, v32
            key = next(kk for kk in library._DECODE if kk[2] == qs[0].shape and kk[3] == ks[0].shape)
            kern = library._DECODE[key]
            r = {"cell": f"B{b} {h}/{hkv} Sk{sk}", "KV_MB": round(kv_bytes / 1e6, 1), "spec": kern.plan.spec.name,
                 "gpu_us": round(median_time_us(torch, fn, 20, rot), 2), "splits": kern.last_splits,
                 "eager_us": round(eager_time_us(torch, fn, 20, rot), 2),
                 "b2b_us": round(back_to_back_us(fn, [(i,) for i in range(rot)], n=40, runs=5), 2),
                 "err": None if ref is None else float((out - ref).abs().max())}
            r["GBps"] = round(kv_bytes / r["gpu_us"] / 1e3, 1)
            r["pct_copy"] = round(100 * kv_bytes / (r["gpu_us"] * 1e-6) / copy, 1)
            for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                try:
                    g = lambda i, backend=backend: sdpa(backend, qs[i], ks[i], vs[i], h != hkv)
                    o = g(0).float()
                    r[f"{name}_us"] = round(median_time_us(torch, g, 20, rot), 2)
                    r[f"{name}_b2b_us"] = round(back_to_back_us(g, [(i,) for i in range(rot)], n=40, runs=5), 2)
                    r[f"{name}_eager_us"] = round(eager_time_us(torch, g, 20, rot), 2)
                    r[f"{name}_err"] = None if ref is None else float((o - ref).abs().max())
                except RuntimeError as exc:      # a backend that refuses the shape
                    r[f"{name}_us"] = None
                    r[f"{name}_error"] = str(exc).splitlines()[0][:120]
            best = min(x for x in (r.get("flash_us"), r.get("cudnn_us")) if x is not None)
            r["vs_fastest"] = round(best / r["gpu_us"], 3)
            best = min(x for x in (r.get("flash_b2b_us"), r.get("cudnn_b2b_us")) if x is not None)
            r["b2b_pct_copy"] = round(100 * kv_bytes / (r["b2b_us"] * 1e-6) / copy, 1)
            r["b2b_vs_fastest"] = round(best / r["b2b_us"], 3)
            rows.append(r)
            print(json.dumps(r), flush=True)
            del qs, ks, vs, out, ref
            torch.cuda.empty_cache()
json.dump(rows, open(args.out, "w"), indent=1)
