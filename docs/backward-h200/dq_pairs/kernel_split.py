"""The backward's three kernels one by one (torch.profiler's CUDA times, mean us per call over 20 calls, two
rounds), three versions of a spec in one process: generated sources from two earlier trees (compiled and launched
through today's runtime, docs/measurements/gpu_timing.old_kernel) and today's. Run for "dQ added in pairs"
(docs/performance/backward.md): before (register order), v1 (pair adds, a thread's convert loading its 32 bytes)
and the tree then (pair adds, a convert lane loading 16 bytes).

Usage (GPU machine, repository root):
  python3 docs/backward-h200/dq_pairs/kernel_split.py BEFORE_DIR V1_DIR OUT.json SPEC...
  (BEFORE_DIR, V1_DIR: the generated/ folders of two checkouts, e.g. from `git worktree add`)"""
import json, sys
from collections import defaultdict
from pathlib import Path
import torch
from torch.profiler import profile, ProfilerActivity
import attngen
sys.path.insert(0, "docs/measurements")
from gpu_timing import old_kernel


def split(fn, n=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    t = defaultdict(float)
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None)
        if us is None:
            us = e.cuda_time_total
        if not us:
            continue
        part = "convert" if "convert" in e.key else "preprocess" if "preprocess" in e.key else \
            "main" if "attngen" in e.key else "other:" + e.key[:30]
        t[part] += us / n
    return {k: round(v, 1) for k, v in sorted(t.items())}


before_dir, v1_dir, out_path = sys.argv[1:4]
out = {}
for name in sys.argv[4:]:
    new = attngen.load(f"specs/{name}.yaml")
    kernels = {"before": old_kernel(new, Path(before_dir)), "v1": old_kernel(new, Path(v1_dir)), "now": new}
    d = new.plan.head_dim
    dtype = torch.bfloat16 if "bf16" in name else torch.float16
    for (b, h, s) in ((1, 16, 8192), (4, 16, 2048)):
        for causal in (False, True):
            torch.manual_seed(0)
            q, k, v, do = (torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(4))
            o, lse = attngen.attention(q, k, v, return_lse=True, causal=causal)
            row = {}
            for rnd in range(2):
                for label, kern in kernels.items():
                    row.setdefault(label, []).append(split(lambda: kern(q, k, v, o, lse, do, causal=causal)))
            key = f"{name} {b}x{h}x{s}x{d} {'causal' if causal else 'full'}"
            out[key] = row
            print(key, json.dumps({l: r[-1] for l, r in row.items()}), flush=True)
Path(out_path).write_text(json.dumps(out, indent=1))
