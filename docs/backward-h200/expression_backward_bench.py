"""Backward expression specs (variant: in the spec; dS takes the score expression's derivative, a
mask expression is classified per (query block, key block) pair) beside the same class's built-in
modifier or mask, in one process.

Usage: python3 docs/backward-h200/expression_backward_bench.py OUT.json

GPU time of one backward call (preprocess + main + convert) given the forward's o and LSE (the
built-in's, which computes the same attention; prefix-LM's from its forward expression spec):
`attngen bench`'s timing (30 calls queued behind a GPU sleep, the median). fp16, (B, H, S, D)
tensors; softcap 30, ALiBi slopes 2^(-8 (h + 1) / H), a causal window of 256 keys, a prefix of
1024 keys (set beside plain causal: there is no built-in prefix-LM). Gradients of the expression
spec and the built-in are compared (largest difference, beside the largest gradient); `attngen
verify` checks each spec against fp32.
"""
from pathlib import Path
import json, sys

import torch

import attngen
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))   # the helpers the scripts share
from gpu_timing import gradient_difference, queued_med as med

CAP, LEFT, PREFIX = 30.0, 256, 1024


def slopes(h):
    return torch.tensor([2.0 ** (-8.0 * (i + 1) / h) for i in range(h)], device="cuda", dtype=torch.float32)


# (expression spec, built-in spec, the built-in's call keywords, the expression's params, head dim)
PAIRS = (
    ("h100_bwd_d128_expr_softcap", "h100_bwd_d128_softcap", lambda h: {"causal": True, "softcap": CAP},
     lambda h: {"cap": CAP}, 128),
    ("h100_bwd_d128_expr_alibi", "h100_bwd_d128_alibi", lambda h: {"causal": True, "alibi_slopes": slopes(h)},
     lambda h: {"slope": slopes(h)}, 128),
    ("h100_bwd_d128_expr_softcap_alibi", None, lambda h: {"causal": True, "softcap": CAP, "alibi_slopes": slopes(h)},
     lambda h: {"cap": CAP, "slope": slopes(h)}, 128),
    ("h100_bwd_d128_expr_window", "h100_bwd_d128_window", lambda h: {"window": (LEFT, 0)}, lambda h: {"left": LEFT}, 128),
    ("h100_bwd_d128_expr_prefix_lm", "h100_bwd_d128", lambda h: {"causal": True}, lambda h: {"prefix": PREFIX}, 128),
    ("h100_bwd_d128_wgmma_expr_softcap", "h100_bwd_d128_wgmma_softcap", lambda h: {"causal": True, "softcap": CAP},
     lambda h: {"cap": CAP}, 128),
    ("h100_bwd_d128_wgmma_expr_softcap_alibi", "h100_bwd_d128_wgmma_softcap_alibi",
     lambda h: {"causal": True, "softcap": CAP, "alibi_slopes": slopes(h)}, lambda h: {"cap": CAP, "slope": slopes(h)},
     128),
    ("h100_bwd_d64_wgmma_expr_window", "h100_bwd_d64_wgmma_window", lambda h: {"window": (LEFT, 0)},
     lambda h: {"left": LEFT}, 64),
)

rows = []
for expr_name, builtin_name, builtin_kw, params_of, d in PAIRS:
    expr = attngen.load(f"specs/{expr_name}.yaml")
    builtin = attngen.load(f"specs/{builtin_name}.yaml") if builtin_name else None
    prefix_forward = attngen.load("specs/lab/h100_mma_d128_expr_prefix_lm.yaml") if "prefix" in expr_name else None
    for b, h, s in ((4, 16, 2048), (1, 16, 8192)):
        torch.manual_seed(0)
        q, k, v, do = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16) for _ in range(4))
        kw, params = builtin_kw(h), params_of(h)
        expr_kw = {"causal": kw["causal"]} if "causal" in kw and "expr" not in expr.masks else {}
        if prefix_forward is not None:
            o, lse = prefix_forward(q, k, v, params=params, return_lse=True)
        else:
            o, lse = attngen.attention(q, k, v, return_lse=True, **kw)
        row = {"spec": expr_name, "builtin": builtin_name, "shape": f"{b}x{h}x{s}x{d}",
               "expr_us": med(lambda: expr(q, k, v, o, lse, do, params=params, **expr_kw))}
        if builtin is not None:
            ob, lseb = (o, lse) if prefix_forward is None else attngen.attention(q, k, v, return_lse=True, **kw)
            g_expr, g_builtin = expr(q, k, v, o, lse, do, params=params, **expr_kw), builtin(q, k, v, ob, lseb, do, **kw)
            if prefix_forward is None:
                row.update(gradient_difference(g_expr, g_builtin))
            row["builtin_us"] = med(lambda: builtin(q, k, v, ob, lseb, do, **kw))
            row["expr_over_builtin"] = row["expr_us"] / row["builtin_us"]
        print(json.dumps(row), flush=True)
        rows.append(row)
json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, open(sys.argv[1], "w"),
          indent=1)
