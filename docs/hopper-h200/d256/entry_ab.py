"""d256 forward through attngen.attention (the dispatch table's pick) beside SDPA's cuDNN backend, in one tree
(PYTHONPATH selects it): for timing the table's d256 forward entries before and after a change, alternating trees.
Per cell: GPU us (calls queued behind a GPU sleep, inputs rotated past L2), eager us (back to back, host
included), the spec the table picked, and the error against fp32 beside SDPA's own in the same dtype.
Usage (GPU machine, repository root): python3 docs/hopper-h200/d256/entry_ab.py OUT.json"""
import json
import sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import attngen
from attngen.eval.bench.decode import eager_time_us, median_time_us
from attngen.ops import library

D = 256
CELLS = ((1, 8, 8, 512), (8, 16, 16, 512), (2, 16, 16, 1024), (16, 16, 16, 1024), (4, 16, 16, 2048),
         (2, 16, 16, 4096), (2, 16, 4, 4096), (1, 16, 16, 8192), (1, 16, 16, 16384))


def cudnn(q, k, v, causal):
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=k.shape[1] != q.shape[1])


def picked():
    """The spec of the forward kernel the last call loaded (the newest entry of the forward cache)."""
    return next(reversed(library._FORWARD.values())).plan.spec.name if library._FORWARD else "?"


rows = []
for dt in (torch.bfloat16, torch.float16):
    for b, h, hkv, s in CELLS:
        for causal in (False, True):
            rot = max(2, min(8, int(3 * 60e6 // (2 * 3 * b * h * s * D)) + 1))
            qs = [torch.randn(b, h, s, D, device="cuda", dtype=dt) for _ in range(rot)]
            ks = [torch.randn(b, hkv, s, D, device="cuda", dtype=dt) for _ in range(rot)]
            vs = [torch.randn_like(k) for k in ks]
            ours = lambda i: attngen.attention(qs[i], ks[i], vs[i], causal=causal)
            theirs = lambda i: cudnn(qs[i], ks[i], vs[i], causal)
            out = ours(0)
            r = {"cell": f"{str(dt)[6:]} {b}x{h}/{hkv}x{s}x{D} {'causal' if causal else 'none'}", "spec": picked()}
            if b * h * s * s <= 2 ** 28:
                g = h // hkv
                kf, vf = ks[0].float().repeat_interleave(g, 1), vs[0].float().repeat_interleave(g, 1)
                ref = F.scaled_dot_product_attention(qs[0].float(), kf, vf, is_causal=causal)
                low = cudnn(qs[0], ks[0], vs[0], causal)
                r["err"] = float((out.float() - ref).abs().max())
                r["err_cudnn"] = float((low.float() - ref).abs().max())
                del kf, vf, ref, low
            for _ in range(2):
                for name, fn in (("attngen", ours), ("cudnn", theirs)):
                    r.setdefault(f"{name}_us", []).append(round(median_time_us(torch, fn, 20, rot), 2))
                    r.setdefault(f"{name}_eager_us", []).append(round(eager_time_us(torch, fn, 20, rot), 2))
            rows.append(r)
            print(json.dumps(r), flush=True)
            del qs, ks, vs, out
            torch.cuda.empty_cache()
json.dump(rows, open(sys.argv[1], "w"), indent=1)
