"""The short causal d192 and d256 cells that stay below cuDNN after own_in_turns: one call of attngen (the table's
pick, through attngen.attention) and one of SDPA's cuDNN backend per cell, bf16, inside a profiler range, for
Nsight Compute to read side by side (duration, DRAM bytes, L2 hit rate, tensor and issue activity, stall reasons,
and each SM's active cycles: min, mean and max over the SMs tell how evenly the persistent walk spread the work).
Usage (GPU machine, repository root): OUT=DIR bash docs/hopper-h200/short_first/run_ncu_short.sh"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attngen

CELLS = [tuple(int(x) for x in c.split("x")) for c in
         (sys.argv[1] if len(sys.argv) > 1 else "16x16x512x256,8x16x640x256,16x16x640x256,16x16x512x192,8x16x640x192").split(",")]
torch.manual_seed(0)
inputs = []
for b, h, s, d in CELLS:
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    inputs.append((q, k, v))
    for _ in range(3):   # load and warm both outside the profiled range
        attngen.attention(q, k, v, causal=True)
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for q, k, v in inputs:
    torch.cuda.nvtx.range_push(f"{'x'.join(map(str, q.shape))}")
    attngen.attention(q, k, v, causal=True)
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
