"""The d128 full-mask backward, 80-row query blocks against 64-row ones, where seqlen_q and seqlen_k differ.

The table picks h100_bwd_d128_wgmma_m80[_bf16] by seqlen_k (from 725 keys), but the 80-row blocks' wasted tail
rows depend on seqlen_q (512 queries: 7 blocks of 80 = 560 rows, 48 of them empty). These cells measure that.

Usage: python3 docs/backward-h200/m80_cross_bench.py OUT.json [ROUNDS]

Timing as docs/backward-h200/m80_bench.py: one backward call (preprocess + main + convert) given attngen's
forward o and LSE, the two cells alternating over ROUNDS rounds (default 5), median of the rounds.
"""
from pathlib import Path
import json, sys

import torch

import attngen
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))   # the helpers the scripts share
from gpu_timing import alternating, gradient_difference

# (batch, query heads, kv heads, seqlen_q, seqlen_k)
CELLS = ((32, 16, 16, 128, 2048), (16, 16, 16, 256, 4096), (16, 16, 16, 512, 2048), (8, 16, 16, 512, 8192),
         (8, 16, 16, 1000, 2048), (4, 16, 16, 1024, 4096), (4, 16, 16, 2048, 512), (2, 16, 16, 4096, 512),
         (8, 16, 16, 2048, 1024), (4, 32, 8, 512, 4096))


def main(out, rounds=5):
    rows = []
    for suffix, dtype in (("_bf16", torch.bfloat16), ("", torch.float16)):
        base = attngen.load(f"specs/h100_bwd_d128_wgmma{suffix}.yaml")
        m80 = attngen.load(f"specs/h100_bwd_d128_wgmma_m80{suffix}.yaml")
        for b, h, hk, sq, sk in CELLS:
            torch.manual_seed(0)
            q, do = (torch.randn(b, h, sq, 128, device="cuda", dtype=dtype) for _ in range(2))
            k, v = (torch.randn(b, hk, sk, 128, device="cuda", dtype=dtype) for _ in range(2))
            o, lse = attngen.attention(q, k, v, return_lse=True)
            row = {"dtype": str(dtype).split(".")[-1], "shape": f"{b}x{h}/{hk}x{sq}x{sk}x128",
                   **gradient_difference(m80(q, k, v, o, lse, do), base(q, k, v, o, lse, do))}
            us, row["rounds"] = alternating({"m64": lambda: base(q, k, v, o, lse, do),
                                             "m80": lambda: m80(q, k, v, o, lse, do)}, rounds)
            row["m64_us"], row["m80_us"] = us["m64"], us["m80"]
            row["speedup"] = row["m64_us"] / row["m80_us"]
            print(json.dumps({k_: (round(v_, 4) if isinstance(v_, float) else v_) for k_, v_ in row.items()
                              if k_ != "rounds"}), flush=True)
            rows.append(row)
    Path(out).write_text(json.dumps({"command": " ".join(["python3", *sys.argv]), "device": torch.cuda.get_device_name(),
                                     "torch": torch.__version__, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 5)
