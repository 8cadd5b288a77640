"""The GQA/MQA backward before and after a change to the group-split path, in one process: the committed
generated sources of an earlier checkout (compiled and launched through today's runtime, as
backward_before_after.py does) with the split count that checkout's rule picked, beside today's kernels
with today's rule. Per cell: the two picks, GPU time of the backward call alone (`attngen bench`'s
queued timing, before and after alternating over 3 rounds, the median), and the largest difference of
the gradients.

Usage: python3 docs/backward-h200/gqa_before_after.py OLD_GENERATED_DIR OUT.json SHAPES
       SHAPES: comma-separated BxHq/HkvxSxD, a trailing c for causal (e.g. 32x16/4x512x128c)
The rule before is written out below (before_rule), as the earlier checkout had it.
"""
import json
import math
import sys
from pathlib import Path

import torch

import attngen
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))   # the helpers the scripts share
from gpu_timing import alternating, gradient_difference, old_kernel, write_report
from gqa_backward import parse_shapes

ROOT = Path(__file__).resolve().parents[2]


def before_rule(group, key_blocks, kv_heads, batch, sm_count, uneven):
    """The split count before 2026-12-01: the divisor of the group whose grid comes nearest 8 blocks per
    SM (by ratio), whatever the block's keys; a full mask's grid of a block per two SMs unsplit."""
    blocks = key_blocks * kv_heads * batch
    if group == 1 or (not uneven and 2 * blocks >= sm_count):
        return 1
    return min((s for s in range(1, group + 1) if group % s == 0),
               key=lambda s: abs(math.log(blocks * s / (8 * sm_count))))


def main(old_dir, out, shapes):
    rows = []
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    for b, h, hk, s, d, causal in shapes:
        new = attngen.load(ROOT / "specs" / f"h100_bwd_d{d}_wgmma_bf16.yaml")
        old = old_kernel(new, Path(old_dir))
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, do = (torch.randn(b, h, s, d, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        k, v = (torch.randn(b, hk, s, d, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        o, lse = attngen.attention(q, k, v, causal=causal, return_lse=True)
        before = before_rule(h // hk, -(-s // new.plan.block_n), hk, b, sm_count, causal)
        after_grads = new(q, k, v, o, lse, do, causal=causal)
        row = {"shape": f"{b}x{h}/{hk}x{s}x{d}", "causal": causal, "splits_before": before,
               "splits_after": new.last_group_splits,
               **gradient_difference(after_grads, old(q, k, v, o, lse, do, causal=causal, group_splits=before))}
        us, row["rounds"] = alternating({
            "before": lambda: old(q, k, v, o, lse, do, causal=causal, group_splits=before),
            "after": lambda: new(q, k, v, o, lse, do, causal=causal)})
        row["before_us"], row["after_us"] = us["before"], us["after"]
        row["speedup"] = round(us["before"] / us["after"], 3)
        print(json.dumps(row), flush=True)
        rows.append(row)
        torch.cuda.empty_cache()
    write_report(out, rows)


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], parse_shapes(sys.argv[3]))
