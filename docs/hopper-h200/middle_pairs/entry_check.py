"""attngen.attention at the shapes the table now sends to the middle_pairs members (and the cells around them),
checked against the fp32 reference with the error rule (<= 2x torch's own low-precision attention's error, plus
the floor); random inputs (a NaN anywhere fails), both dtypes, causal. Prints one line per call and exits 1 on any
failure. Usage: python3 docs/hopper-h200/middle_pairs/entry_check.py OUT.json
"""
import json
import sys

import torch

import attngen
from attngen.eval.verify import attention_torch, error_bound, exact_fp32_matmul
from pathlib import Path

from attngen.ops.table import load_table, select, table_path

SHAPES = ["8x16x256x128", "24x16x256x128", "16x16x384x128", "32x16x384x128", "8x16x640x128", "16x16x576x128",
          "4x16x704x128", "16x16x640x192", "8x16x768x192", "16x16x640x256", "8x16x640x256", "8x16x1024x256",
          "9x25x384x128"]


def main(out_path):
    table = load_table(table_path(Path(__file__).resolve().parents[3] / "specs"))   # the table attngen.attention reads
    rows, failed = [], 0
    gen = torch.Generator(device="cuda").manual_seed(7)
    for shape in SHAPES:
        b, h, s, d = map(int, shape.split("x"))
        for dtype in (torch.float16, torch.bfloat16):
            q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dtype, generator=gen) for _ in range(3))
            out = attngen.attention(q, k, v, causal=True)
            torch.cuda.synchronize()
            with exact_fp32_matmul(torch):
                ref, _ = attention_torch(q.float(), k.float(), v.float(), scale=d ** -0.5, mask="causal")
            low, _ = attention_torch(q, k, v, scale=d ** -0.5, mask="causal")
            err = (out.float() - ref).abs().max().item()
            bound = error_bound((low.float() - ref).abs().max().item())
            name = "fp16" if dtype == torch.float16 else "bf16"
            spec = select(table, "forward", "sm_90", name, d, "causal", s, rows=b * h * s).spec
            ok = err == err and err <= bound
            failed += not ok
            rows.append({"shape": shape, "dtype": name, "spec": spec, "max_err": err, "bound": bound, "passed": ok})
            print(f"{shape:14} {name} {spec:44} err {err:.2e} bound {bound:.2e} {'pass' if ok else 'FAIL'}")
    json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, open(out_path, "w"),
              indent=1)
    print(f"{len(rows) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
