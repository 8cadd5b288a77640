"""Run a backward spec once per mask, in both modes: the program compute-sanitizer watches.

Usage: compute-sanitizer --tool racecheck python3 docs/backward-h200/sanitize_backward_case.py specs/x.yaml SEQ [--no-deterministic] [--heads H]
Shape (1, H, SEQ, head_dim) in the spec's dtype (H default 2; a persistent spec loops over key
blocks only when there are more than SMs), given attngen's forward o and LSE; masks none and causal, each
without and (unless --no-deterministic) with deterministic mode, whose turns spin on global counters
and are slow under the sanitizer at long sequences.
"""
import sys

import torch

import attngen

if len(sys.argv) < 3:
    sys.exit(__doc__)
spec, seq = sys.argv[1], int(sys.argv[2])
modes = (False,) if "--no-deterministic" in sys.argv[3:] else (False, True)
heads = int(sys.argv[sys.argv.index("--heads") + 1]) if "--heads" in sys.argv else 2
kernel = attngen.load(spec, synchronize=True)
dtype = kernel.dtype
q, k, v, do = (torch.randn(1, heads, seq, kernel.plan.head_dim, device="cuda", dtype=dtype) for _ in range(4))
for causal in (False, True):
    o, lse = attngen.attention(q, k, v, causal=causal, return_lse=True)
    for deterministic in modes:
        kernel(q, k, v, o, lse, do, causal=causal, deterministic=deterministic)
torch.cuda.synchronize()
print("ran", spec, seq, "modes", modes)
