"""The decode loop of .ci/host_time.py (32 layers, B8, GQA 32/8, d128, 4k cache) replayed from a
CUDA graph, per split count and spec, beside SDPA: where the loop's GPU time per step goes.
Usage: python3 .ci/decode_loop_splits.py"""
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

import attngen

ROOT = Path(__file__).resolve().parent.parent
h = torch.float16
caches = [(torch.randn(8, 8, 4096, 128, device="cuda", dtype=h), torch.randn(8, 8, 4096, 128, device="cuda", dtype=h))
          for _ in range(32)]
q = torch.randn(8, 32, 1, 128, device="cuda", dtype=h)
lens = torch.full((8,), 4096, dtype=torch.int32, device="cuda")
out = torch.empty_like(q)


def graph_us(step, reps=30):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / reps * 1e3)
    return statistics.median(times)


print(f"torch SDPA: {graph_us(lambda: [F.scaled_dot_product_attention(q, k, v, enable_gqa=True) for k, v in caches]):.1f} us/step")
for spec in ("h200_decode_d128_fused", "h200_decode_d128"):
    kernel = attngen.load(str(ROOT / "specs" / f"{spec}.yaml"))
    for n in (None, 1, 2, 3, 4, 6, 8):
        us = graph_us(lambda n=n: [kernel(q, k, v, cache_seqlens=lens, num_splits=n, out=out) for k, v in caches])
        print(f"{spec} splits {n or 'auto'}: {us:.1f} us/step", flush=True)
