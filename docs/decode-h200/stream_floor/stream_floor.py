"""The fixed cost of a call that streams N bytes, for a kernel that does nothing else: a read-only stream (16-byte
loads, 8 in flight per thread) over K + V sized buffers, in two shapes, beside attngen's decode call and SDPA's cuDNN
backend on caches of the same bytes (bf16, d128, 32/8 heads, one new token). Each time is fitted as
fixed + bytes / rate through the two largest sizes of its row, so "fixed" is what a call costs above its bytes' time.

- `grid`: 4 blocks of 512 threads per SM, grid-stride over the whole buffer (the fastest shape of a plain read);
- `slices`: 128 blocks of 512 threads, each reading one contiguous 1/128 of the buffer (a split decode call's
  shape: 8 KV heads x 16 splits, one block per SM).

GPU us per call: queued behind a GPU sleep, buffers rotated past L2 (attngen.eval.bench.decode.median_time_us).
Usage: python3 docs/decode-h200/stream_floor/stream_floor.py OUT.json"""
import json
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attngen
from attngen.eval.bench.decode import copy_bandwidth, median_time_us

import pycuda.autoprimaryctx  # noqa: F401  (torch's context)
from pycuda.compiler import SourceModule

SOURCE = r"""
extern "C" __global__ void read_grid(const uint4* __restrict__ p, unsigned long long n, unsigned* out) {
    unsigned acc = 0;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 7 * stride < n; i += 8 * stride) {
        uint4 v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) v[u] = p[i + u * stride];
#pragma unroll
        for (int u = 0; u < 8; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n; i += stride) { uint4 v = p[i]; acc ^= v.x ^ v.y ^ v.z ^ v.w; }
    if (acc == 0x9e3779b9u) out[0] = acc;      // keeps the loads; practically never stores
}
extern "C" __global__ void read_slices(const uint4* __restrict__ p, unsigned long long n, unsigned* out) {
    unsigned long long per = n / gridDim.x, begin = per * blockIdx.x, end = begin + per;
    unsigned acc = 0;
    unsigned long long i = begin + threadIdx.x;
    for (; i + 7 * blockDim.x < end; i += 8 * blockDim.x) {
        uint4 v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) v[u] = p[i + u * blockDim.x];
#pragma unroll
        for (int u = 0; u < 8; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < end; i += blockDim.x) { uint4 v = p[i]; acc ^= v.x ^ v.y ^ v.z ^ v.w; }
    if (acc == 0x9e3779b9u) out[0] = acc;
}
"""
module = SourceModule(SOURCE, no_extern_c=True, options=["-O3"])
read_grid, read_slices = module.get_function("read_grid"), module.get_function("read_slices")
sms = torch.cuda.get_device_properties(0).multi_processor_count
sink = torch.zeros(1, dtype=torch.int32, device="cuda")
copy = copy_bandwidth(torch)
d, dt, h, hkv = 128, torch.bfloat16, 32, 8
CELLS = ((1, 2048), (1, 8192), (8, 2048), (1, 32768), (8, 8192), (1, 131072))   # (batch, keys): 8 MB - 537 MB
rows = []
for b, sk in CELLS:
    nbytes = 2 * b * hkv * sk * d * 2
    rot = max(2, min(8, int(3 * 60e6 // nbytes) + 1))
    ks = [torch.randn(b, hkv, sk, d, device="cuda", dtype=dt) for _ in range(rot)]
    vs = [torch.randn_like(k) for k in ks]
    qs = [torch.randn(b, h, 1, d, device="cuda", dtype=dt) for _ in range(rot)]
    flat = [torch.empty(nbytes // 2, device="cuda", dtype=dt).normal_() for _ in range(rot)]
    n16 = np.uint64(nbytes // 16)
    r = {"cell": f"B{b} {h}/{hkv} Sk{sk}", "MB": round(nbytes / 1e6, 1), "rotate": rot}
    r["grid_us"] = median_time_us(torch, lambda i: read_grid(np.uintp(flat[i].data_ptr()), n16, np.uintp(sink.data_ptr()),
                                                             block=(512, 1, 1), grid=(4 * sms, 1)), 30, rot)
    r["slices_us"] = median_time_us(torch, lambda i: read_slices(np.uintp(flat[i].data_ptr()), n16,
                                                                 np.uintp(sink.data_ptr()), block=(512, 1, 1),
                                                                 grid=(128, 1)), 30, rot)
    r["attngen_us"] = median_time_us(torch, lambda i: attngen.attention_with_kvcache(qs[i], ks[i], vs[i]), 30, rot)
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        r["cudnn_us"] = median_time_us(torch, lambda i: F.scaled_dot_product_attention(qs[i], ks[i], vs[i],
                                                                                       enable_gqa=True), 30, rot)
    r = {k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()}
    print(json.dumps(r), flush=True)
    rows.append(r)
    del ks, vs, qs, flat
    torch.cuda.empty_cache()
fits = {}
big = sorted(rows, key=lambda r: r["MB"])[-2:]
for name in ("grid", "slices", "attngen", "cudnn"):
    (b0, t0), (b1, t1) = ((r["MB"] * 1e6, r[f"{name}_us"]) for r in big)
    rate = (b1 - b0) / ((t1 - t0) * 1e-6)
    fixed = t1 - b1 / rate * 1e6
    fits[name] = {"rate_TBps": round(rate / 1e12, 3), "fixed_us": round(fixed, 2),
                  "above_bytes_us": {r["cell"]: round(r[f"{name}_us"] - r["MB"] * 1e6 / rate * 1e6, 2) for r in rows}}
    print(name, json.dumps(fits[name]), flush=True)
json.dump({"command": "python3 docs/decode-h200/stream_floor/stream_floor.py OUT.json", "device": torch.cuda.get_device_name(),
           "torch": torch.__version__, "copy_GBps": round(copy / 1e9, 1), "rows": rows, "fits": fits},
          open(sys.argv[1], "w"), indent=1)
