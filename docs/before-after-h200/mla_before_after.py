"""MLA decode's two wgmma cells (bf16) before and after a change, in one process: the committed generated
sources of an earlier checkout compiled and launched through today's runtime (gpu_timing.old_kernel: the Params
ABI must be unchanged), beside today's kernels, alternating (docs/decode-h200/mla_wgmma/mla_ab.py's loop).
Each row's "before/after" ratios are before ÷ after GPU time (above 1: after is faster); max_diff is the largest
|O before - O after| of each cell on the row's first cache (0 where the change leaves the arithmetic alone).

Usage: python3 docs/before-after-h200/mla_before_after.py OLD_GENERATED_DIR OUT.json [ROUNDS] [PAGE]
"""
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "decode-h200" / "mla_wgmma"))
sys.path.insert(0, str(ROOT / "docs" / "measurements"))
import mla_ab  # noqa: E402
import torch  # noqa: E402
import attngen  # noqa: E402
from gpu_timing import old_kernel  # noqa: E402

CELLS = ("h200_decode_d576_mla_seesaw_bf16", "h200_decode_d576_mla_wgmma_bf16")
SHAPES = ((32, 128, 4096, 1), (16, 128, 16384, 1), (8, 128, 8192, 1), (1, 128, 32768, 1), (4, 128, 8192, 1),
          (128, 128, 1024, 1), (32, 64, 4096, 1), (8, 128, 4096, 2))


def max_diffs(cells: dict) -> dict:
    """{cell: largest |before - after|} on one random call per shape class (contiguous, B4 128/1 2048 keys)."""
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn((4, 1, 128, 576), generator=g, device="cuda").bfloat16()
    c = torch.randn((4, 2048, 1, 576), generator=g, device="cuda").bfloat16()
    lens = torch.full((4,), 2048, dtype=torch.int32, device="cuda")
    run = lambda k: k(q, c, c[..., :512], cache_seqlens=lens, layout="bshd", scale=1 / math.sqrt(192)).float()
    return {name: float((run(cells[f"{name}:before"]) - run(cells[f"{name}:after"])).abs().max()) for name in CELLS}


def main(old_dir, out_path, rounds="3", page="0"):
    cells = {}
    for name in CELLS:
        new = attngen.load(ROOT / "specs" / f"{name}.yaml")
        cells[f"{name}:before"], cells[f"{name}:after"] = old_kernel(new, Path(old_dir)), new
    diffs = max_diffs(cells)
    print("max |before - after|:", diffs, flush=True)
    seesaw = CELLS[0]
    rows = mla_ab.cell_rows(cells, SHAPES, int(rounds), int(page),
                            ("seesaw before/after", lambda us: us[f"{seesaw}:before"] / us[f"{seesaw}:after"]))
    for row in rows:
        us = row["gpu_us"]
        row["before/after"] = {n: round(us[f"{n}:before"] / us[f"{n}:after"], 4) for n in CELLS}
        row["max_diff"] = diffs
    command = f"python3 docs/before-after-h200/mla_before_after.py {old_dir} OUT.json {rounds}" + (f" {page}" if int(page) else "")
    mla_ab.write(out_path, command, rows)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(*sys.argv[1:])
