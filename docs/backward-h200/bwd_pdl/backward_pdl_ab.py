"""The Hopper backward's three kernels (preprocess, main, convert) launched as programmatic dependents, each of
the kernel ahead of it, against the usual launches, beside SDPA's cuDNN backward, alternating in one process:
each cell's spec loaded twice, "pdl" as built and "plain" with every function launched the usual way
(await_predecessor is then a no-op); queued timing (docs/measurements/gpu_timing.alternating), the median of the
rounds. Given attngen's forward o and LSE; cuDNN's side is torch.autograd.grad of SDPA's output. The two launches
give the same gradients bit for bit with deterministic=True (checked per cell; the timed calls are the default,
dQ by atomics).

Usage: python3 docs/backward-h200/bwd_pdl/backward_pdl_ab.py OUT.json [ROUNDS]   (default 3 rounds)"""
from pathlib import Path
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attngen
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "measurements"))
from gpu_timing import alternating, write_report  # noqa: E402

SPECS = Path(attngen.__file__).resolve().parents[1] / "specs"
SHAPES = ((32, 16, 512), (16, 16, 1024), (4, 16, 2048), (1, 16, 8192))


def main(out_path, rounds="3"):
    rows = []
    for d in (64, 128):
        spec = SPECS / f"h100_bwd_d{d}_wgmma_bf16.yaml"
        pdl, plain = attngen.load(spec), attngen.load(spec)
        for name, fn in list(plain.functions.items()):
            plain.functions[name] = fn._replace(programmatic=False)
        for b, h, s in SHAPES:
            for causal in (False, True):
                torch.manual_seed(0)
                q, k, v, do = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
                o, lse = attngen.attention(q, k, v, causal=causal, return_lse=True)
                same = all(torch.equal(x, y) for x, y in zip(
                    pdl(q, k, v, o, lse, do, causal=causal, deterministic=True),
                    plain(q, k, v, o, lse, do, causal=causal, deterministic=True)))
                leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
                with torch.enable_grad(), sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
                calls = {"pdl": lambda: pdl(q, k, v, o, lse, do, causal=causal),
                         "plain": lambda: plain(q, k, v, o, lse, do, causal=causal),
                         "cudnn": lambda: torch.autograd.grad(out, leaves, do, retain_graph=True)}
                med, each = alternating(calls, int(rounds))
                row = {"spec": spec.stem, "shape": f"{b}x{h}x{s}x{d}", "causal": causal, "same_bits": same,
                       "us": med, "rounds": each, "x_cudnn": {w: med["cudnn"] / med[w] for w in ("pdl", "plain")}}
                print(f"{row['shape']:14} {'causal' if causal else 'none':6} pdl {med['pdl']:8.2f} plain "
                      f"{med['plain']:8.2f} cudnn {med['cudnn']:8.2f}  x{row['x_cudnn']['pdl']:.3f} "
                      f"(plain x{row['x_cudnn']['plain']:.3f}) same={same}", flush=True)
                rows.append(row)
    write_report(out_path, rows, f"python3 docs/backward-h200/bwd_pdl/backward_pdl_ab.py OUT.json {rounds}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(*sys.argv[1:])
