"""Softcap and ALiBi together on the Hopper kinds (forward h100_wgmma_d{64,128}_softcap_alibi[_bf16],
backward h100_bwd_d{64,128}_wgmma_softcap_alibi[_bf16]) beside the same kind's spec with softcap
alone and, forward, ALiBi alone: what the second modifier costs.

Usage: python3 docs/variants-h200/softcap_alibi_bench.py OUT.json

GPU time of one call: `attngen bench`'s queued timing (CUDA events around each of 30 calls queued
behind a GPU sleep, median). Backward calls are given the forward o and LSE of their own modifiers
(preprocess + main + convert timed). fp16 and bf16, (B, H, S, D) tensors, causal and not; softcap
30, ALiBi slopes 2^(-8 (h + 1) / H). TFLOP/s counts 4 B H S^2 D (halved causal), x 2.5 backward.
`attngen verify` checks every spec against fp32.
"""
from pathlib import Path
import json, sys
import torch
import attngen
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))   # the helpers the scripts share
from gpu_timing import queued_med as med

SOFTCAP = 30.0


def alibi_slopes(h):
    return torch.tensor([2.0 ** (-8.0 * (i + 1) / h) for i in range(h)], device="cuda", dtype=torch.float32)


rows = []
for d in (64, 128):
    for dtype in ("fp16", "bf16"):
        tail = "_bf16" if dtype == "bf16" else ""
        fwd = {name: attngen.load(f"specs/h100_wgmma_d{d}_{name}{tail}.yaml") for name in ("softcap_alibi", "softcap", "alibi")}
        bwd = {name: attngen.load(f"specs/h100_bwd_d{d}_wgmma_{name}{tail}.yaml") for name in ("softcap_alibi", "softcap")}
        for call, shapes in (("forward", ((4, 16, 2048), (2, 16, 8192))), ("backward", ((4, 16, 2048), (1, 16, 8192)))):
            for b, h, s in shapes:
                torch.manual_seed(0)
                q, k, v, do = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16 if dtype == "fp16" else torch.bfloat16)
                               for _ in range(4))
                both = {"softcap": SOFTCAP, "alibi_slopes": alibi_slopes(h)}
                args = {"softcap_alibi": both, "softcap": {"softcap": SOFTCAP}, "alibi": {"alibi_slopes": both["alibi_slopes"]}}
                for causal in (False, True):
                    row = {"call": call, "d": d, "dtype": dtype, "shape": f"{b}x{h}x{s}", "causal": causal}
                    flops = 4 * b * h * s * s * d / (2 if causal else 1) * (2.5 if call == "backward" else 1)
                    for name, kern in (fwd if call == "forward" else bwd).items():
                        kw = args[name]
                        if call == "forward":
                            row[f"{name}_us"] = med(lambda: kern(q, k, v, causal=causal, **kw))
                        else:
                            o, lse = fwd[name](q, k, v, causal=causal, return_lse=True, **kw)
                            row[f"{name}_us"] = med(lambda: kern(q, k, v, o, lse, do, causal=causal, **kw))
                        row[f"{name}_tflops"] = flops / row[f"{name}_us"] / 1e6
                    row["over_softcap"] = row["softcap_alibi_us"] / row["softcap_us"] - 1
                    print(json.dumps(row), flush=True)
                    rows.append(row)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
