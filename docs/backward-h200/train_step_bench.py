"""A training step's attention, forward and backward, through attngen.attention beside SDPA's flash
(FlashAttention-2) and cuDNN backends, in one process: the #23 target "forward + backward >= 1.0x
SDPA's fastest backend".

Usage: python3 docs/backward-h200/train_step_bench.py OUT.json [SHAPES] [ROUNDS]
  SHAPES: comma-separated BxHxS (default 4x16x2048,1x16x8192), each at d64 and d128.
  ROUNDS: the three implementations alternate over this many rounds of the queued timing, and each
  cell's figure is the median of its rounds (default 5), so that drift in the GPU's clocks reaches
  all alike (one pass each, one after another, moved the ratios by up to 10 % between runs).
  ATTNGEN_HEAD_DIMS=128 (comma-separated) and ATTNGEN_CAUSAL=0 or 1 narrow the cells.

One call: o = attention(q, k, v, causal); torch.autograd.grad(o, (q, k, v), do). attngen takes the
dispatch table's forward and backward specs (the op attngen::attention_train). GPU time: `attngen
bench`'s queued timing (CUDA events around each of 30 calls queued behind a GPU sleep, the host's
work hidden; the median); eager: back-to-back calls, host included (attngen.eval.bench.time_eager).
(B, H, S, D) tensors, fp16 and bf16, causal and not; TFLOP/s counts 3.5 x the forward's 4 B H S^2 D
(half with causal).
"""
from pathlib import Path
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attngen
from attngen.eval.bench import time_eager
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))   # the helpers the scripts share
from gpu_timing import alternating

SHAPES = ((4, 16, 2048), (1, 16, 8192))
BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
HEAD_DIMS = tuple(int(d) for d in os.environ.get("ATTNGEN_HEAD_DIMS", "64,128").split(","))   # e.g. "128"
CAUSAL = {"": (False, True), "0": (False,), "1": (True,)}[os.environ.get("ATTNGEN_CAUSAL", "")]   # "0": full masks only


def step(attention, q, k, v, do, causal):
    def run():
        o = attention(q, k, v, causal)
        return torch.autograd.grad(o, (q, k, v), do)
    return run


def sdpa(backend):
    def attention(q, k, v, causal):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return attention


def main(out_path, shapes=None, rounds="5"):
    shapes = [tuple(map(int, c.split("x"))) for c in shapes.split(",")] if shapes else SHAPES
    rows = []
    impls = {"attngen": lambda q, k, v, causal: attngen.attention(q, k, v, causal=causal),
             **{f"sdpa:{n}": sdpa(b) for n, b in BACKENDS.items()}}
    for dtype in (torch.float16, torch.bfloat16):
        for d in HEAD_DIMS:
            for b, h, s in shapes:
                for causal in CAUSAL:
                    torch.manual_seed(0)
                    q, k, v, do = (torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(4))
                    for t in (q, k, v):
                        t.requires_grad_(True)
                    flops = 3.5 * 4 * b * h * s * s * d / (2 if causal else 1)
                    row = {"shape": f"{b}x{h}x{s}x{d}", "dtype": str(dtype).replace("torch.", ""), "causal": causal}
                    fns = {name: step(attention, q, k, v, do, causal) for name, attention in impls.items()}
                    med, each = alternating(fns, int(rounds))
                    for name, fn in fns.items():
                        row[name] = {"gpu_us": med[name], "tflops": flops / med[name] / 1e6, "rounds": each[name],
                                     "eager_us": time_eager(torch, lambda: fn(), [()], reps=20)}
                    fastest = min(row[n]["gpu_us"] for n in impls if n != "attngen")
                    row["x_fastest_sdpa"] = fastest / row["attngen"]["gpu_us"]
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "command": "python3 docs/backward-h200/train_step_bench.py OUT.json " + " ".join(sys.argv[2:]),
              "rows": rows}
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3, 4):
        sys.exit(__doc__)
    main(*sys.argv[1:])
