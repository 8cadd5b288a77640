"""A backward kind's kernels before and after a change, in one process: the committed generated
sources of an earlier checkout compiled and launched through today's runtime (the Params ABI must be
unchanged, but for the tensor maps the Hopper backward added at its end), beside today's. Gradients of the two are compared, deterministic mode included.

Usage: python3 docs/backward-h200/backward_before_after.py OLD_GENERATED_DIR OUT.json [SPEC...]
       (OLD_GENERATED_DIR: e.g. `git worktree add /tmp/before <commit>`, then /tmp/before/generated;
        default specs: h100_bwd_d{128,64}_wgmma, h100_bwd_d128_wgmma_bf16, h100_bwd_d128_wgmma_alibi)

The old kernels get the shared memory their own header states. GPU time of one backward call
(preprocess + main + convert) given attngen's forward o and LSE: `attngen bench`'s queued timing
(30 calls behind a GPU sleep, the median), old and new alternating over 3 rounds (the median of the
rounds); deterministic mode at 4x16x2048.
"""
import json, sys
from pathlib import Path

import torch

import attngen
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))   # the helpers the scripts share
from gpu_timing import alternating, gradient_difference, old_kernel

SHAPES = ((4, 16, 2048), (1, 16, 8192))


def main(old_dir, out, names):
    rows = []
    for name in names:
        new = attngen.load(f"specs/{name}.yaml")
        old = old_kernel(new, Path(old_dir))
        d = new.plan.head_dim
        dtype = torch.bfloat16 if "bf16" in name else torch.float16
        extra = {"alibi_slopes": torch.rand(16, device="cuda")} if "alibi" in name else {}
        if "window" in name:   # a sliding window's mask: 1024 keys back and 1024 ahead (causal closes the right side)
            extra = {**extra, "window": (1024, 1024)}
        cells = [(s, {"causal": c}) for s in SHAPES for c in (False, True)]
        cells.append((SHAPES[0], {"causal": False, "deterministic": True}))
        for (b, h, s), kw in cells:
            torch.manual_seed(0)
            q, k, v, do = (torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(4))
            o, lse = attngen.attention(q, k, v, return_lse=True, causal=kw["causal"], **extra)
            call = {**kw, **extra}
            row = {"spec": name, "shape": f"{b}x{h}x{s}x{d}", **kw,
                   **gradient_difference(new(q, k, v, o, lse, do, **call), old(q, k, v, o, lse, do, **call))}
            us, row["rounds"] = alternating({"before": lambda: old(q, k, v, o, lse, do, **call),
                                             "after": lambda: new(q, k, v, o, lse, do, **call)})
            row["before_us"], row["after_us"] = us["before"], us["after"]
            row["speedup"] = row["before_us"] / row["after_us"]
            print(json.dumps(row), flush=True)
            rows.append(row)
    Path(out).write_text(json.dumps({"command": " ".join(["python3", *sys.argv]), "device": torch.cuda.get_device_name(),
                                     "torch": torch.__version__, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], sys.argv[3:] or ["h100_bwd_d128_wgmma", "h100_bwd_d64_wgmma", "h100_bwd_d128_wgmma_bf16",
                                                    "h100_bwd_d128_wgmma_alibi"])
