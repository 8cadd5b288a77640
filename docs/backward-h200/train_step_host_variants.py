"""Host time of training steps with variants (#61: "no per-call Python work that can be done once per
shape"): attngen.attention's eager step with a window, softcap, both, and ALiBi slopes, beside its plain
causal step, at two small cells (the host sets the pace). CPU µs per step: o = attention(q, k, v, ...);
torch.autograd.grad(o, (q, k, v), do), 100 steps back to back with no synchronize inside
(docs/measurements/host_time.py's clock), the calls taking turns, median of 5 rounds.

Usage (GPU machine, repository root): python3 docs/backward-h200/train_step_host_variants.py [OUT.json]
Run once per code version (PYTHONPATH picks which attngen) for a before and after."""
import json
import statistics
import sys
from pathlib import Path

import torch

import attngen

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))   # the shared helpers
from host_time import host_and_wall  # noqa: E402

CALLS = {"plain causal": {}, "window (256, 0)": {"window": (256, 0)}, "softcap 30": {"softcap": 30.0},
         "window + softcap": {"window": (256, 0), "softcap": 30.0}, "alibi": {"alibi": True}}


def main():
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cells": {}}
    for shape in ((1, 8, 512, 64), (4, 16, 1024, 128)):
        q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        do = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
        slopes = torch.rand(shape[1], device="cuda") * 0.3

        def step(kw):
            kw = dict(kw)
            if kw.pop("alibi", False):
                kw["alibi_slopes"] = slopes
            return lambda: torch.autograd.grad(attngen.attention(q, k, v, causal=True, **kw), (q, k, v), do)
        fns = {n: step(kw) for n, kw in CALLS.items()}
        got = {n: [] for n in fns}
        for _ in range(5):
            for n, fn in fns.items():
                got[n].append(host_and_wall(fn, n=100, repeats=3)[0])
        label = "x".join(map(str, shape))
        report["cells"][label] = {n: statistics.median(t) for n, t in got.items()}
        print(f"== {label} causal bf16: CPU us per step (median of 5 rounds)")
        for n, t in got.items():
            print(f"  {n:<20} {statistics.median(t):7.1f}   (min {min(t):6.1f})")
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
