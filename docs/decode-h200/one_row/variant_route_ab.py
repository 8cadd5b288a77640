"""One query row with a variant (softcap, sinks, window (W - 1, W - 1) with causal, ALiBi) through attngen.attention,
the one-row route off (forward_variant's kernels) and on (the four variants routed from library.ROUTE_VARIANT_MIN_WORK
on: MIN_WORK=N sets it, 0 routes every call), in turn in one process: GPU us per call in CUDA graphs of 20 calls over
rotating K/V copies (past L2), and eager us (20 calls back to back, host included), medians of 5 per round; ROUNDS rounds (default 3), each mode's best round kept. The
first cell is timed twice (WARM_UP, default 1: its first pass, which runs while the process warms up, is dropped).
Usage: [CASES=d64_d96|d96_small] python3 docs/decode-h200/one_row/variant_route_ab.py OUT.json [ROUNDS]"""
import json, os, statistics, sys
import torch
import attngen
from attngen.ops import library

ROUTED = frozenset({"softcap", "window", "alibi", "sink"})
MIN_WORK = int(os.environ.get("MIN_WORK", library.ROUTE_VARIANT_MIN_WORK))
CASES = [(b, 32, 8, sk, 128) for b, sk in ((1, 1024), (1, 4096), (1, 16384), (2, 1024), (8, 1024), (8, 4096),
                                           (32, 1024))] + \
    [(8, 32, 8, 4096, 64), (8, 32, 32, 4096, 128)]
# CASES=d64_d96: the head dims whose decode variant cells came later (softcap, ALiBi and window at d64; those and sinks
# at d96)
if os.environ.get("CASES") == "d64_d96":
    CASES = [(b, 32, 8, sk, d) for d in (64, 96) for b, sk in ((1, 1024), (1, 4096), (1, 16384), (8, 1024), (8, 4096),
                                                               (32, 1024))] + [(8, 32, 32, 4096, 64)]
# CASES=d96_small: d96 calls under the threshold, which the route takes where the forward would pad them
if os.environ.get("CASES") == "d96_small":
    CASES = [(b, 32, 8, sk, 96) for b, sk in ((1, 1024), (1, 4096), (1, 16384), (2, 1024), (1, 512))]


def time_graph(fn, sets, calls=20):
    for s in sets:
        fn(*s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fn(*sets[i % len(sets)])
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(5):
        g.replay(); start.record(); g.replay(); end.record(); end.synchronize()
        out.append(start.elapsed_time(end) * 1000 / calls)
    return statistics.median(out)


def time_eager(fn, sets, calls=20):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(6):
        torch.cuda.synchronize(); start.record()
        for i in range(calls):
            fn(*sets[i % len(sets)])
        end.record(); end.synchronize(); out.append(start.elapsed_time(end) * 1000 / calls)
    return statistics.median(out[1:])


def route(on: bool) -> None:
    library.ROUTE_VARIANTS = ROUTED if on else frozenset()
    library.ROUTE_VARIANT_MIN_WORK = MIN_WORK
    library._VARIANT.clear()
    library._PREPARED_VARIANT.clear()


rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
warm_up = int(os.environ.get("WARM_UP", "1"))
rows = []
for n, (b, h, hkv, sk, d) in enumerate(CASES[:1] * warm_up + CASES):
    dt = torch.bfloat16
    q = torch.randn(b, h, 1, d, device="cuda", dtype=dt)
    copies = max(2, min(8, -(-200_000_000 // (2 * b * hkv * sk * d * 2))))
    sets = [(q,) + tuple(torch.randn(b, hkv, sk, d, device="cuda", dtype=dt) for _ in range(2)) for _ in range(copies)]
    variants = {"softcap": {"causal": True, "alignment": "bottom_right", "softcap": 30.0},
                "sinks": {"causal": True, "alignment": "bottom_right", "sinks": torch.randn(h, device="cuda")},
                "window": {"causal": True, "alignment": "bottom_right", "window": (1023, 1023)},
                "alibi": {"alibi_slopes": torch.rand(h, device="cuda") * 0.3}}
    for name, kw in variants.items():
        fn = lambda q, k, v: attngen.attention(q, k, v, **kw)
        row = {"variant": name, "grid": f"B{b} {h}/{hkv} Sk{sk} d{d}", "gpu_us": {"off": [], "on": []},
               "eager_us": {"off": [], "on": []}}
        outs = {}
        for _ in range(rounds):
            for mode in ("off", "on"):
                route(mode == "on")
                outs[mode] = fn(*sets[0]).float()
                row["gpu_us"][mode].append(round(time_graph(fn, sets), 2))
                row["eager_us"][mode].append(round(time_eager(fn, sets), 2))
        row["max_diff"] = float((outs["on"] - outs["off"]).abs().max())
        row["routed"] = any(k is library.ONE_ROW_DECODE_VARIANT for k in library._VARIANT.values())
        if n < warm_up:
            continue
        rows.append(row)
        print(f"{name:8s} {row['grid']:22s} GPU {min(row['gpu_us']['off']):8.2f} -> {min(row['gpu_us']['on']):8.2f}  "
              f"eager {min(row['eager_us']['off']):8.2f} -> {min(row['eager_us']['on']):8.2f}  routed {row['routed']}  "
              f"diff {row['max_diff']:.1e}", flush=True)
json.dump({"command": " ".join(["python3"] + sys.argv), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "min_work": MIN_WORK, "rows": rows}, open(sys.argv[1], "w"), indent=1)
