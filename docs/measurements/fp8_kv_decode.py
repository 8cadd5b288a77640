"""One decode step on an e4m3 KV cache against the same step on an fp16 cache, on the GPU.

    python3 docs/measurements/fp8_kv_decode.py [--json OUT.json] [--rounds 5] [--calls 30] [--cases d128|d96] [--eager]

Shapes (d128): B 8 and B 1, 32 query heads over 8 KV heads, d128, Sq 1, 8k / 16k / 32k keys per sequence;
(d96, Phi-3-mini's head dim): 32/32 heads at B8 4k-16k and B1 16k-32k, and 32/8 at B8 8k-32k; each
contiguous and paged (pages of 16, shuffled). Each case times attngen.attention_with_kvcache on fp16
caches and on e4m3 caches (k_scale, v_scale per tensor) with CUDA events around `calls` calls replayed
from a CUDA graph (GPU time alone: the host path is not what a serving loop pays per step), several
K/V buffers in rotation so that the caches do not sit in the 60 MB L2, over `rounds` alternating
rounds; it prints the medians, the speedup (goal: 1.7x and more at long context) and the bytes per
second of the cache each reads. --eager adds each call's eager time (host included): `calls` calls back to
back through the same rotation, the wall clock to the synchronize after them, per call (attngen.eval.bench's
time_eager), the median of `rounds`."""
from __future__ import annotations

import argparse
import json
import statistics

import torch

import attngen
from attngen.eval.bench.timing import time_eager

CASES = {"d128": [(b, 32, 8, 128, s) for b in (8, 1) for s in (8192, 16384, 32768)],
         "d96": [(8, 32, 32, 96, s) for s in (4096, 8192, 16384)] + [(1, 32, 32, 96, s) for s in (16384, 32768)]
                + [(8, 32, 8, 96, s) for s in (8192, 16384, 32768)]}
PAGE = 16


def caches(B, Hkv, S, D, e4m3: bool, paged: bool, copies: int):
    """`copies` (k, v, table) sets of one cache, each its own memory (rotated while timing)."""
    out = []
    for _ in range(copies):
        k = torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.float16)
        v = torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.float16)
        if e4m3:
            k, v = (x.to(torch.float8_e4m3fn) for x in (k, v))
        table = None
        if paged:
            per = S // PAGE
            order = torch.randperm(B * per, device="cuda")
            def pool(x):
                p = torch.empty((B * per, Hkv, PAGE, D), dtype=x.dtype, device="cuda")
                p[order] = x.view(B, Hkv, per, PAGE, D).permute(0, 2, 1, 3, 4).reshape(B * per, Hkv, PAGE, D)
                return p
            k, v, table = pool(k), pool(v), order.view(B, per).int()
        out.append((k, v, table))
    return out


def step_of(q, sets, lens, scales):
    """step(i): the decode call on the i-th of `sets` (cycling)."""
    ks, vs = scales
    def step(i):
        k, v, table = sets[i % len(sets)]
        kw = {"k_scale": ks, "v_scale": vs} if k.dtype == torch.float8_e4m3fn else {}
        return attngen.attention_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table, **kw)
    return step


def graph_of(q, sets, lens, scales, calls):
    """A CUDA graph of `calls` decode steps cycling through `sets`."""
    step = step_of(q, sets, lens, scales)
    for i in range(len(sets)):   # compile, load and warm every set outside the capture
        step(i)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            step(i)
    return g


def time_graph(g, calls) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    g.replay()
    start.record()
    g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / calls   # us per call


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--cases", choices=sorted(CASES), default="d128")
    ap.add_argument("--eager", action="store_true", help="also time each call eager, back to back, host included")
    args = ap.parse_args()
    scales = (torch.tensor([0.02], device="cuda"), torch.tensor([0.01], device="cuda"))
    rows = []
    print(f"{'cache':>10} {'B':>2} {'Hq/Hkv':>6} {'keys':>6} {'fp16 us':>8} {'e4m3 us':>8} {'speedup':>7} "
          f"{'fp16 TB/s':>9} {'e4m3 TB/s':>9}")
    for B, H, Hkv, D, S in CASES[args.cases]:
        for paged in (False, True):
            q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.float16)
            lens = torch.full((B,), S, dtype=torch.int32, device="cuda")
            # enough copies that the rotation's caches exceed the L2 several times
            copies = max(2, min(8, -(-200_000_000 // (2 * B * Hkv * S * D))))
            graphs = {}
            for e4m3 in (False, True):
                sets = caches(B, Hkv, S, D, e4m3, paged, copies)
                graphs[e4m3] = (graph_of(q, sets, lens, scales, args.calls), sets)
            times = {False: [], True: []}
            for _ in range(args.rounds):   # alternate, so that clocks and neighbours weigh both alike
                for e4m3 in (False, True):
                    times[e4m3].append(time_graph(graphs[e4m3][0], args.calls))
            fp16, e4m3 = statistics.median(times[False]), statistics.median(times[True])
            kv_bytes = 2 * B * Hkv * S * D
            row = {"cache": "paged16" if paged else "contiguous", "batch": B, "heads": H, "kv_heads": Hkv,
                   "head_dim": D, "keys": S, "fp16_us": fp16, "e4m3_us": e4m3, "speedup": fp16 / e4m3,
                   "fp16_tbs": 2 * kv_bytes / fp16 / 1e6, "e4m3_tbs": kv_bytes / e4m3 / 1e6,
                   "rounds": times[False] + times[True]}
            if args.eager:
                for kind, (_, sets) in (("fp16", graphs[False]), ("e4m3", graphs[True])):
                    row[kind + "_eager_us"] = time_eager(
                        torch, step_of(q, sets, lens, scales), [(i,) for i in range(len(sets))], reps=args.calls,
                        rounds=args.rounds)
            rows.append(row)
            print(f"{row['cache']:>10} {B:>2} {H:>3}/{Hkv:<2} {S:>6} {fp16:>8.1f} {e4m3:>8.1f} {fp16 / e4m3:>6.2f}x "
                  f"{row['fp16_tbs']:>9.2f} {row['e4m3_tbs']:>9.2f}"
                  + (f"  eager {row['fp16_eager_us']:.1f} / {row['e4m3_eager_us']:.1f} us" if args.eager else ""))
            del graphs
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
