"""The Hopper backward specs against SDPA's cuDNN backward, alternating in one process: the #23
target "the Hopper class >= 1.0x cuDNN's backward at seqlen >= 2048" measured with the GPU's drift
shared by both sides.

Usage: python3 docs/backward-h200/backward_vs_cudnn.py OUT.json [ROUNDS] [FAMILY] [BACKEND] [DIMS]
  ROUNDS: default 5. FAMILY: the specs, a pattern of {d} and {suffix} (default
  h100_bwd_d{d}_wgmma{suffix}; h100_bwd_d{d}_k32{suffix} for the mma.sync class's target against
  FA2); several, comma-separated, alternate with each other and the backend in the same rounds.
  BACKEND: the SDPA backend alternated with them, cudnn (default) or flash. DIMS: head dims,
  comma-separated (default 64,128).

Cells: 4x16x2048 and 1x16x8192, d64 and d128, fp16 (h100_bwd_d{64,128}_wgmma) and bf16 (their
_bf16 twins), causal and not. Each round times attngen's backward call (preprocess + main + convert,
given attngen's forward o and LSE) and cuDNN's (torch.autograd.grad of SDPA's output under the
cuDNN backend) with `attngen bench`'s queued timing (30 calls behind a GPU sleep, the median); a
cell's figure is the median of its rounds. Standard normal q, k, v and dout, one input set per cell
(the L2 may hold part of it, for both sides alike). Run from the repository root (it loads specs/).
"""
from pathlib import Path
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attngen
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))   # the helpers the scripts share
from gpu_timing import alternating, write_report

SHAPES = ((4, 16, 2048), (1, 16, 8192))


BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}


def main(out_path, rounds="5", family="h100_bwd_d{d}_wgmma{suffix}", backend="cudnn", dims="64,128"):
    rows = []
    for d in map(int, dims.split(",")):
        for dtype, suffix in ((torch.float16, ""), (torch.bfloat16, "_bf16")):
            kernels = [attngen.load("specs/" + f.format(d=d, suffix=suffix) + ".yaml") for f in family.split(",")]
            for b, h, s in SHAPES:
                for causal in (False, True):
                    torch.manual_seed(0)
                    q, k, v, do = (torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(4))
                    o, lse = attngen.attention(q, k, v, causal=causal, return_lse=True)
                    grads = tuple(torch.empty_like(t) for t in (q, k, v))
                    leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
                    with torch.enable_grad(), sdpa_kernel([BACKENDS[backend]]):
                        out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
                    calls = {kernel.plan.spec.name: (lambda kernel=kernel: kernel(q, k, v, o, lse, do, causal=causal,
                                                                                  dq=grads[0], dk=grads[1], dv=grads[2]))
                             for kernel in kernels}
                    calls[backend] = lambda: torch.autograd.grad(out, leaves, do, retain_graph=True)
                    med, each = alternating(calls, int(rounds))
                    for kernel in kernels:
                        name = kernel.plan.spec.name
                        row = {"spec": name, "shape": f"{b}x{h}x{s}x{d}", "causal": causal,
                               "attngen_us": med[name], f"{backend}_us": med[backend],
                               f"x_{backend}": med[backend] / med[name],
                               "rounds": {"attngen": each[name], backend: each[backend]}}
                        print(f"{name:34} {row['shape']:14} {'causal' if causal else 'none':6} "
                              f"{med[name]:8.1f} {med[backend]:8.1f}  x{row[f'x_{backend}']:.3f}", flush=True)
                        rows.append(row)
                    out = leaves = None
    write_report(out_path, rows, f"python3 docs/backward-h200/backward_vs_cudnn.py OUT.json {rounds} {family} {backend} {dims}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(*sys.argv[1:])
