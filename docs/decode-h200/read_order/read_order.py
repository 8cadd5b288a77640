"""Does the order in which a split call's blocks read the cache set the HBM rate? A read-only probe (16-byte loads,
8 in flight per thread, 512 threads a block, 128 blocks: one per SM, as a split decode call of 8 KV heads x 16
splits) over a buffer of R regions (KV heads) read by P blocks each, in 64 KiB chunks (one loop step of a block):
`sliced`, block k of a region reads its k-th contiguous 1/P (the order of a split call's slices); `strided`, block k
reads chunks k, k + P, k + 2P, ... (the P blocks of a region advance through it side by side). Beside them the
grid-stride read (4 blocks of 512 threads per SM), attngen's decode call and cuDNN on bf16 caches of the same bytes.
GPU us per call queued behind a GPU sleep, buffers rotated past L2, alternating rounds, medians.
Usage: python3 docs/decode-h200/read_order/read_order.py OUT.json [ROUNDS]"""
import json
import statistics
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
// One loop step of a block reads one chunk: 8 x blockDim.x 16-byte words.
extern "C" __global__ void read_regions(const uint4* __restrict__ p, unsigned long long n, int regions, int per_region,
                                        int strided, unsigned* out) {
    const unsigned long long chunk = 8ull * blockDim.x;
    const unsigned long long region_words = n / regions, region_chunks = region_words / chunk;
    const int r = blockIdx.x / per_region, k = blockIdx.x % per_region;
    const uint4* base = p + r * region_words;
    unsigned long long c0, step, c1;
    if (strided) { c0 = k; step = per_region; c1 = region_chunks; }
    else { const unsigned long long per = region_chunks / per_region; c0 = k * per; step = 1; c1 = c0 + per; }
    unsigned acc = 0;
    for (unsigned long long c = c0; c < c1; c += step) {
        const uint4* q = base + c * chunk + threadIdx.x;
        uint4 v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) v[u] = q[u * blockDim.x];
#pragma unroll
        for (int u = 0; u < 8; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (acc == 0x9e3779b9u) out[0] = acc;      // keeps the loads; practically never stores
}
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
    if (acc == 0x9e3779b9u) out[0] = acc;
}
"""
module = SourceModule(SOURCE, no_extern_c=True, options=["-O3"])
read_regions, read_grid = module.get_function("read_regions"), module.get_function("read_grid")
sms = torch.cuda.get_device_properties(0).multi_processor_count
sink = torch.zeros(1, dtype=torch.int32, device="cuda")
copy = copy_bandwidth(torch)
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
d, dt, h, hkv = 128, torch.bfloat16, 32, 8
CELLS = ((8, 2048), (1, 32768), (1, 131072), (8, 32768))   # (batch, keys) of 32/8 heads: 67 MB - 1.07 GB
SHAPES = (("sliced", 128, 1), ("strided", 1, 128), ("sliced", 8, 16), ("strided", 8, 16), ("sliced", 16, 8),
          ("strided", 16, 8))   # (order, regions, blocks per region): 128 blocks each
rows = []
for b, sk in CELLS:
    nbytes = 2 * b * hkv * sk * d * 2
    rot = max(2, min(8, int(3 * 60e6 // nbytes) + 1))
    ks = [torch.randn(b, hkv, sk, d, device="cuda", dtype=dt) for _ in range(rot)]
    vs = [torch.randn_like(k) for k in ks]
    qs = [torch.randn(b, h, 1, d, device="cuda", dtype=dt) for _ in range(rot)]
    flat = [torch.empty(nbytes // 2, device="cuda", dtype=dt).normal_() for _ in range(rot)]
    n16 = np.uint64(nbytes // 16)
    runs = {"grid": lambda i: read_grid(np.uintp(flat[i].data_ptr()), n16, np.uintp(sink.data_ptr()),
                                        block=(512, 1, 1), grid=(4 * sms, 1))}
    for order, regions, per in SHAPES:
        runs[f"{order} {regions}x{per}"] = (lambda i, o=order, r=regions, k=per: read_regions(
            np.uintp(flat[i].data_ptr()), n16, np.int32(r), np.int32(k), np.int32(o == "strided"),
            np.uintp(sink.data_ptr()), block=(512, 1, 1), grid=(r * k, 1)))
    runs["attngen"] = lambda i: attngen.attention_with_kvcache(qs[i], ks[i], vs[i])

    def cudnn(i):
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(qs[i], ks[i], vs[i], enable_gqa=True)
    runs["cudnn"] = cudnn
    times = {k: [] for k in runs}
    for rd in range(rounds):
        for k in (list(runs) if rd % 2 == 0 else list(runs)[::-1]):
            times[k].append(median_time_us(torch, runs[k], 30, rot))
    r = {"cell": f"B{b} {h}/{hkv} Sk{sk}", "MB": round(nbytes / 1e6, 1), "rotate": rot,
         "us": {k: round(statistics.median(v), 2) for k, v in times.items()},
         "pct_of_copy": {k: round(100 * nbytes / (statistics.median(v) * 1e-6) / copy, 1) for k, v in times.items()}}
    print(json.dumps(r), flush=True)
    rows.append(r)
    del ks, vs, qs, flat
    torch.cuda.empty_cache()
json.dump({"command": f"python3 docs/decode-h200/read_order/read_order.py OUT.json {rounds}",
           "device": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_GBps": round(copy / 1e9, 1),
           "rows": rows}, open(sys.argv[1], "w"), indent=1)
