"""Forward specs before and after a change, in one process, beside SDPA's cuDNN forward: the committed
generated sources of an earlier checkout compiled and launched through today's runtime (the Params
ABI must be unchanged), beside today's kernels of the same specs. Outputs of the two are compared.

Usage: python3 docs/before-after-h200/forward_before_after.py OLD_GENERATED_DIR OUT.json SHAPES SPEC [SPEC ...]
       (OLD_GENERATED_DIR: e.g. `git worktree add /tmp/before <commit>`, then /tmp/before/generated; or
        NAME=DIR,NAME=DIR,... to time several earlier versions, each named, beside today's (a single DIR is
        named "before");
        SHAPES: BxHxSxD,... ; each SPEC is timed in its own dtype on the shapes of its head dim)

Per shape, mask (none, causal) and dtype: each spec before and after and cuDNN, timed with `attngen
bench`'s queued timing (30 calls behind a GPU sleep, input sets that defeat L2 reuse), all
alternating over 5 rounds (ATTNGEN_ROUNDS=N in the environment: N); a figure is the median of its rounds. max_diff: the largest |O before -
O after| of each spec, over the earlier versions (0 where the change leaves the arithmetic alone; e4m3 specs: timed on the bench's
quantized inputs beside the fp16 cells, their outputs not compared).
"""
import os
import sys
from pathlib import Path

import torch

import attngen
from attngen.eval.bench import Case, input_sets
from attngen.eval.bench.forward_fp8 import fp8_call, quantized_sets
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))   # the helpers the scripts share
from gpu_timing import alternating_sets, cudnn_forward, old_kernel, write_report

ROUNDS = int(os.environ.get("ATTNGEN_ROUNDS", "5"))   # rounds of the alternation


def main(old_dir, out_path, shapes, *spec_paths):
    olds = [tuple(x.split("=", 1)) for x in old_dir.split(",")] if "=" in old_dir else [("before", old_dir)]
    pairs = []
    for path in spec_paths:
        new = attngen.load(path)
        pairs.append((new, {label: old_kernel(new, Path(d)) for label, d in olds}))
    gen, rows = torch.Generator(device="cuda"), []
    gen.manual_seed(0)
    for shape in shapes.split(","):
        b, h, s, d = map(int, shape.split("x"))
        for dtype in ("fp16", "bf16"):
            mine = [(n, o) for n, o in pairs if n.plan.head_dim == d
                    and (n.plan.spec.dtype == dtype or (n.plan.spec.dtype == "e4m3" and dtype == "fp16"))]
            if not mine:
                continue
            for causal in (False, True):
                sets = input_sets(torch, Case(b, h, s, d, dtype, causal), torch.device("cuda"), gen)
                calls, diffs = {}, {}   # name: (fn, its input sets)
                fp8_sets = None
                for new, old in mine:
                    if ("causal" if causal else "none") not in new.plan.spec.masks:   # a cell of one mask
                        continue
                    name = new.plan.spec.name.replace("h100_wgmma_", "")
                    if new.plan.spec.dtype == "e4m3":   # the bench's quantized sets, outputs preallocated
                        fp8_sets = fp8_sets or quantized_sets(torch, sets)
                        diffs[name] = None
                        for label, o in old.items():
                            calls[f"{name}:{label}"] = fp8_call(o, fp8_sets, causal), fp8_sets
                        calls[f"{name}:after"] = fp8_call(new, fp8_sets, causal), fp8_sets
                        continue
                    q, k, v = sets[0]
                    out = new(q, k, v, causal=causal).float()
                    diffs[name] = max((out - o(q, k, v, causal=causal).float()).abs().max().item() for o in old.values())
                    for label, o in old.items():
                        calls[f"{name}:{label}"] = (lambda q, k_, v, f=o: f(q, k_, v, causal=causal)), sets
                    calls[f"{name}:after"] = (lambda q, k_, v, f=new: f(q, k_, v, causal=causal)), sets
                calls["sdpa:cudnn"] = cudnn_forward(causal), sets
                med, each = alternating_sets(calls, ROUNDS)
                row = {"shape": shape, "dtype": dtype, "causal": causal, "us": med, "max_diff": diffs, "rounds": each}
                print(f"{shape:14} {dtype} {'causal' if causal else 'none':6} "
                      + "  ".join(f"{n} {t:.1f}" for n, t in med.items())
                      + "  diff " + " ".join("-" if x is None else f"{x:.0e}" for x in diffs.values()), flush=True)
                rows.append(row)
                sets = None
    write_report(out_path, rows)


if __name__ == "__main__":
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    main(*sys.argv[1:])
