"""How far attngen's learned-sinks gradient (d sink) is from the fp32 reference, against torch's own bf16
error, over many seeded calls: training steps through attngen.attention (2x4x197 queries, 2x2x311 keys,
GQA, bf16) at d64, d128 and d256, sinks alone and with softcap, causal (bottom-right) and not, 12 seeds
each. Prints the spread of ours / torch's error (its autograd's, its output's route, and the larger) and
how many calls cross the variant sweep's bound (twice the larger + 1e-3); writes every call to OUT.json.

Usage (GPU machine, repository root): python3 docs/variants-h200/dsink_spread_dense.py OUT.json"""
import json
import statistics
import sys

import torch
import attngen
from attngen.core.variants import SINK, SOFTCAP
from attngen.eval.verify.backward import sink_output_error
from attngen.eval.verify.cases import attention_torch, exact_fp32_matmul

DT = torch.bfloat16
rows = []
for d in (64, 128, 256):
    for combo in ("sinks", "softcap_sinks"):
        for causal in (True, False):
            for seed in range(12):
                g = torch.Generator(device="cuda").manual_seed(1000 * d + seed)
                q = torch.randn(2, 4, 197, d, device="cuda", generator=g).to(DT).requires_grad_()
                k, v = (torch.randn(2, 2, 311, d, device="cuda", generator=g).to(DT).requires_grad_() for _ in range(2))
                sinks = (torch.randn(4, device="cuda", generator=g) * 2).requires_grad_()
                kw = {"sinks": sinks}
                if combo == "softcap_sinks":
                    kw["softcap"] = 30.0
                o = attngen.attention(q, k, v, causal=causal, alignment="bottom_right" if causal else None, **kw)
                dout = torch.randn(o.shape, device="cuda", generator=g).to(DT)
                gs = torch.autograd.grad(o, (q, k, v, sinks), dout)
                res = []
                for precise in (True, False):
                    xs = [(x.detach().float() if precise else x.detach()).requires_grad_() for x in (q, k, v)]
                    s = sinks.detach().float().requires_grad_()
                    mods = ((SOFTCAP, 30.0),) if "softcap" in kw else ()
                    mods = mods + ((SINK, s),)
                    with exact_fp32_matmul(torch):
                        oo, lse = attention_torch(*xs, scale=d ** -0.5, mask="causal" if causal else "none", window=None,
                                                  alignment="bottom_right" if causal else None, modifiers=mods)
                        gg = torch.autograd.grad(oo, xs + [s], dout.to(oo.dtype))
                    res.append((oo, gg, lse))
                (ref, rg, lse_ref), (low, lg, _) = res
                ours = (gs[3].float() - rg[3]).abs().max().item()
                t_auto = (lg[3].float() - rg[3]).abs().max().item()
                t_out = sink_output_error(torch, dout, low.detach(), ref.detach(), lse_ref.detach(), sinks.detach()).abs().max().item()
                rounded = sink_output_error(torch, dout, ref.detach().to(DT), ref.detach(), lse_ref.detach(), sinks.detach()).abs().max().item()
                mag = rg[3].abs().max().item()
                rows.append(dict(d=d, combo=combo, causal=causal, seed=seed, ours=ours, torch_autograd=t_auto,
                                 torch_output=t_out, rounded_ref=rounded, magnitude=mag))
for key in ("torch_autograd", "torch_output", "rounded_ref"):
    r = [x["ours"] / max(x[key], 1e-12) for x in rows]
    print(f"ours / {key}: median {statistics.median(r):.2f} p90 {sorted(r)[int(0.9*len(r))]:.2f} max {max(r):.2f}")
r = [x["ours"] / max(x["torch_autograd"], x["torch_output"]) for x in rows]
print(f"ours / max(torch autograd, output): median {statistics.median(r):.2f} p90 {sorted(r)[int(0.9*len(r))]:.2f} max {max(r):.2f}; over 2.0 (+1e-3 floor): {sum(x['ours'] > 2*max(x['torch_autograd'], x['torch_output']) + 1e-3 for x in rows)} of {len(rows)}")
r = [x["torch_autograd"] / max(x["torch_output"], 1e-12) for x in rows]
print(f"torch autograd / torch output route: median {statistics.median(r):.2f} max {max(r):.2f}")
print("median rel err ours", statistics.median(x["ours"] / x["magnitude"] for x in rows))
json.dump(rows, open(sys.argv[1], "w"), indent=1)
