"""One MLA decode call shape, called six times (for Nsight Compute): B and heads from argv; bf16, a contiguous latent
cache of 4096 keys, one new token.

Usage: ncu --clock-control none --kernel-name regex:attngen_.* --launch-skip 4 --launch-count 1 --section SpeedOfLight
  --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy
  --section LaunchStats --csv --page details python3 docs/decode-h200/mla_ncu/mla_call.py 32 128"""
import sys
import torch
import attngen
b, h = int(sys.argv[1]), int(sys.argv[2])
g = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(b, 1, h, 576, generator=g, device="cuda").bfloat16()
cache = torch.randn(b, 4096, 1, 576, generator=g, device="cuda").bfloat16()
lens = torch.full((b,), 4096, dtype=torch.int32, device="cuda")
for _ in range(6):
    o = attngen.attention_with_kvcache(q, cache, cache[..., :512], cache_seqlens=lens, layout="bshd")
torch.cuda.synchronize()
print("ok", tuple(o.shape))
