"""The backward specs (h100_bwd_d64, h100_bwd_d128) beside SDPA's flash (FA2) and cuDNN backward in one process.

Usage: python3 docs/backward-h200/backward_bench.py OUT.json

GPU time of one backward call (attngen: preprocess + main + convert; SDPA: torch.autograd.grad of
its forward's output), CUDA events around each call, median of 15 after 3 warm-up calls; fp16,
(B, H, S, D) tensors, causal and not. TFLOP/s counts 2.5 x the forward's 4 B H S^2 D (half with causal).
"""
from pathlib import Path
import json, sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import attngen
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))   # the helpers the scripts share
from gpu_timing import med


rows = []
specs = {64: "specs/lab/h100_bwd_d64.yaml", 128: "specs/h100_bwd_d128.yaml"}
fwds = {64: "specs/h100_mma_d64.yaml", 128: "specs/h100_mma_d128.yaml"}
for d in (64, 128):
    bwd, fwd = attngen.load(specs[d]), attngen.load(fwds[d])
    for b, h, s in ((4, 16, 2048), (1, 16, 8192)):
        for causal in (False, True):
            q, k, v, do = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16) for _ in range(4))
            o, lse = fwd(q, k, v, causal=causal, return_lse=True)
            ours = med(lambda: bwd(q, k, v, o, lse, do, causal=causal))
            row = {"d": d, "shape": f"{b}x{h}x{s}", "causal": causal, "attngen_us": ours}
            flops = 4 * b * h * s * s * d * 2.5 / (2 if causal else 1)
            for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                try:
                    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
                    with sdpa_kernel([be]):
                        out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
                    row[f"{name}_us"] = med(lambda: torch.autograd.grad(out, (qq, kk, vv), do, retain_graph=True))
                except Exception as e:
                    row[f"{name}_us"] = None; row[f"{name}_error"] = str(e)[:100]
            row["attngen_tflops"] = flops / ours / 1e6
            print(json.dumps(row), flush=True)
            rows.append(row)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
