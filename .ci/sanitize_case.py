"""Run specs once per mask variant on a small shape: the program compute-sanitizer watches.

Usage: [SEQ=300] compute-sanitizer --tool racecheck python3 .ci/sanitize_case.py [--mask none|causal] specs/x.yaml ...
Shape (1, HEADS, SEQ, head_dim), SEQ 300 and HEADS 2 by default: several K/V tiles, tails on both
sequence lengths (more heads than SMs / query blocks make a persistent block take several).
Causal runs in both alignments; bottom-right also with seqlen_q < seqlen_k and seqlen_q > seqlen_k
(by 50, and by 200: blocks whose rows see no key at all).
"""
import os
import sys

import torch

import attngen

args = sys.argv[1:]
masks = None
if args[:1] == ["--mask"]:
    masks, args = (args[1],), args[2:]
seq = int(os.environ.get("SEQ", "300"))
heads = int(os.environ.get("HEADS", "2"))
for path in args:
    kernel = attngen.load(path)
    d = kernel.plan.head_dim
    k, v = (torch.randn(1, heads, seq, d, device="cuda").to(kernel.dtype) for _ in range(2))
    ran = []
    for mask in masks or kernel.masks:
        for alignment in ((None,) if mask == "none" else ("top_left", "bottom_right")):
            # bottom-right with seqlen_q > seqlen_k + block_m: whole blocks see no key
            for sq in ((seq,) if alignment != "bottom_right" else (seq, seq // 2 + 1, seq + 50, seq + 200)):
                q = torch.randn(1, heads, sq, d, device="cuda").to(kernel.dtype)
                kernel(q, k, v, causal=mask == "causal", alignment=alignment)
                ran.append(f"{mask}{':' + alignment if alignment else ''} Sq{sq}")
    torch.cuda.synchronize()
    print(f"ran {path}: {', '.join(ran)}")
