"""Run one spec once per mask variant on a small shape: the program compute-sanitizer watches.

Usage: compute-sanitizer --tool racecheck python3 .ci/sanitize_case.py specs/x.yaml
Shape (1, 2, 300, head_dim): several K/V tiles, tails on both sequence lengths.
"""
import sys

import torch

import attngen

for path in sys.argv[1:]:
    kernel = attngen.load(path)
    d = kernel.plan.head_dim
    q, k, v = (torch.randn(1, 2, 300, d, device="cuda").to(kernel.dtype) for _ in range(3))
    for mask in kernel.masks:
        kernel(q, k, v, causal=mask == "causal")
    torch.cuda.synchronize()
    print(f"ran {path}: {', '.join(kernel.masks)}")
