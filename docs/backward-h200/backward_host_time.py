"""Host time of a training call's backward: CPU time to queue torch.autograd.grad through
attngen.attention's registered backward, beside SDPA's, at 1x8x512x64 fp16 (small enough that
the host, not the GPU, sets the pace).

Usage: python3 docs/backward-h200/backward_host_time.py

Per call: host_time.py's CPU clock, 200 calls back to back (no synchronize inside) / 200, median of
5 rounds after 20 warm-up calls; the synchronize after each round is not counted.
"""
import sys
from pathlib import Path
import torch
import torch.nn.functional as F

import attngen
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))   # the helpers the scripts share
from host_time import host_and_wall

q, k, v = (torch.randn(1, 8, 512, 64, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
do = torch.randn(1, 8, 512, 64, device="cuda", dtype=torch.float16)


def per_call(fn):
    """CPU µs per call: host_time.py's clock (200 calls, 20 warm-up), median of 5 rounds."""
    return host_and_wall(fn, repeats=5)[0]


o, s = attngen.attention(q, k, v), F.scaled_dot_product_attention(q, k, v)
ours = per_call(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))
theirs = per_call(lambda: torch.autograd.grad(s, (q, k, v), do, retain_graph=True))
print(f"backward call 1x8x512x64 fp16, CPU us to queue: attngen {ours:.1f}  SDPA {theirs:.1f}")
ours = per_call(lambda: torch.autograd.grad(attngen.attention(q, k, v), (q, k, v), do))
theirs = per_call(lambda: torch.autograd.grad(F.scaled_dot_product_attention(q, k, v), (q, k, v), do))
print(f"forward + backward step 1x8x512x64 fp16, CPU us to queue: attngen {ours:.1f}  SDPA {theirs:.1f}")
