"""One d256 forward of attngen (the table's pick, through attngen.attention) and one of SDPA's cuDNN backend,
per cell, inside a profiler range, for Nsight Compute to read (L2 and tensor-pipe throughput, stall reasons,
launch statistics such as the cluster size).
Usage (GPU machine, repository root):
  ncu --clock-control none --profile-from-start off -k regex:'attngen|cudnn|sdpa|fmha|flash' \
      --section SpeedOfLight --section LaunchStats --section MemoryWorkloadAnalysis \
      --section ComputeWorkloadAnalysis --section WarpStateStats python3 docs/hopper-h200/d256/ncu_d256.py"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import attngen

CELLS = ((2, 16, 4096, False), (2, 16, 4096, True))
inputs = []
for b, h, s, causal in CELLS:
    q, k, v = (torch.randn(b, h, s, 256, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    inputs.append((q, k, v, causal))
    for _ in range(3):   # load and warm both outside the profiled range
        attngen.attention(q, k, v, causal=causal)
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for q, k, v, causal in inputs:
    attngen.attention(q, k, v, causal=causal)
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        F.scaled_dot_product_attention(q, k, v, is_causal=causal)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
