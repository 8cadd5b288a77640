"""Varlen calls with a window, sinks, softcap or ALiBi, and d256 varlen, through attngen.attention_varlen (the
table serves them with mma.sync cells on sm_90) beside the Hopper-kind trials of trials/, alternating in one process:
one ragged batch of mixed lengths (16 sequences of 1 to 4096 tokens, as docs/varlen-h200's mixed batch), each
model's heads, causal (bottom-right) with the model's window, bf16 and fp16. GPU µs (attngen bench's queued timing
over input sets rotated past L2), median of 3 rounds, and the largest difference between the two outputs
(`attngen verify` checks every trial against fp32 first, in run_trials.sh).
Usage (GPU machine, repository root): python3 docs/hopper-h200/varlen_variants/varlen_variants_ab.py OUT.json"""
from pathlib import Path
import json
import math
import sys

import torch

import attngen
from attngen.runtime.calls.varlen import cu_seqlens
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "measurements"))   # the helpers the scripts share
from gpu_timing import alternating_sets

LENGTHS = (1, 9, 60, 128, 256, 511, 700, 1024, 1, 2047, 33, 4096, 5, 64, 900, 1500)
SOFTCAP = {"softcap": 50.0}
# (label, head dim, query heads, KV heads, the call's keywords but for sinks and slopes, trial)
CALLS = (("Mistral: causal window 4095", 128, 32, 8, {"window": (4095, 0)}, "t_d128_varlen_window_km"),
         ("Gemma 3 27B local: causal window 1023", 128, 32, 16, {"window": (1023, 0)}, "t_d128_varlen_window_km"),
         ("d128 sinks, causal", 128, 32, 8, {"sinks": True}, "t_d128_varlen_sink_km"),
         ("d128 sinks, causal window 4095", 128, 32, 8, {"sinks": True, "window": (4095, 0)}, "t_d128_varlen_sink_km"),
         ("Gemma 2 27B global: softcap 50, causal", 128, 32, 16, SOFTCAP, "t_d128_varlen_softcap"),
         ("Gemma 2 27B local: softcap 50, causal window 4095", 128, 32, 16, {**SOFTCAP, "window": (4095, 0)},
          "t_d128_varlen_softcap"),
         ("d128 ALiBi, causal", 128, 32, 32, {"alibi": True}, "t_d128_varlen_alibi"),
         ("gpt-oss: sinks, causal", 64, 64, 8, {"sinks": True}, "t_d64_varlen_sink_km"),
         ("gpt-oss: sinks, causal window 127", 64, 64, 8, {"sinks": True, "window": (127, 0)}, "t_d64_varlen_sink_km"),
         ("d64: causal window 1023", 64, 16, 16, {"window": (1023, 0)}, "t_d64_varlen_window_km"),
         ("d64: softcap 50, causal", 64, 16, 16, SOFTCAP, "t_d64_varlen_softcap"),
         ("Gemma 3 12B global: causal", 256, 16, 8, {}, "t_d256_varlen"),
         ("Gemma 3 12B local: causal window 1023", 256, 16, 8, {"window": (1023, 0)}, "t_d256_varlen_window"),
         ("Gemma 2 9B global: softcap 50, causal", 256, 16, 8, SOFTCAP, "t_d256_varlen_softcap"),
         ("Gemma 2 9B local: softcap 50, causal window 4095", 256, 16, 8, {**SOFTCAP, "window": (4095, 0)},
          "t_d256_varlen_softcap"))


def alibi_slopes(heads: int):
    """The usual ALiBi slopes for a power of two heads: 2^(-8 i / heads), i = 1..heads."""
    return torch.tensor([2.0 ** (-8.0 * (i + 1) / heads) for i in range(heads)], device="cuda")


def main(report: str) -> None:
    rows, gen = [], torch.Generator(device="cuda")
    gen.manual_seed(0)
    total, longest = sum(LENGTHS), max(LENGTHS)
    cu = cu_seqlens(torch, LENGTHS, "cuda")
    for dtype, suffix in ((torch.bfloat16, "_bf16"), (torch.float16, "")):
        for label, d, h, hk, kw, trial in CALLS:
            call_kw = {k: v for k, v in kw.items() if k not in ("sinks", "alibi")}
            if kw.get("sinks"):
                call_kw["sinks"] = torch.randn(h, generator=gen, device="cuda")
            if kw.get("alibi"):
                call_kw["alibi_slopes"] = alibi_slopes(h)
            kernel = attngen.load(str(HERE / "trials" / f"{trial}{suffix}.yaml"))
            one = total * (2 * h + 2 * hk) * d * 2
            n = max(2, min(16, math.ceil(3 * torch.cuda.get_device_properties(0).L2_cache_size / one)))
            sets = [tuple(torch.randn(total, heads, d, generator=gen, device="cuda").to(dtype)
                          for heads in (h, hk, hk)) for _ in range(n)]
            calls = {"attngen.attention_varlen": ((lambda q, k, v: attngen.attention_varlen(
                         q, k, v, cu, cu, max_seqlen_q=longest, max_seqlen_k=longest, causal=True, **call_kw)), sets),
                     trial: ((lambda q, k, v, kernel=kernel: kernel.varlen(
                         q, k, v, cu, cu, max_seqlen_q=longest, causal=True, **call_kw)), sets)}
            med, each = alternating_sets(calls, 3)
            q, k, v = sets[0]
            out = {name: fn(q, k, v).float() for name, (fn, _) in calls.items()}
            row = {"call": label, "dtype": str(dtype).split(".")[1], "heads": f"{h}/{hk}", "head_dim": d, "us": med,
                   "rounds": each, f"entry_over_{trial}": med["attngen.attention_varlen"] / med[trial],
                   "max_diff": float((out[trial] - out["attngen.attention_varlen"]).abs().max())}
            rows.append(row)
            print(json.dumps({x: row[x] for x in ("call", "dtype", "us", f"entry_over_{trial}", "max_diff")}),
                  flush=True)
            out = sets = None
            torch.cuda.empty_cache()
    Path(report).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                        "lengths": LENGTHS, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
