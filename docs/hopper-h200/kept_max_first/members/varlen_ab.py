"""The varlen cells the table serves at d64 and d128 beside their trials with a kept max (varlen/), alternating in one
process: one ragged batch of mixed lengths (16 sequences of 1 to 4096 tokens, as docs/varlen-h200's mixed batch), 16
heads and GQA 32/8, causal (bottom-right, each sequence as many queries as keys) and full, fp16 and bf16. GPU µs
(attngen bench's queued timing over input sets rotated past L2), median of 3 rounds, and the largest difference from
the committed cell's output (`attngen verify` checks each cell against fp32).
short: docs/varlen-h200's short batch instead (32 sequences of 37 to 2048 tokens), and attngen.attention_varlen beside
the two cells, whose output must equal the cell the table serves (the mixed batch's longest sequence, 4096, takes the
entries past 2896 keys; the short batch's the entries up to 2896).
Usage (GPU machine, repository root): python3 docs/hopper-h200/kept_max_first/members/varlen_ab.py OUT.json [short]"""
from pathlib import Path
import json
import math
import sys

import torch

import attngen
from attngen.runtime.calls.varlen import cu_seqlens
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "measurements"))   # the helpers the scripts share
from gpu_timing import alternating_sets

LENGTHS = (1, 9, 60, 128, 256, 511, 700, 1024, 1, 2047, 33, 4096, 5, 64, 900, 1500)
SHORT = (37, 64, 100, 128, 150, 200, 256, 300, 333, 400, 450, 512, 600, 700, 768, 800, 900, 1000, 1024, 1100, 1200,
         1300, 1400, 1500, 1600, 1700, 1800, 1900, 2000, 2048, 200, 50)
# (head dim, cells: committed spec then its trial); d64's full masks past 2896 keys took the m192 cell (now in specs/lab/)
CELLS = ((128, ("specs/h100_wgmma_d128_varlen", "varlen/t_d128_varlen_km")),
         (64, ("specs/h100_wgmma_d64_varlen", "varlen/t_d64_varlen_km")),
         (64, ("specs/lab/h100_wgmma_d64_m192_varlen", "varlen/t_d64_m192_varlen_km")))


def path(stem: str, suffix: str) -> str:
    return f"{stem}{suffix}.yaml" if stem.startswith("specs/") else str(HERE / f"{stem}{suffix}.yaml")


def main(report: str, short: bool) -> None:
    rows, gen = [], torch.Generator(device="cuda")
    gen.manual_seed(0)
    lengths = SHORT if short else LENGTHS
    total, longest = sum(lengths), max(lengths)
    cu = cu_seqlens(torch, lengths, "cuda")
    for dtype, suffix in ((torch.bfloat16, "_bf16"), (torch.float16, "")):
        for d, stems in CELLS:
            if short and "m192" in stems[0]:      # the m192 cell serves no call of 2896 keys or fewer
                continue
            kernels = {Path(s).name: attngen.load(path(s, suffix)) for s in stems}
            masks = (False,) if "m192" in stems[0] else (False, True)
            for h, hk in ((16, 16), (32, 8)):
                one = total * (2 * h + 2 * hk) * d * 2
                n = max(2, min(16, math.ceil(3 * torch.cuda.get_device_properties(0).L2_cache_size / one)))
                sets = [tuple(torch.randn(total, heads, d, generator=gen, device="cuda").to(dtype)
                              for heads in (h, hk, hk)) for _ in range(n)]
                for causal in masks:
                    calls = {name: ((lambda q, k, v, kr=kr, causal=causal: kr.varlen(
                        q, k, v, cu, cu, max_seqlen_q=longest, causal=causal)), sets) for name, kr in kernels.items()}
                    if short:
                        calls["attngen.attention_varlen"] = ((lambda q, k, v, causal=causal: attngen.attention_varlen(
                            q, k, v, cu, cu, max_seqlen_q=longest, max_seqlen_k=longest, causal=causal)), sets)
                    med, each = alternating_sets(calls, 3)
                    q, k, v = sets[0]
                    out = {name: fn(q, k, v).float() for name, (fn, _) in calls.items()}
                    first, names = out[next(iter(out))], list(calls)
                    row = {"cells": names, "dtype": str(dtype).split(".")[1], "heads": f"{h}/{hk}", "head_dim": d,
                           "causal": causal, "us": med, "rounds": each,
                           f"{names[0]}_over_{names[1]}": med[names[0]] / med[names[1]],
                           "max_diff": float((out[names[1]] - first).abs().max())}
                    if short:   # the short batch's entries (up to 2896 keys) serve the committed cells
                        row["entry_output_equals_committed_cell"] = bool(torch.equal(out["attngen.attention_varlen"], first))
                    rows.append(row)
                    print(json.dumps({x: row[x] for x in ("dtype", "heads", "head_dim", "causal", "us",
                                                          f"{names[0]}_over_{names[1]}",
                                                          "entry_output_equals_committed_cell") if x in row}), flush=True)
                    out = first = None
                sets = None
                torch.cuda.empty_cache()
    Path(report).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                        "lengths": lengths, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] == ["short"])
