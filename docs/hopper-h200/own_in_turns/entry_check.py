"""attngen.attention at shapes the table now sends to the own_in_turns members (and the buckets around them), both
masks, both dtypes, random inputs, against the fp32 reference with the error rule (<= 2x torch's own low-precision
attention's error, plus the floor); a NaN anywhere fails. Prints one line per call (with the spec the table picked)
and exits 1 on any failure. Usage: python3 docs/hopper-h200/own_in_turns/entry_check.py OUT.json [SHAPES]
(SHAPES: BxHxSxD[xDv]:mask[+mask],... e.g. 16x16x640x192x128:causal+none; default: the list below)
"""
import json
import sys
from pathlib import Path

import torch

import attngen
from attngen.eval.verify import attention_torch, error_bound, exact_fp32_matmul
from attngen.ops.table import load_table, select, table_path

# (shape, masks): d192 causal from 256 keys to 8192, full masks to 2048; d256 causal 384-1280 and full masks at
# 384-512 keys on large grids (and a small grid that keeps the persistent cell); odd head counts and GQA-free calls.
SHAPES = [("1x8x256x192", "causal"), ("3x25x384x192", "causal none"), ("16x16x512x192", "causal none"),
          ("8x16x640x192", "causal"), ("5x16x1000x192", "causal none"), ("4x16x2048x192", "causal none"),
          ("1x16x8192x192", "causal"), ("16x16x384x256", "causal none"), ("13x16x512x256", "causal none"),
          ("16x16x640x256", "causal"), ("7x16x1280x256", "causal"), ("1x8x512x256", "causal none")]


def parse_shapes(text):
    """BxHxSxD[xDv]:mask[+mask],... (the command line's form) as main's (shape, masks) pairs."""
    return [(item.split(":")[0], item.split(":")[1].replace("+", " ")) for item in text.split(",")]


def main(out_path, shapes=SHAPES, seed=11):
    """Each (shape, masks) of `shapes` through attngen.attention in fp16 and bf16, inputs drawn from `seed`; the
    report to out_path; 1 on a failure."""
    table = load_table(table_path(Path(__file__).resolve().parents[3] / "specs"))   # the table attngen.attention reads
    rows, failed = [], 0
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for shape, masks in shapes:
        b, h, s, d, *dv = map(int, shape.split("x"))   # BxHxSxD, or BxHxSxDxDv: V's head dim apart
        dv = dv[0] if dv else d
        for dtype in (torch.float16, torch.bfloat16):
            q, k, v = (torch.randn(b, h, s, n, device="cuda", dtype=dtype, generator=gen) for n in (d, d, dv))
            for mask in masks.split():
                causal = mask == "causal"
                out = attngen.attention(q, k, v, causal=causal)
                torch.cuda.synchronize()
                with exact_fp32_matmul(torch):
                    ref, _ = attention_torch(q.float(), k.float(), v.float(), scale=d ** -0.5, mask=mask)
                low, _ = attention_torch(q, k, v, scale=d ** -0.5, mask=mask)
                err = (out.float() - ref).abs().max().item()
                bound = error_bound((low.float() - ref).abs().max().item())
                name = "fp16" if dtype == torch.float16 else "bf16"
                spec = select(table, "forward", "sm_90", name, d, mask, s, rows=b * h * s,
                              head_dim_v=dv if dv != d else 0).spec
                ok = err == err and err <= bound
                failed += not ok
                rows.append({"shape": shape, "dtype": name, "mask": mask, "spec": spec, "max_err": err, "bound": bound,
                             "passed": ok})
                print(f"{shape:14} {name} {mask:6} {spec:44} err {err:.2e} bound {bound:.2e} {'pass' if ok else 'FAIL'}")
    json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, open(out_path, "w"),
              indent=1)
    print(f"{len(rows) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], parse_shapes(sys.argv[2])) if len(sys.argv) == 3 else main(sys.argv[1]))
