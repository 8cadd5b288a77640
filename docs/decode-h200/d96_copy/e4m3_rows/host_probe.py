"""Host time of the e4m3 d96 decode call beside d128 e4m3 and fp16 d96: 200 calls back to back without a synchronize
(host per call), the GPU time in a CUDA graph, eager time over 30 and 200 calls, and a cProfile of 200 calls.
Usage: python3 docs/decode-h200/d96_copy/e4m3_rows/host_probe.py (output: host_probe.txt)"""
import cProfile, pstats, io, sys, time, statistics
import torch
sys.path.insert(0, 'docs/measurements')
import fp8_kv_decode as fk
from attngen.eval.bench.timing import time_eager
scales = (torch.tensor([0.02], device="cuda"), torch.tensor([0.01], device="cuda"))
for B, H, Hkv, D, S, e4 in ((1, 32, 32, 96, 16384, True), (1, 32, 8, 128, 32768, True), (1, 32, 32, 96, 16384, False), (8, 32, 8, 96, 8192, True)):
    q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.float16)
    lens = torch.full((B,), S, dtype=torch.int32, device="cuda")
    sets = fk.caches(B, Hkv, S, D, e4, False, 2)
    st = fk.step_of(q, sets, lens, scales)
    for i in range(10): st(i)
    torch.cuda.synchronize()
    host = []
    for r in range(5):
        torch.cuda.synchronize(); t0 = time.perf_counter()
        for i in range(200): st(i)
        host.append((time.perf_counter() - t0) / 200 * 1e6); torch.cuda.synchronize()
    g = fk.graph_of(q, sets, lens, scales, 30)
    gpu = statistics.median(fk.time_graph(g, 30) for _ in range(3))
    e30 = time_eager(torch, st, [(0,), (1,)], reps=30, rounds=5)
    e200 = time_eager(torch, st, [(0,), (1,)], reps=200, rounds=5)
    print(f"B{B} {H}/{Hkv} d{D} {S} {'e4m3' if e4 else 'fp16'}: host per call (no sync) {[round(h,1) for h in host]}, gpu {gpu:.1f}, eager30 {e30:.1f}, eager200 {e200:.1f}", flush=True)
    pr = cProfile.Profile(); torch.cuda.synchronize(); pr.enable()
    for i in range(200): st(i)
    pr.disable(); torch.cuda.synchronize()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(12); print(s.getvalue()[-2500:], flush=True)
    del g, sets; torch.cuda.empty_cache()
