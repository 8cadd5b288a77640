"""The persistent cells of the d96, d192 and d192/v128 forward families against their base cells, each spec forced,
beside SDPA's cuDNN backend where it takes the shape, alternating in one process, bf16, causal and full masks.
GPU us (attngen bench's queued timing, input sets rotated past L2), median of 3 rounds.
Usage (GPU machine, repository root): python3 docs/headdims-h200/persistent_cells.py OUT.json"""
from pathlib import Path
import json
import sys

import torch

import attngen
from attngen.eval.bench import Case, input_sets
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))   # the helpers the scripts share
from gpu_timing import alternating_sets, cudnn_forward

FAMILIES = (("h100_wgmma_d96", 96, 0), ("h100_wgmma_d192", 192, 0), ("h100_wgmma_d192_v128", 192, 128))
SHAPES = ((8, 16, 512), (2, 16, 1024), (16, 16, 1024), (4, 16, 2048), (2, 16, 4096), (1, 16, 8192), (1, 16, 16384))
rows, gen = [], torch.Generator(device="cuda")
gen.manual_seed(0)
for fam, d, dv in FAMILIES:
    kernels = {name: attngen.load(f"specs/{name}_bf16.yaml") for name in (fam, f"{fam}_persistent")}
    for b, h, s in SHAPES:
        for causal in (False, True):
            sets = input_sets(torch, Case(b, h, s, d, "bf16", causal, dv), torch.device("cuda"), gen)
            calls = {n: ((lambda q, k_, v, k=k: k(q, k_, v, causal=causal)), sets) for n, k in kernels.items()}
            try:
                cudnn_forward(causal)(*sets[0])
                calls["sdpa:cudnn"] = cudnn_forward(causal), sets
            except RuntimeError:
                pass   # cuDNN does not take this shape
            q, k, v = sets[0]
            outs = [kern(q, k, v, causal=causal).float() for kern in kernels.values()]
            med, each = alternating_sets(calls, 3)
            row = {"family": fam, "shape": f"{b}x{h}x{s}x{d}" + (f"x{dv}" if dv else ""), "causal": causal, "us": med,
                   "rounds": each, "max_difference_between_cells": float((outs[0] - outs[1]).abs().max())}
            rows.append(row)
            print(f"{row['shape']:18} {'causal' if causal else 'none':6} "
                  + "  ".join(f"{n.replace('h100_wgmma_', '')} {t:.1f}" for n, t in med.items()), flush=True)
            sets = outs = None
            torch.cuda.empty_cache()
json.dump(rows, open(sys.argv[1], "w"), indent=1)
