"""MLA decode's combine kernel, before and after the wide combine: GPU us per call queued behind a GPU sleep
(docs/measurements/host_time.py's gpu_time), caches rotated past L2, each cell at the table's split count; the split
and combine kernels' device time per call from torch.profiler. The tree measured is the attngen that imports (run it
from a checkout of either tree, or with PYTHONPATH at one).

A tree with the wide combine (launch_rules.WIDE_COMBINE) is timed three ways, a kernel object each, alternating in
one process: "rule" (the runtime's pick), "lean" (the first combine function at every split count) and "wide" (the
wide function wherever the call splits); "lean" and "wide" give the same bits (checked).

Usage: python3 docs/decode-h200/mla_combine/combine_ab.py OUT.json [ROUNDS]"""
import json
import math
import statistics
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "measurements"))
import host_time  # noqa: E402
import attngen  # noqa: E402
import attngen.runtime.calls.decode as decode_call  # noqa: E402

SPECS = Path(attngen.__file__).resolve().parents[1] / "specs"
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
has_wide = hasattr(decode_call, "WIDE_COMBINE_MIN_SPLITS")
ways = {"rule": None, "lean": 10 ** 9, "wide": 2} if has_wide else {"before": None}
rule_threshold = decode_call.WIDE_COMBINE_MIN_SPLITS if has_wide else None
CELLS = ((1, 16, 32768, 1), (1, 16, 131072, 1), (1, 16, 8192, 1), (2, 16, 8192, 2), (4, 16, 16384, 1),
         (8, 16, 8192, 1), (16, 16, 8192, 1), (32, 16, 8192, 1), (1, 64, 32768, 1), (1, 128, 32768, 1),
         (8, 128, 4096, 1))
g = torch.Generator(device="cuda").manual_seed(0)
out = []
for b, h, keys, sq in CELLS:
    name = "h200_decode_d576_mla_bf16" if h * sq <= 16 else "h200_decode_d576_mla_m32_bf16"
    q = torch.randn((b, sq, h, 576), generator=g, device="cuda").bfloat16()
    lens = torch.full((b,), keys, dtype=torch.int32, device="cuda")
    n_sets = max(2, int(3 * 60e6 // (b * keys * 576 * 2)) + 1)
    caches = [torch.randn((b, keys, 1, 576), generator=g, device="cuda").bfloat16() for _ in range(n_sets)]
    at = {"i": 0}
    kernels, first = {}, {}
    for way, threshold in ways.items():   # each kernel's first call fixes its launches (its prepared record)
        if has_wide:
            decode_call.WIDE_COMBINE_MIN_SPLITS = threshold if threshold is not None else rule_threshold
        kernels[way] = attngen.load(SPECS / f"{name}.yaml")
        first[way] = kernels[way](q, caches[0], caches[0][..., :512], cache_seqlens=lens, layout="bshd",
                                  scale=1 / math.sqrt(192), causal=sq > 1)
    if has_wide:
        decode_call.WIDE_COMBINE_MIN_SPLITS = rule_threshold
    torch.cuda.synchronize()
    diff = {w: float((o.float() - first[next(iter(first))].float()).abs().max()) for w, o in first.items()}

    def runner(k):
        def run():
            c = caches[at["i"] % n_sets]
            at["i"] += 1
            return k(q, c, c[..., :512], cache_seqlens=lens, layout="bshd", scale=1 / math.sqrt(192), causal=sq > 1)
        return run
    calls = {w: runner(k) for w, k in kernels.items()}
    times = {w: [] for w in calls}
    for _ in range(rounds):
        for w, fn in calls.items():
            times[w].append(host_time.gpu_time(fn, n=20, repeats=3))
    per_kernel = {}
    for w, fn in calls.items():
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                fn()
            torch.cuda.synchronize()
        for e in prof.key_averages():
            if "attngen" in e.key:
                part = "combine_wide" if "combine_wide" in e.key else "combine" if "combine" in e.key else "split"
                per_kernel.setdefault(w, {})[part] = round(e.device_time_total / max(1, e.count), 2)
    gb = b * keys * 576 * 2 / 1e9
    us = {w: round(statistics.median(v), 2) for w, v in times.items()}
    row = {"cell": f"B{b} {h}/1 {keys} keys, {sq} new token{'s' if sq > 1 else ''}", "spec": name,
           "splits": kernels[next(iter(kernels))].last_splits, "gpu_us": us,
           "TB_s": {w: round(gb / (t * 1e-6) / 1e3, 3) for w, t in us.items()}, "kernel_us": per_kernel,
           "max_diff_vs_first_way": diff}
    print(json.dumps(row), flush=True)
    out.append(row)
    del caches, kernels, first
    torch.cuda.empty_cache()
json.dump({"command": f"python3 docs/decode-h200/mla_combine/combine_ab.py OUT.json {rounds}", "tree": str(SPECS.parent),
           "device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": out}, open(sys.argv[1], "w"),
          indent=1)
