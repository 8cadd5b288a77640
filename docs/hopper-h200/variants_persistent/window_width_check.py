"""The table's route by window width (max_window) on gpt-oss's local layers: sinks under a causal 127-key window,
64/8 heads, d64, bf16. Per cell, alternating in one process: `attngen.attention` (the table's pick, which a
window of at most 128 keys sends to h100_wgmma_d64_persistent_q2_sink_bf16), and the two cells it chooses
between called directly: two consumer warpgroups (q2) and three (q2_c3, the table's pick before). A 4095-key
window at 1x64/8x16384 checks that wider windows stay on three. GPU us (attngen bench's queued timing, input
sets rotated past L2, median of 3 rounds), eager us (back-to-back calls, host included, median of 3 rounds) and
the largest |difference| of each output from the entry point's (bit for bit where it ran the same kernel).
Usage (GPU machine, repository root): python3 docs/hopper-h200/variants_persistent/window_width_check.py OUT.json"""
from pathlib import Path
import json
import statistics
import sys

import torch

import attngen
from attngen.eval.bench.timing import time_eager
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "measurements"))   # the helpers the scripts share
from gpu_timing import alternating_sets
sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_calls import sets_for

CELLS = (((127, 0), ((8, 512), (4, 1024), (1, 4096), (1, 16384))), ((4095, 0), ((1, 16384),)))
H, HK, D = 64, 8, 64
direct = {"q2": attngen.load("specs/h100_wgmma_d64_persistent_q2_sink_bf16.yaml"),
          "q2_c3": attngen.load("specs/h100_wgmma_d64_persistent_q2_c3_sink_bf16.yaml")}
rows, gen = [], torch.Generator(device="cuda")
gen.manual_seed(0)
for window, shapes in CELLS:
    for b, s in shapes:
        sinks = torch.randn(H, generator=gen, device="cuda")
        kw = {"causal": True, "window": window, "sinks": sinks}
        sets = sets_for(b, H, HK, s, D, gen)
        fns = {"entry": lambda q, k, v: attngen.attention(q, k, v, **kw)}
        fns.update({name: (lambda q, k, v, kernel=kernel: kernel(q, k, v, **kw)) for name, kernel in direct.items()})
        gpu, rounds = alternating_sets({name: (fn, sets) for name, fn in fns.items()}, 3)
        eager = {name: [] for name in fns}
        for _ in range(3):
            for name, fn in fns.items():
                eager[name].append(time_eager(torch, fn, sets, reps=50))
        q, k, v = sets[0]
        out = {name: fn(q, k, v).float() for name, fn in fns.items()}
        row = {"window": list(window), "shape": f"{b}x{H}/{HK}x{s}x{D}", "gpu_us": gpu, "gpu_rounds": rounds,
               "eager_us": {name: statistics.median(t) for name, t in eager.items()},
               "max_diff_from_entry": {name: float((o - out["entry"]).abs().max()) for name, o in out.items()}}
        rows.append(row)
        print(json.dumps({x: row[x] for x in ("window", "shape", "gpu_us", "eager_us", "max_diff_from_entry")}),
              flush=True)
        sets = out = None
        torch.cuda.empty_cache()
Path(sys.argv[1]).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                         "command": " ".join(["python3", *sys.argv]), "rows": rows}, indent=1) + "\n")
