"""The d64 Hopper backward specs with query blocks of 128 rows (dQ split by rows: what
h100_bwd_d64_wgmma[_bf16] and h100_bwd_d64_wgmma_window[_bf16] are) against the same specs with
query blocks of 64 (dQ split by columns: what they were), in one process.

Usage: python3 docs/backward-h200/query_block_bench.py OUT.json

The 64-row twin is the committed spec with `tile.block_m: 64`, planned and compiled here (its
kernels compile to the machine code the committed specs had before). GPU time of one backward call
(preprocess + main + convert) given attngen's forward o and LSE: `attngen bench`'s timing
(attngen.eval.bench.time_calls: 30 calls queued behind a GPU sleep, the median), the two specs
alternating over 3 rounds (the median of the rounds). Dense specs: causal and not; window specs:
FlashAttention's window_size (512, 0) and (512, 512). Gradients of the two are compared (largest
difference beside the largest gradient); `attngen verify` checks each against fp32.
"""
from pathlib import Path
import json, sys

import torch
import yaml

import attngen
from attngen.spec import parse_spec
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))   # the helpers the scripts share
from gpu_timing import alternating, gradient_difference

SHAPES = ((16, 16, 512), (8, 16, 1024), (4, 16, 2048), (1, 16, 8192))


def blocks_of_64(path):
    data = yaml.safe_load(open(path))
    data["name"] += "_m64"
    data["tile"] = {**data["tile"], "block_m": 64}
    return attngen.load(parse_spec(yaml.safe_dump(data), file=path))


rows = []
for name, calls in (("h100_bwd_d64_wgmma", ({"causal": False}, {"causal": True})),
                    ("h100_bwd_d64_wgmma_bf16", ({"causal": False}, {"causal": True})),
                    ("h100_bwd_d64_wgmma_window", ({"window": (512, 0)}, {"window": (512, 512)})),
                    ("h100_bwd_d64_wgmma_window_bf16", ({"window": (512, 0)}, {"window": (512, 512)}))):
    path = f"specs/{name}.yaml"
    new, old = attngen.load(path), blocks_of_64(path)
    assert (new.plan.block_m, old.plan.block_m) == (128, 64)
    dtype = torch.bfloat16 if name.endswith("bf16") else torch.float16
    for b, h, s in SHAPES:
        torch.manual_seed(0)
        q, k, v, do = (torch.randn(b, h, s, 64, device="cuda", dtype=dtype) for _ in range(4))
        for kw in calls:
            o, lse = attngen.attention(q, k, v, return_lse=True, **kw)
            g_new, g_old = new(q, k, v, o, lse, do, **kw), old(q, k, v, o, lse, do, **kw)
            row = {"spec": name, "shape": f"{b}x{h}x{s}x64", **{k_: list(v_) if isinstance(v_, tuple) else v_
                                                                for k_, v_ in kw.items()},
                   **gradient_difference(g_new, g_old)}
            us, t = alternating({"m64": lambda: old(q, k, v, o, lse, do, **kw),
                                 "m128": lambda: new(q, k, v, o, lse, do, **kw)})
            row["m64_us"], row["m128_us"] = us["m64"], us["m128"]
            row["speedup"] = row["m64_us"] / row["m128_us"]
            row["rounds"] = t
            print(json.dumps(row), flush=True)
            rows.append(row)
json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, open(sys.argv[1], "w"),
          indent=1)
