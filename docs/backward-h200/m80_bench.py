"""The d128 backward with query blocks of 80 rows (h100_bwd_d128_wgmma_m80[_bf16]: dQ^T = K^T dS^T, FlashAttention-3's
tile for full masks) against the 64-row cell the table serves (h100_bwd_d128_wgmma[_bf16]), full mask, in one process.

Usage: python3 docs/backward-h200/m80_bench.py OUT.json [ROUNDS]

GPU time of one backward call (preprocess + main + convert) given attngen's forward o and LSE: `attngen bench`'s
timing (30 calls queued behind a GPU sleep, the median), the two cells alternating over ROUNDS rounds (default 3;
the median of the rounds). Cells: MHA from 512 to 8192 keys, one GQA cell (32/8 heads), deterministic mode at
4x16x2048. Gradients of the two are compared (largest difference beside the largest gradient); `attngen verify`
checks each against fp32.
"""
from pathlib import Path
import json, sys

import torch

import attngen
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))   # the helpers the scripts share
from gpu_timing import alternating, gradient_difference

CELLS = (((16, 16, 16, 512), {}), ((8, 16, 16, 1024), {}), ((4, 16, 16, 2048), {}), ((2, 16, 16, 4096), {}),
         ((1, 16, 16, 8192), {}), ((4, 32, 8, 2048), {}), ((4, 16, 16, 2048), {"deterministic": True}))


def compare(cells, rounds):
    """Rows of the two cells alternating on `cells`: ((batch, heads, kv_heads, seqlen_q, seqlen_k), keywords)."""
    rows, cells = [], list(cells)   # walked once per dtype
    for suffix, dtype in (("_bf16", torch.bfloat16), ("", torch.float16)):
        base = attngen.load(f"specs/h100_bwd_d128_wgmma{suffix}.yaml")
        m80 = attngen.load(f"specs/h100_bwd_d128_wgmma_m80{suffix}.yaml")
        for (b, h, hk, sq, sk), kw in cells:
            torch.manual_seed(0)
            q, do = (torch.randn(b, h, sq, 128, device="cuda", dtype=dtype) for _ in range(2))
            k, v = (torch.randn(b, hk, sk, 128, device="cuda", dtype=dtype) for _ in range(2))
            o, lse = attngen.attention(q, k, v, return_lse=True)
            lengths = f"{sq}" if sq == sk else f"{sq}x{sk}"
            row = {"dtype": str(dtype).split(".")[-1], "shape": f"{b}x{h}/{hk}x{lengths}x128", **kw,
                   **gradient_difference(m80(q, k, v, o, lse, do, **kw), base(q, k, v, o, lse, do, **kw))}
            us, row["rounds"] = alternating({"m64": lambda: base(q, k, v, o, lse, do, **kw),
                                             "m80": lambda: m80(q, k, v, o, lse, do, **kw)}, rounds)
            row["m64_us"], row["m80_us"] = us["m64"], us["m80"]
            row["speedup"] = row["m64_us"] / row["m80_us"]
            print(json.dumps({k_: (round(v_, 4) if isinstance(v_, float) else v_) for k_, v_ in row.items()
                              if k_ != "rounds"}), flush=True)
            rows.append(row)
    return rows


def write(out, rows):
    Path(out).write_text(json.dumps({"command": " ".join(["python3", *sys.argv]), "device": torch.cuda.get_device_name(),
                                     "torch": torch.__version__, "rows": rows}, indent=1) + "\n")


def main(out, rounds=3):
    write(out, compare((((b, h, hk, s, s), kw) for (b, h, hk, s), kw in CELLS), rounds))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3)
