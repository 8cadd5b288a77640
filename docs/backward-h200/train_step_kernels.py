"""Where a training step's attention time goes, kernel by kernel: attngen.attention's forward and
backward beside SDPA's cuDNN backend, under torch.profiler (CUDA activity), for the cells named.

Usage: python3 docs/backward-h200/train_step_kernels.py OUT.json [CELLS]
  CELLS: comma-separated BxHxSxD[:causal][:bf16] (default 1x16x8192x128,4x16x2048x128,2x16x4096x128:bf16)

One step: o = attention(q, k, v, causal); torch.autograd.grad(o, (q, k, v), do). 3 warm-up steps, then
10 profiled ones; per step: each kernel's device time, their sum, the span from the first kernel's
start to the last one's end, and the CUDA API calls that wait or copy (synchronize, memcpy). Beside
them the step's queued GPU time (`attngen bench`'s timing: each call between its own events, behind
a GPU sleep) and its back-to-back time (events around 20 steps queued one after another).
"""
from pathlib import Path
import json
import sys
from collections import defaultdict

import torch
from torch.nn.attention import SDPBackend
from torch.profiler import ProfilerActivity, profile

import attngen
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))   # the helpers the scripts share
from gpu_timing import queued_med
from train_step_bench import sdpa, step   # beside this script

STEPS = 10
IMPLS = {"attngen": lambda q, k, v, causal: attngen.attention(q, k, v, causal=causal),
         "cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)}


def kernels(fn):
    """Per step: each kernel's device time, the CUDA API calls that wait for the GPU or copy
    (synchronize, memcpy), and the span from the first kernel's start to the last one's end."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            fn()
        torch.cuda.synchronize()
    per, waits = defaultdict(float), defaultdict(int)
    starts, ends = [], []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name[:90]] += e.device_time / STEPS
            starts.append(e.time_range.start)
            ends.append(e.time_range.end)
        elif any(w in e.name for w in ("ynchronize", "emcpy", "EventSynchronize", "StreamWait")):
            waits[e.name] += 1
    return (dict(sorted(per.items(), key=lambda kv: -kv[1])), {k: v / STEPS for k, v in waits.items()},
            (max(ends) - min(starts)) / STEPS if starts else 0.0)


def back_to_back(fn, steps=20):
    """GPU time per step of `steps` steps queued back to back (events around all of them)."""
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(steps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / steps


def main(out_path, cells="1x16x8192x128,4x16x2048x128,2x16x4096x128:bf16"):
    rows = []
    for cell in cells.split(","):
        parts = cell.split(":")
        b, h, s, d = map(int, parts[0].split("x"))
        causal, dtype = "causal" in parts, torch.bfloat16 if "bf16" in parts else torch.float16
        torch.manual_seed(0)
        q, k, v, do = (torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(4))
        for t in (q, k, v):
            t.requires_grad_(True)
        row = {"cell": cell}
        for name, attention in IMPLS.items():
            fn = step(attention, q, k, v, do, causal)
            per, waits, span = kernels(fn)
            row[name] = {"step_us": queued_med(fn), "back_to_back_us": back_to_back(fn), "kernels_us": per,
                         "kernel_sum_us": sum(per.values()), "span_us": span, "waits_per_step": waits}
            print(cell, name, {k: round(v, 1) for k, v in row[name].items() if k.endswith("_us") and k != "kernels_us"},
                  "waits/step", waits, flush=True)
            for kname, us in per.items():
                print(f"    {us:9.1f}  {kname}", flush=True)
        rows.append(row)
    with open(out_path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "command": "python3 docs/backward-h200/train_step_kernels.py OUT.json " + cells, "rows": rows}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    main(*sys.argv[1:])
