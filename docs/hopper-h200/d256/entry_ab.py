"""d256 forward through attngen.attention (the dispatch table's pick) beside SDPA's cuDNN backend, in one tree
(PYTHONPATH selects it): for timing the table's d256 forward entries before and after a change, alternating trees.
Per cell: GPU us (calls queued behind a GPU sleep, inputs rotated past L2), eager us (back to back, host
included), the spec the table picked, and the error against fp32 beside SDPA's own in the same dtype.
With --variants: Gemma's calls instead (bf16; softcap 50 causal, softcap 50 with a causal 4095-key window, causal
windows of 1023 and 4095 keys).
With --d N [--dv M]: another head dim (and V head dim) instead of 256.
Usage (GPU machine, repository root): python3 docs/hopper-h200/d256/entry_ab.py OUT.json [--variants] [--d N [--dv M]]"""
import json
import sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import attngen
from attngen.eval.bench.decode import eager_time_us, median_time_us
from attngen.ops import library

D = int(sys.argv[sys.argv.index("--d") + 1]) if "--d" in sys.argv else 256
DV = int(sys.argv[sys.argv.index("--dv") + 1]) if "--dv" in sys.argv else D
CELLS = ((1, 8, 8, 512), (8, 16, 16, 512), (2, 16, 16, 1024), (16, 16, 16, 1024), (4, 16, 16, 2048),
         (2, 16, 16, 4096), (2, 16, 4, 4096), (1, 16, 16, 8192), (1, 16, 16, 16384))


def cudnn(q, k, v, causal):
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=k.shape[1] != q.shape[1])


def picked():
    """The spec of the newest kernel in the forward cache: right for a call that added one, wrong for a call that
    reused a kernel cached for another shape (GQA rows share their key with the MHA row), and "?" for variant calls
    (cached elsewhere). `attngen dispatch` gives the table's pick."""
    return next(reversed(library._FORWARD.values())).plan.spec.name if library._FORWARD else "?"


VARIANTS = (("", {}),)
DTYPES = (torch.bfloat16, torch.float16)
MASKS = (False, True)
if "--variants" in sys.argv:
    CELLS = ((2, 16, 16, 1024), (4, 16, 16, 2048), (2, 16, 16, 4096), (1, 16, 16, 8192), (1, 16, 16, 16384))
    VARIANTS = ((" softcap 50", {"softcap": 50.0}), (" softcap 50 window 4095", {"softcap": 50.0, "window": (4095, 0)}),
                (" window 1023", {"window": (1023, 0)}), (" window 4095", {"window": (4095, 0)}))
    DTYPES, MASKS = (torch.bfloat16,), (True,)


def reference(q, k, v, causal, kw):
    if not kw:
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    s = (q.float() @ k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
    if "softcap" in kw:
        s = kw["softcap"] * torch.tanh(s / kw["softcap"])
    n = s.shape[-1]
    i, j = torch.arange(n, device=q.device)[:, None], torch.arange(n, device=q.device)[None, :]
    keep = (j <= i) & (j >= i - kw["window"][0]) if "window" in kw else j <= i
    return s.masked_fill(~keep, float("-inf")).softmax(-1) @ v.float()


rows = []
for dt, (tag, kw), causal in ((dt, var, causal) for dt in DTYPES for var in VARIANTS for causal in MASKS):
    for b, h, hkv, s in CELLS:
        rot = max(2, min(8, int(3 * 60e6 // (2 * 3 * b * h * s * D)) + 1))
        qs = [torch.randn(b, h, s, D, device="cuda", dtype=dt) for _ in range(rot)]
        ks = [torch.randn(b, hkv, s, D, device="cuda", dtype=dt) for _ in range(rot)]
        vs = [torch.randn(b, hkv, s, DV, device="cuda", dtype=dt) for _ in range(rot)]
        ours = lambda i: attngen.attention(qs[i], ks[i], vs[i], causal=causal, **kw)
        theirs = lambda i: cudnn(qs[i], ks[i], vs[i], causal)   # no variant: the peer's time, not its result
        out = ours(0)
        r = {"cell": f"{str(dt)[6:]} {b}x{h}/{hkv}x{s}x{D}{'' if DV == D else f'x{DV}'} {'causal' if causal else 'none'}{tag}", "spec": picked()}
        if b * h * s * s <= 2 ** 28:
            g = h // hkv
            kf, vf = ks[0].float().repeat_interleave(g, 1), vs[0].float().repeat_interleave(g, 1)
            ref = reference(qs[0], kf, vf, causal, kw)
            r["err"] = float((out.float() - ref).abs().max())
            if not kw:
                low = cudnn(qs[0], ks[0], vs[0], causal)
                r["err_cudnn"] = float((low.float() - ref).abs().max())
                del low
            del kf, vf, ref
        for _ in range(2):
            for name, fn in (("attngen", ours), ("cudnn", theirs)):
                r.setdefault(f"{name}_us", []).append(round(median_time_us(torch, fn, 20, rot), 2))
                r.setdefault(f"{name}_eager_us", []).append(round(eager_time_us(torch, fn, 20, rot), 2))
        rows.append(r)
        print(json.dumps(r), flush=True)
        del qs, ks, vs, out
        torch.cuda.empty_cache()
json.dump(rows, open(sys.argv[1], "w"), indent=1)
