"""The spread of attngen's d sink error against torch's, as dsink_spread_dense.py, for varlen training
through attngen.attention_varlen: the variant sweep's three sequences (1/77, 129/129, 300/301 queries/keys),
GQA 4/2, bf16, causal bottom-right, sinks alone and with ALiBi, at d64, d128, d160 (padded to d256) and
d256, 10 seeds each; torch's errors summed over the sequences as the sweep sums them.

Usage (GPU machine, repository root): python3 docs/variants-h200/dsink_spread_varlen.py OUT.json"""
import json
import statistics
import sys

import torch
import attngen
from attngen.core.variants import ALIBI, SINK
from attngen.eval.verify.backward import sink_output_error
from attngen.eval.verify.cases import attention_torch, exact_fp32_matmul
from attngen.runtime.calls.varlen import cu_seqlens

DT = torch.bfloat16


def t(x, a, n):
    """Rows a .. a + n of a packed (total, H, D) tensor as (1, H, n, D)."""
    return x.detach()[a:a + n].transpose(0, 1)[None]


LQ, LK = (1, 129, 300), (77, 129, 301)
rows = []
for d in (64, 128, 160, 256):
    for combo in ("sinks", "alibi_sinks"):
        for seed in range(10):
            g = torch.Generator(device="cuda").manual_seed(7000 * d + seed + (500 if combo != "sinks" else 0))
            q = torch.randn(sum(LQ), 4, d, device="cuda", generator=g).to(DT).requires_grad_()
            k, v = (torch.randn(sum(LK), 2, d, device="cuda", generator=g).to(DT).requires_grad_() for _ in range(2))
            cq, ck = cu_seqlens(torch, list(LQ), "cuda"), cu_seqlens(torch, list(LK), "cuda")
            sinks = (torch.randn(4, device="cuda", generator=g) * 2).requires_grad_()
            kw = {"sinks": sinks}
            if combo == "alibi_sinks":
                kw["alibi_slopes"] = torch.rand(4, device="cuda", generator=g) * 0.3
            o = attngen.attention_varlen(q, k, v, cq, ck, max(LQ), max(LK), causal=True, alignment="bottom_right", **kw)
            dout = torch.randn(o.shape, device="cuda", generator=g).to(DT)
            gs = torch.autograd.grad(o, (q, k, v, sinks), dout)
            ref_sum = low_sum = out_sum = 0.0
            aq = ak = 0
            for nq, nk in zip(LQ, LK):
                res = []
                for precise in (True, False):
                    xs = [(t(x, a, n).float() if precise else t(x, a, n)).requires_grad_() for x, a, n in ((q, aq, nq), (k, ak, nk), (v, ak, nk))]
                    s = sinks.detach().float().requires_grad_()
                    mods = ((ALIBI, kw["alibi_slopes"]),) if "alibi_slopes" in kw else ()
                    mods = mods + ((SINK, s),)
                    with exact_fp32_matmul(torch):
                        oo, lse = attention_torch(*xs, scale=d ** -0.5, mask="causal", window=None, alignment="bottom_right", modifiers=mods)
                        gg = torch.autograd.grad(oo, xs + [s], t(dout, aq, nq).to(oo.dtype))
                    res.append((oo, gg, lse))
                (ref, rg, lse_ref), (low, lg, _) = res
                ref_sum, low_sum = ref_sum + rg[3], low_sum + lg[3]
                out_sum = out_sum + sink_output_error(torch, t(dout, aq, nq), low.detach(), ref.detach(), lse_ref.detach(), sinks.detach())
                aq, ak = aq + nq, ak + nk
            rows.append(dict(d=d, combo=combo, seed=seed, ours=(gs[3].float() - ref_sum).abs().max().item(),
                             torch_autograd=(low_sum.float() - ref_sum).abs().max().item(),
                             torch_output=out_sum.abs().max().item(), magnitude=ref_sum.abs().max().item()))
r = [x["ours"] / max(x["torch_autograd"], x["torch_output"]) for x in rows]
print(f"varlen ours / max(torch autograd, output): median {statistics.median(r):.2f} p90 {sorted(r)[int(0.9*len(r))]:.2f} max {max(r):.2f}; "
      f"over the sweep's bound (2x + 1e-3): {sum(x['ours'] > 2*max(x['torch_autograd'], x['torch_output']) + 1e-3 for x in rows)} of {len(rows)}")
r = [x["ours"] / max(x["torch_autograd"], 1e-12) for x in rows]
print(f"varlen ours / torch autograd: median {statistics.median(r):.2f} max {max(r):.2f}")
json.dump(rows, open(sys.argv[1], "w"), indent=1)
