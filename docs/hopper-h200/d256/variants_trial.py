"""The d256 softcap and window cells against their persistent twins (softcap_persistent, window_persistent), each
spec forced, alternating in one process, bf16: Gemma 2's layers (softcap 50 with a causal mask, and with a causal
4096-key window) and Gemma 3's local layers (a causal 1024-key window), 1k-16k keys. GPU us (attngen bench's
queued timing, input sets rotated past L2), median of 3 rounds, and each output's largest difference from fp32
math beside the base cell's.
Usage (GPU machine, repository root): python3 docs/hopper-h200/d256/variants_trial.py OUT.json"""
from pathlib import Path
import json
import sys

import torch

import attngen
from attngen.eval.bench import Case, input_sets
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "measurements"))   # the helpers the scripts share
from gpu_timing import alternating_sets

SHAPES = ((2, 16, 1024), (4, 16, 2048), (2, 16, 4096), (1, 16, 8192), (1, 16, 16384))
CALLS = (("softcap 50, causal", "softcap", {"softcap": 50.0}),
         ("softcap 50, full", "softcap", {"softcap": 50.0, "causal": False}),
         ("softcap 50, window 4095 causal", "softcap", {"softcap": 50.0, "window": (4095, 0)}),
         ("window 1023 causal", "window", {"window": (1023, 0)}),
         ("window 4095 causal", "window", {"window": (4095, 0)}))
kernels = {f"{m}{p}": attngen.load(f"specs/h100_wgmma_d256_{m}{p}_bf16.yaml")
           for m in ("softcap", "window") for p in ("", "_persistent")}


def reference(q, k, v, kw):
    s = (q.float() @ k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
    if "softcap" in kw:
        s = kw["softcap"] * torch.tanh(s / kw["softcap"])
    n = s.shape[-1]
    i, j = torch.arange(n, device=q.device)[:, None], torch.arange(n, device=q.device)[None, :]
    keep = torch.ones(n, n, dtype=torch.bool, device=q.device)
    if kw.get("causal", True):
        keep &= j <= i
    if "window" in kw:
        keep &= j >= i - kw["window"][0]
    return s.masked_fill(~keep, float("-inf")).softmax(-1) @ v.float()


rows, gen = [], torch.Generator(device="cuda")
gen.manual_seed(0)
for b, h, s in SHAPES:
    for label, member, kw in CALLS:
        kw = {"causal": True, **kw}
        sets = input_sets(torch, Case(b, h, s, 256, "bf16", kw["causal"]), torch.device("cuda"), gen)
        pair = {name: k for name, k in kernels.items() if name.startswith(member)}
        calls = {name: ((lambda q, k_, v, k=k: k(q, k_, v, **kw)), sets) for name, k in pair.items()}
        med, each = alternating_sets(calls, 3)
        row = {"shape": f"{b}x{h}x{s}x256", "call": label, "us": med, "rounds": each}
        if b * h * s * s <= 2 ** 28:
            q, k, v = sets[0]
            ref = reference(q, k, v, kw)
            row["err"] = {name: float((fn(q, k, v).float() - ref).abs().max()) for name, (fn, _) in calls.items()}
            del ref
        rows.append(row)
        print(json.dumps({x: row[x] for x in ("shape", "call", "us")} | {"err": row.get("err")}), flush=True)
        sets = None
        torch.cuda.empty_cache()
json.dump(rows, open(sys.argv[1], "w"), indent=1)
