"""The score-modifier backward specs of both classes (h100_bwd_d{64,128}_{softcap,alibi}: mma.sync,
dQ atomics; h100_bwd_d{64,128}_wgmma_{softcap,alibi}: wgmma, dQ by red.global.add) in one process,
beside the same class's backward without modifiers (h100_bwd_d{64,128}, h100_bwd_d{64,128}_wgmma):
what softcap's tanh and chain-rule factor, and ALiBi's bias, cost each class.

Usage: python3 docs/backward-h200/score_backward_bench.py OUT.json

GPU time of one backward call (preprocess + main + convert) given attngen's forward o and LSE with
the same modifier: `attngen bench`'s timing (attngen.eval.bench.time_calls: CUDA events around each
of 30 calls queued behind a GPU sleep, so the host's launches are hidden; the median). fp16 and bf16,
(B, H, S, D) tensors, causal and not; softcap 30 (Gemma 2's attention cap is 50; 30 bends more
scores), ALiBi slopes 2^(-8 (h + 1) / H) per head. TFLOP/s counts 2.5 x the forward's 4 B H S^2 D
(halved causal). The two classes' gradients are compared with each other (largest difference,
beside the gradients' largest magnitude); `attngen verify` checks each against fp32.
"""
from pathlib import Path
import json, sys
import torch
import attngen
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))   # the helpers the scripts share
from gpu_timing import compare_classes, queued_med as med

SOFTCAP = 30.0


def alibi_slopes(h):
    return torch.tensor([2.0 ** (-8.0 * (i + 1) / h) for i in range(h)], device="cuda", dtype=torch.float32)


rows = []
for d, dtype in ((64, "fp16"), (128, "fp16"), (64, "bf16"), (128, "bf16")):
    tail = "_bf16" if dtype == "bf16" else ""
    plain = {"mma": attngen.load(f"specs/h100_bwd_d{d}{tail}.yaml"),
             "wgmma": attngen.load(f"specs/h100_bwd_d{d}_wgmma{tail}.yaml")}
    for b, h, s in ((4, 16, 2048), (1, 16, 8192)):
        torch.manual_seed(0)
        q, k, v, do = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16 if dtype == "fp16" else torch.bfloat16)
                       for _ in range(4))
        for causal in (False, True):
            o, lse = attngen.attention(q, k, v, causal=causal, return_lse=True)
            plain_us = {name: med(lambda: kern(q, k, v, o, lse, do, causal=causal)) for name, kern in plain.items()}
            for score, kw in (("softcap", {"softcap": SOFTCAP}), ("alibi", {"alibi_slopes": alibi_slopes(h)})):
                kernels = {"mma": attngen.load(f"specs/h100_bwd_d{d}_{score}{tail}.yaml"),
                           "wgmma": attngen.load(f"specs/h100_bwd_d{d}_wgmma_{score}{tail}.yaml")}
                om, lsem = attngen.attention(q, k, v, causal=causal, return_lse=True, **kw)
                row = {"d": d, "dtype": dtype, "shape": f"{b}x{h}x{s}", "causal": causal, "score": score}
                grads = {}
                for name, kern in kernels.items():
                    grads[name] = kern(q, k, v, om, lsem, do, causal=causal, **kw)
                    row[f"{name}_us"] = med(lambda: kern(q, k, v, om, lsem, do, causal=causal, **kw))
                    row[f"{name}_tflops"] = 4 * b * h * s * s * d * 2.5 / (2 if causal else 1) / row[f"{name}_us"] / 1e6
                    row[f"{name}_plain_us"] = plain_us[name]
                    row[f"{name}_cost"] = row[f"{name}_us"] / plain_us[name] - 1
                compare_classes(row, grads, rows)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
