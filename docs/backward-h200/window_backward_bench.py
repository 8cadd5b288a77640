"""The window backward specs of both classes (h100_bwd_d{64,128}_window: mma.sync, dQ atomics;
h100_bwd_d{64,128}_wgmma_window: wgmma, dQ by red.global.add) in one process, beside the same
class's dense causal backward.

Usage: python3 docs/backward-h200/window_backward_bench.py OUT.json

GPU time of one backward call (preprocess + main + convert) given attngen's windowed forward o
and LSE: `attngen bench`'s timing (attngen.eval.bench.time_calls: CUDA events around each of 30
calls queued behind a GPU sleep, so the host's launches are hidden; the median); fp16 and bf16,
(B, H, S, D) tensors. Windows are
FlashAttention's window_size: (512, 0) causal-side and (512, 512) both sides. TFLOP/s counts 2.5 x
the forward's 4 B H D per visible (query, key) pair. The dense causal backward of each class is timed
beside (fp16). The two classes' gradients are compared with
each other (largest difference, beside the gradients' largest magnitude); `attngen verify` checks
each against fp32.
"""
from pathlib import Path
import json, sys
import torch
import attngen
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))   # the helpers the scripts share
from gpu_timing import compare_classes, queued_med as med


def visible_pairs(s, left, right):
    i = torch.arange(s)
    lo, hi = (i - left).clamp(min=0), (i + right).clamp(max=s - 1)
    return int((hi - lo + 1).sum())


rows = []
for d, dtype in ((64, "fp16"), (128, "fp16"), (64, "bf16"), (128, "bf16")):
    tail = "_bf16" if dtype == "bf16" else ""
    kernels = {"mma": attngen.load(f"specs/h100_bwd_d{d}_window{tail}.yaml"),
               "wgmma": attngen.load(f"specs/h100_bwd_d{d}_wgmma_window{tail}.yaml")}
    dense = {} if tail else {"mma": attngen.load(f"specs/h100_bwd_d{d}.yaml"),
                             "wgmma": attngen.load(f"specs/h100_bwd_d{d}_wgmma.yaml")}
    for b, h, s in ((4, 16, 2048), (1, 16, 8192)):
        for left, right in ((512, 0), (512, 512)):
            torch.manual_seed(0)
            q, k, v, do = (torch.randn(b, h, s, d, device="cuda", dtype=getattr(torch, "float16" if dtype == "fp16" else "bfloat16"))
                           for _ in range(4))
            o, lse = attngen.attention(q, k, v, window=(left, right), return_lse=True)
            row = {"d": d, "dtype": dtype, "shape": f"{b}x{h}x{s}", "window": [left, right]}
            grads = {}
            for name, kern in kernels.items():
                grads[name] = kern(q, k, v, o, lse, do, window=(left, right))
                row[f"{name}_us"] = med(lambda: kern(q, k, v, o, lse, do, window=(left, right)))
                row[f"{name}_tflops"] = 4 * b * h * d * visible_pairs(s, left, right) * 2.5 / row[f"{name}_us"] / 1e6
            oc, lsec = attngen.attention(q, k, v, causal=True, return_lse=True) if dense else (None, None)
            for name, kern in dense.items():
                row[f"{name}_causal_us"] = med(lambda: kern(q, k, v, oc, lsec, do, causal=True))
            compare_classes(row, grads, rows)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
