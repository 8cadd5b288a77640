"""The variant cells on the persistent walk at head dims 64 and 128, each forced beside the cell the table served
before, alternating in one process, bf16, on the models' own calls:
- d128: Mistral (32/8 heads, causal window 4095), Gemma 3 27B's local layers (32/16, causal window 1023),
  Gemma 2 27B (32/16, softcap 50 causal, and softcap 50 with a causal window 4095), softcap with no mask, and
  sinks (32/8, causal, and with a causal window 4095);
- d64: gpt-oss (64/8 heads, sinks with a causal mask and with a causal window of 127 keys), sinks with a causal
  window of 4095 keys and with no mask, and a plain causal window of 1023 keys (16/16).
At d64 the persistent cells are two: on two consumer warpgroups (128-row blocks; trial_specs/, not kept) and on
three (192-row blocks, the base cell's rows: h100_wgmma_d64_persistent_q2_c3's cells). GPU us (attngen bench's
queued timing, input sets rotated past L2), median of 3 rounds, and the largest difference between a persistent
cell's output and the base cell's (`attngen verify` checks each against fp32).
Usage (GPU machine, repository root): python3 docs/hopper-h200/variants_persistent/forced_trial.py OUT.json"""
from pathlib import Path
import json
import sys

import torch

import attngen
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "measurements"))   # the helpers the scripts share
from gpu_timing import alternating_sets
sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_calls import CALLS, sets_for

D128 = ("specs/h100_wgmma_d128_{}_bf16.yaml", "specs/h100_wgmma_d128_{}_persistent_bf16.yaml")
D64 = ("specs/h100_wgmma_d64_{}_bf16.yaml",
       str(Path(__file__).parent / "trial_specs" / "h100_wgmma_d64_persistent_q2_{}_bf16.yaml"),   # not kept
       "specs/h100_wgmma_d64_persistent_q2_c3_{}_bf16.yaml")
kernels = {}


def kernel(path):
    if path not in kernels:
        kernels[path] = attngen.load(path)
    return kernels[path]


rows, gen = [], torch.Generator(device="cuda")
gen.manual_seed(0)
for label, d, member, h, hk, kw, shapes in CALLS:
    members = member.split("/") if "/" in member else (member,) * 3
    paths = [p.format(m) for p, m in zip(D128 if d == 128 else D64, members)]
    pair = {name: kernel(path) for name, path in zip(("base", "persistent", "persistent_c3"), paths)}
    for b, s in shapes:
        call_kw = {"causal": True, **kw}
        if kw.get("sinks"):
            call_kw["sinks"] = torch.randn(h, generator=gen, device="cuda")
        sets = sets_for(b, h, hk, s, d, gen)
        calls = {name: ((lambda q, k_, v, k=k: k(q, k_, v, **call_kw)), sets) for name, k in pair.items()}
        med, each = alternating_sets(calls, 3)
        q, k_, v = sets[0]
        out = {name: fn(q, k_, v).float() for name, (fn, _) in calls.items()}
        row = {"call": label, "shape": f"{b}x{h}/{hk}x{s}x{d}", "specs": {n: k.plan.spec.name for n, k in pair.items()},
               "us": med, "rounds": each, "max_diff": max(float((o - out["base"]).abs().max()) for o in out.values())}
        rows.append(row)
        print(json.dumps({x: row[x] for x in ("call", "shape", "us", "max_diff")}), flush=True)
        sets = out = None
        torch.cuda.empty_cache()
Path(sys.argv[1]).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                         "rows": rows}, indent=1) + "\n")
