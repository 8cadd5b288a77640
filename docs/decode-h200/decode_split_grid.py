"""Decode GPU time per split count, as a decode loop feels it: every layer reads its own cache (so
the step's K/V is not in L2), one step captured in a CUDA graph and replayed; beside torch SDPA
over the same caches. Cells: batch x cache length, GQA 32/8, one new token; the specs' split
heuristic pick and every forced count, per cell, medians of round-robin rounds.
Usage: python3 docs/decode-h200/decode_split_grid.py [--json FILE] [--head-dim D] [--batches 1,8] [--lengths 4096]
                                         [--splits 1,2,4] spec ..."""
import argparse
import json
import math
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

import attngen

STEP_BYTES = 512 << 20        # K/V bytes one replayed step reads at least (L2 is ~60 MB)


def capture(step):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


def replay_us(graph, reps=10):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    a.record()
    for _ in range(reps):
        graph.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps * 1e3


def cell(batch, length, head_dim, kernels, splits, rounds=7):
    h = torch.float16 if kernels[0].plan.spec.dtype == "fp16" else torch.bfloat16
    layer_bytes = 2 * batch * 8 * length * head_dim * 2
    layers = max(2, min(64, math.ceil(STEP_BYTES / layer_bytes)))
    caches = [(torch.randn(batch, 8, length, head_dim, device="cuda", dtype=h),
               torch.randn(batch, 8, length, head_dim, device="cuda", dtype=h)) for _ in range(layers)]
    q = torch.randn(batch, 32, 1, head_dim, device="cuda", dtype=h)
    lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
    outs = [torch.empty_like(q) for _ in range(layers)]
    ref = F.scaled_dot_product_attention(q.float(), caches[0][0].float(), caches[0][1].float(), enable_gqa=True)
    steps = {"sdpa": lambda: [F.scaled_dot_product_attention(q, k, v, enable_gqa=True) for k, v in caches]}
    picks = {}
    for kernel in kernels:
        kernel(q, *caches[0], cache_seqlens=lens)
        picks[kernel.name] = kernel.last_splits
        for n in (None, *splits):
            err = (kernel(q, *caches[0], cache_seqlens=lens, num_splits=n).float() - ref).abs().max().item()
            if not err < 2e-2:
                raise SystemExit(f"{kernel.name} splits {n}: error {err}")
            steps[(kernel.name, n)] = (lambda kernel=kernel, n=n: [
                kernel(q, k, v, cache_seqlens=lens, num_splits=n, out=o) for (k, v), o in zip(caches, outs)])
    graphs = {key: capture(step) for key, step in steps.items()}
    times = {key: [] for key in graphs}
    for _ in range(rounds):
        for key, graph in graphs.items():
            times[key].append(replay_us(graph) / layers)
    us = {key: statistics.median(t) for key, t in times.items()}
    gb = layer_bytes / 1e6
    rows = []
    for kernel in kernels:
        best = min(splits, key=lambda n: us[(kernel.name, n)])
        rows.append({"spec": kernel.name, "batch": batch, "seqlen_k": length, "head_dim": head_dim, "layers": layers,
                     "pick": picks[kernel.name], "pick_us": us[(kernel.name, None)], "best": best,
                     "best_us": us[(kernel.name, best)], "sdpa_us": us["sdpa"],
                     "per_split_us": {str(n): us[(kernel.name, n)] for n in splits}})
        line = " ".join(f"{n}:{us[(kernel.name, n)]:.1f}" for n in splits)
        print(f"B{batch:<3} Sk{length:<6} d{head_dim} {kernel.name:<32} pick {picks[kernel.name]:>2} "
              f"{us[(kernel.name, None)]:7.1f} us ({gb / us[(kernel.name, None)]:.2f} TB/s)  best {best:>2} "
              f"{us[(kernel.name, best)]:7.1f}  sdpa {us['sdpa']:7.1f}  | {line}", flush=True)
    graphs.clear()
    torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("specs", nargs="+")
    ap.add_argument("--json")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--batches", default="1,2,4,8,16")
    ap.add_argument("--lengths", default="1024,4096,16384")
    ap.add_argument("--splits", default="1,2,3,4,6,8,12,16,24,32")
    args = ap.parse_args()
    kernels = [attngen.load(s) for s in args.specs]
    splits = [int(x) for x in args.splits.split(",")]
    rows = []
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; us per layer (graph replay, cold K/V)")
    for b in (int(x) for x in args.batches.split(",")):
        for n in (int(x) for x in args.lengths.split(",")):
            rows += cell(b, n, args.head_dim, kernels, splits)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
