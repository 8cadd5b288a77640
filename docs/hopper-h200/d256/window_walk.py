"""The persistent walk's window units on the H200: Gemma's window calls (a causal 1024- or 4096-key window, with
and without softcap 50) and a two-sided window, on the d256 window cells, each kernel forced, alternating in one
process, bf16. Three kernels per call: the base cell (one block per query block), the persistent cell as the
previous checkout generated it (query blocks handed out in a fixed order) and as this checkout does (a window's
ramp in pairs, each block past it alone). GPU us (attngen bench's queued timing, input sets rotated past L2),
median of 3 rounds, and the largest difference of the new walk's output from the base cell's and the old walk's.
Usage (GPU machine, repository root): python3 docs/hopper-h200/d256/window_walk.py OLD_SOURCES_DIR OUT.json"""
from pathlib import Path
import json
import sys

import torch

import attngen
from attngen.eval.bench import Case, input_sets
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "measurements"))   # the helpers the scripts share
from gpu_timing import alternating_sets, old_kernel

OLD = Path(sys.argv[1])
SHAPES = ((2, 16, 1024), (4, 16, 2048), (2, 16, 4096), (1, 16, 8192), (1, 16, 16384), (1, 8, 32768))
CALLS = (("window 1023 causal", "window", {"window": (1023, 0)}),
         ("window 4095 causal", "window", {"window": (4095, 0)}),
         ("softcap 50, window 4095 causal", "softcap", {"softcap": 50.0, "window": (4095, 0)}),
         ("window 1023/1023", "window", {"window": (1023, 1023), "causal": False}))
kernels = {}
for member in ("window", "softcap"):
    kernels[f"{member} base"] = attngen.load(f"specs/h100_wgmma_d256_{member}_bf16.yaml")
    new = attngen.load(f"specs/h100_wgmma_d256_{member}_persistent_bf16.yaml")
    kernels[f"{member} walk before"] = old_kernel(new, OLD)
    kernels[f"{member} walk after"] = new

rows, gen = [], torch.Generator(device="cuda")
gen.manual_seed(0)
for b, h, s in SHAPES:
    for label, member, kw in CALLS:
        kw = {"causal": True, **kw}
        sets = input_sets(torch, Case(b, h, s, 256, "bf16", kw["causal"]), torch.device("cuda"), gen)
        pair = {name.split(" ", 1)[1]: k for name, k in kernels.items() if name.startswith(member)}
        calls = {name: ((lambda q, k_, v, k=k: k(q, k_, v, **kw)), sets) for name, k in pair.items()}
        med, each = alternating_sets(calls, 3)
        q, k, v = sets[0]
        out = {name: fn(q, k, v).float() for name, (fn, _) in calls.items()}
        row = {"shape": f"{b}x{h}x{s}x256", "call": label, "us": med, "rounds": each,
               "after_vs_base": float((out["walk after"] - out["base"]).abs().max()),
               "after_vs_before": float((out["walk after"] - out["walk before"]).abs().max())}
        rows.append(row)
        print(json.dumps({x: row[x] for x in ("shape", "call", "us", "after_vs_base", "after_vs_before")}), flush=True)
        sets = out = None
        torch.cuda.empty_cache()
Path(sys.argv[2]).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                         "rows": rows}, indent=1) + "\n")
