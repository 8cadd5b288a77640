"""Named specs' causal forward, bf16, one call per shape inside a profiler range, for Nsight Compute to read
(DRAM bytes, L2 hit rate, each SM's active cycles) where the table's pick is not the spec wanted.
Usage (GPU machine, repository root): ncu ... python3 docs/hopper-h200/short_first/ncu_specs.py SHAPES SPEC [SPEC ...]
(SHAPES: BxHxSxD,...; each spec runs on the shapes of its head dim)"""
import sys

import torch

import attngen

shapes = [tuple(int(x) for x in c.split("x")) for c in sys.argv[1].split(",")]
kernels = [attngen.load(p) for p in sys.argv[2:]]
torch.manual_seed(0)
calls = []
for b, h, s, d in shapes:
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for kern in kernels:
        if kern.plan.head_dim == d:
            calls.append((kern, q, k, v))
            kern(q, k, v, causal=True)   # load outside the profiled range
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for kern, q, k, v in calls:
    kern(q, k, v, causal=True)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
