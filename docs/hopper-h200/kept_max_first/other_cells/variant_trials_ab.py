"""The d128 softcap and sink cells on the persistent walk (specs/h100_wgmma_d128.yaml's softcap_persistent and
sink_persistent members, bf16) against their trials with softmax.lazy_rescale, softmax.kept_max_first and
schedule.p_buffers: 2 (t_d128_*_persistent_kmpb_bf16.yaml here), alternating in one process on the models' calls
of ../../variants_persistent/model_calls.py (Gemma 2 27B global: softcap 50, causal; softcap 50, full; sinks,
causal); and specs/h100_wgmma_d256.yaml's softcap_persistent member against t_d256_softcap_persistent_km_bf16.yaml
(lazy_rescale and kept_max_first) on Gemma 2 9B's calls (16/8 heads of 256, softcap 50, causal). GPU us (attngen bench's queued timing, input sets rotated past L2), median of 3 rounds, and the largest
difference between the two outputs (`attngen verify` checks each against fp32).
Usage (GPU machine, repository root): python3 docs/hopper-h200/kept_max_first/other_cells/variant_trials_ab.py OUT.json"""
from pathlib import Path
import json
import sys

import torch

import attngen
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "measurements"))   # the helpers the scripts share
from gpu_timing import alternating_sets
sys.path.insert(0, str(HERE.parents[1] / "variants_persistent"))
from model_calls import CALLS, sets_for

TAKEN = {"Gemma 2 27B global: softcap 50, causal", "softcap 50, full", "sinks, causal"}
PAIRS = [(label, d, h, hk, kw, shapes, f"specs/h100_wgmma_d128_{member}_persistent_bf16.yaml",
          HERE / f"t_d128_{member}_persistent_kmpb_bf16.yaml")
         for label, d, member, h, hk, kw, shapes in CALLS if label in TAKEN and d == 128]
PAIRS.append(("Gemma 2 9B: softcap 50, causal", 256, 16, 8, {"softcap": 50.0}, ((4, 2048), (2, 4096), (1, 8192)),
              "specs/h100_wgmma_d256_softcap_persistent_bf16.yaml", HERE / "t_d256_softcap_persistent_km_bf16.yaml"))
rows, gen = [], torch.Generator(device="cuda")
gen.manual_seed(0)
for label, d, h, hk, kw, shapes, committed, trial in PAIRS:
    pair = {"committed": attngen.load(committed), "trial": attngen.load(str(trial))}
    for b, s in shapes:
        call_kw = {"causal": True, **kw}
        if kw.get("sinks"):
            call_kw["sinks"] = torch.randn(h, generator=gen, device="cuda")
        sets = sets_for(b, h, hk, s, d, gen)
        calls = {name: ((lambda q, k_, v, k=k: k(q, k_, v, **call_kw)), sets) for name, k in pair.items()}
        med, each = alternating_sets(calls, 3)
        q, k_, v = sets[0]
        out = {name: fn(q, k_, v).float() for name, (fn, _) in calls.items()}
        row = {"call": label, "shape": f"{b}x{h}/{hk}x{s}x{d}", "us": med, "rounds": each,
               "committed_over_trial": med["committed"] / med["trial"],
               "max_diff": float((out["trial"] - out["committed"]).abs().max())}
        rows.append(row)
        print(json.dumps({x: row[x] for x in ("call", "shape", "us", "committed_over_trial", "max_diff")}), flush=True)
        sets = out = None
        torch.cuda.empty_cache()
Path(sys.argv[1]).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                         "rows": rows}, indent=1) + "\n")
