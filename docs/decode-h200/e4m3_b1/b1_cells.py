"""Contiguous e4m3 d128 caches at batch 1-2: which cell serves a call best. The cells that can read a contiguous
e4m3 cache (the 3-stage contiguous cell, the 2-stage one, the pairs cell and the paged-capable 2-stage cell with its
combine kernel) and the fp16-cache contiguous cell on an fp16 copy of the same cache, each at its default split count
and at forced counts, timed two ways in alternating rounds: "b2b" (30 calls back to back between two events) and
"op" (a small torch op before each call, as a decode step's attention follows other kernels). Each output is checked
against the 3-stage cell's at its default count.
Usage: python3 docs/decode-h200/e4m3_b1/b1_cells.py OUT.json [ROUNDS] [GRIDS] [KEYS] [HEAD_DIM]
(GRIDS e.g. 1x32x8,1x64x8; KEYS e.g. 8192,32768; HEAD_DIM 128, the default, or 64: d64 has no 2-stage cell)"""
import json
import statistics
import sys
from pathlib import Path

import torch

import attngen

rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
GRIDS = [(1, 32, 8), (1, 64, 8), (1, 8, 1), (2, 32, 8)]
if len(sys.argv) > 3:
    GRIDS = [tuple(map(int, g.split("x"))) for g in sys.argv[3].split(",")]
KEYS = (4096, 8192, 16384, 32768, 65536, 131072)
if len(sys.argv) > 4:
    KEYS = tuple(map(int, sys.argv[4].split(",")))
COUNTS = (None, 8, 12, 16, 24, 32)
SPECS = Path(attngen.__file__).resolve().parents[1] / "specs"
D = int(sys.argv[5]) if len(sys.argv) > 5 else 128
names = {"s3": f"h200_decode_d{D}_kv_e4m3_contiguous", "s2": f"h200_decode_d{D}_kv_e4m3_contiguous_s2",
         "pairs": f"h200_decode_d{D}_kv_e4m3_contiguous_pairs", "paged": f"h200_decode_d{D}_kv_e4m3"}
if D != 128:
    del names["s2"]
cells = {k: attngen.load(SPECS / f"{n}.yaml") for k, n in names.items()}
fp16 = attngen.load(SPECS / f"h200_decode_d{D}_contiguous.yaml")
scales = {"k_scale": torch.tensor([0.7], device="cuda"), "v_scale": torch.tensor([1.3], device="cuda")}
side = torch.randn(4096, device="cuda")


def gpu_time(call, n=30, repeats=3):
    """Median over `repeats` of the mean GPU time of n calls queued behind a short GPU sleep."""
    out = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(int(2e7))
        start.record()
        for _ in range(n):
            call()
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end) / n * 1e3)
    return statistics.median(out)


out = {"command": " ".join(["python3"] + sys.argv), "device": torch.cuda.get_device_name(), "torch": torch.__version__,
       "rows": []}
for b, h, hkv in GRIDS:
    for sk in KEYS:
        kv_bytes = 2 * b * hkv * sk * D
        rot = max(2, min(8, int(3 * 60e6 // kv_bytes) + 1))
        qs = [torch.randn(b, h, 1, D, device="cuda", dtype=torch.float16) for _ in range(rot)]
        k16 = [torch.randn(b, hkv, sk, D, device="cuda", dtype=torch.float16) for _ in range(rot)]
        v16 = [torch.randn(b, hkv, sk, D, device="cuda", dtype=torch.float16) for _ in range(rot)]
        ks = [x.to(torch.float8_e4m3fn) for x in k16]
        vs = [x.to(torch.float8_e4m3fn) for x in v16]
        at = {"i": 0}

        def runner(fn, op):
            def run():
                j = at["i"] % rot
                at["i"] += 1
                if op:
                    side.mul_(1.0)
                return fn(j)
            return run
        calls = {"fp16": lambda j: fp16(qs[j], k16[j], v16[j])}
        for c, k in cells.items():
            for s in COUNTS:
                calls[f"{c}:{s or 'auto'}"] = (lambda k, s: lambda j: k(qs[j], ks[j], vs[j], num_splits=s, **scales))(k, s)
        ref = calls["s3:auto"](0).float()
        err, splits = {}, {}
        for name, fn in calls.items():
            o = fn(0)
            if name != "fp16":
                err[name] = float((o.float() - ref).abs().max())
                splits[name] = cells[name.split(":")[0]].last_splits
        times = {f"{c}|{m}": [] for c in calls for m in ("b2b", "op")}
        for r in range(rounds):
            order = list(calls.items()) if r % 2 == 0 else list(calls.items())[::-1]
            for c, fn in order:
                times[f"{c}|b2b"].append(gpu_time(runner(fn, False)))
                times[f"{c}|op"].append(gpu_time(runner(fn, True)))
        us = {w: round(statistics.median(v), 2) for w, v in times.items()}
        best = {m: min(((v, k.split("|")[0]) for k, v in us.items() if k.endswith(m) and not k.startswith("fp16")))
                for m in ("b2b", "op")}
        row = {"grid": f"B{b} {h}/{hkv} Sk{sk}", "KV_MB_e4m3": round(kv_bytes / 1e6, 1), "splits": splits,
               "max_diff_vs_s3": max(err.values()), "us": us, "best": best,
               "fp16_over_best": {m: round(us[f"fp16|{m}"] / best[m][0], 3) for m in ("b2b", "op")},
               "fp16_over_s3auto": {m: round(us[f"fp16|{m}"] / us[f"s3:auto|{m}"], 3) for m in ("b2b", "op")}}
        out["rows"].append(row)
        print(row["grid"], "splits", {k: v for k, v in splits.items() if k.endswith("auto")}, "best", best,
              "fp16", us["fp16|b2b"], us["fp16|op"], "s3", us["s3:auto|b2b"], us["s3:auto|op"],
              "paged", us["paged:auto|b2b"], us["paged:auto|op"], "maxdiff", row["max_diff_vs_s3"], flush=True)
        json.dump(out, open(sys.argv[1], "w"), indent=1)
        del qs, ks, vs, k16, v16
        torch.cuda.empty_cache()
