"""Backward bundles built from several directories of generated sources (e.g. `attngen build --out
DIR` of a template variant, or an earlier checkout's generated/), timed side by side with FA2's
backward in one process: the committed bwd_mma specs' plans with each directory's sources (the
Params ABI must be unchanged). Gradients are compared with the directory named `base`.

Usage: python3 docs/backward-h200/backward_variants.py OUT.json DIR... (one of them named base)
GPU time of one backward call given attngen's forward o and LSE (`alternating`: 3 rounds of the
queued median of 30); 4x16x2048 and 1x16x8192 (d128 bf16: 4x16x2048 only), causal and not.
"""
import dataclasses, json, re, sys
from pathlib import Path
import torch
import attngen
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))   # the helpers the scripts share
from gpu_timing import alternating, gradient_difference
from torch.nn.attention import sdpa_kernel, SDPBackend

def kernel_from(new, d, label):
    sources = [(Path(d) / part.file_name).read_text() for part in new.plan.parts]
    smem = int(re.search(r"dynamic: (\d+) B exceed", sources[0]).group(1))
    plan = dataclasses.replace(new.plan, smem_bytes=smem)
    return type(new).from_sources(plan, sources, label=f"{new.plan.spec.name}_{label}")

dirs = sys.argv[2:]
rows = []
for name in ["h100_bwd_d128", "h100_bwd_d64", "h100_bwd_d128_bf16"]:
    new = attngen.load(f"specs/{name}.yaml")
    ks = {Path(d).name: kernel_from(new, d, Path(d).name) for d in dirs}
    d = new.plan.head_dim
    dtype = torch.bfloat16 if "bf16" in name else torch.float16
    for (b, h, s) in ((4, 16, 2048), (1, 16, 8192)):
        for causal in (False, True):
            if name.endswith("bf16") and s == 8192: continue
            torch.manual_seed(0)
            q, k, v, do = (torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(4))
            o, lse = attngen.attention(q, k, v, return_lse=True, causal=causal)
            ref = ks["base"](q, k, v, o, lse, do, causal=causal)
            row = {"spec": name, "shape": f"{b}x{h}x{s}x{d}", "causal": causal}
            for lab, kern in ks.items():
                row[f"{lab}_diff"] = gradient_difference(kern(q, k, v, o, lse, do, causal=causal), ref)["max_diff"]
            qq, kk_, vv = (t.clone().requires_grad_() for t in (q, k, v))
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                out = torch.nn.functional.scaled_dot_product_attention(qq, kk_, vv, is_causal=causal)
            def fa2(): torch.autograd.grad(out, (qq, kk_, vv), do, retain_graph=True)
            calls = {lab: (lambda kern=kern: kern(q, k, v, o, lse, do, causal=causal)) for lab, kern in ks.items()}
            calls["fa2"] = fa2
            us, rounds = alternating(calls)
            row.update({f"{k}_us": round(v, 1) for k, v in us.items()})
            row["best"] = min((l for l in ks), key=lambda l: us[l])
            row["x_base"] = {l: round(us["base"] / us[l], 3) for l in ks}
            row["x_fa2"] = {l: round(us["fa2"] / us[l], 3) for l in ks}
            print(json.dumps(row), flush=True)
            rows.append(row)
Path(sys.argv[1]).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1) + "\n")
