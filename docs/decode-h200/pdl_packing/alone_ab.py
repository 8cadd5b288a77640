"""The rule as committed (launch_rules.launches_alone: a programmatic split launch over no more blocks than SMs asks
for a lone block's shared memory) against the same cells without it, on grids where it applies: each cell loaded
twice, "before" with DecodeKernel._alone turned off for that kernel; fp16 queries; timed one call at a time
("queued"), 30 back to back ("b2b") and 30 with a small torch op before each ("op"), alternating rounds; the two give
the same bits.
Usage: python3 docs/decode-h200/pdl_packing/alone_ab.py OUT.json [ROUNDS]"""
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "measurements"))
import host_time  # noqa: E402
import attngen  # noqa: E402
from attngen.eval.bench.decode import median_time_us  # noqa: E402

rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
SPECS = Path(attngen.__file__).resolve().parents[1] / "specs"
GRIDS = [(1, 32, 8, 32768), (4, 32, 8, 4096), (8, 32, 8, 4096), (16, 32, 8, 2048)]
CELLS = [("h200_decode_d128_kv_e4m3_contiguous", 128), ("h200_decode_d128_kv_e4m3_contiguous_s2", 128),
         ("h200_decode_d128_kv_e4m3", 128), ("h200_decode_d64_kv_e4m3_contiguous", 64), ("h200_decode_d64_contiguous", 64)]
scales = {"k_scale": torch.tensor([0.7], device="cuda"), "v_scale": torch.tensor([1.3], device="cuda")}
side = torch.randn(4096, device="cuda")
out = {"command": f"python3 docs/decode-h200/pdl_packing/alone_ab.py OUT.json {rounds}",
       "device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
for name, d in CELLS:
    e4m3 = "e4m3" in name
    kernels = {w: attngen.load(SPECS / f"{name}.yaml") for w in ("before", "after")}
    kernels["before"]._alone = lambda info, launches: launches
    for b, h, hkv, sk in GRIDS:
        kv_bytes = 2 * b * hkv * sk * d * (1 if e4m3 else 2)
        rot = max(2, min(8, int(3 * 60e6 // kv_bytes) + 1))
        qs = [torch.randn(b, h, 1, d, device="cuda", dtype=torch.float16) for _ in range(rot)]
        mk = lambda: torch.randn(b, hkv, sk, d, device="cuda", dtype=torch.float16)
        ks = [mk().to(torch.float8_e4m3fn) if e4m3 else mk() for _ in range(rot)]
        vs = [mk().to(torch.float8_e4m3fn) if e4m3 else mk() for _ in range(rot)]
        kw = scales if e4m3 else {}
        at = {"i": 0}

        def runner(k, op=False):
            def run(i=None):
                j = at["i"] % rot if i is None else i
                at["i"] += 1
                if op:
                    side.mul_(1.0)
                return k(qs[j], ks[j], vs[j], **kw)
            return run
        first = {w: k(qs[0], ks[0], vs[0], **kw) for w, k in kernels.items()}
        torch.cuda.synchronize()
        same = bool(torch.equal(first["before"], first["after"]))
        blocks = b * hkv * -(-h // hkv // 16) * kernels["after"].last_splits
        times = {f"{w}_{m}": [] for w in kernels for m in ("queued", "b2b", "op")}
        for r in range(rounds):
            for w, k in (kernels.items() if r % 2 == 0 else list(kernels.items())[::-1]):
                times[f"{w}_queued"].append(median_time_us(torch, runner(k), 30, rot))
                times[f"{w}_b2b"].append(host_time.gpu_time(runner(k), n=30, repeats=3))
                times[f"{w}_op"].append(host_time.gpu_time(runner(k, True), n=30, repeats=3))
        us = {w: round(statistics.median(v), 2) for w, v in times.items()}
        row = {"cell": name, "grid": f"B{b} {h}/{hkv} Sk{sk}", "splits": kernels["after"].last_splits, "blocks": blocks,
               "same_bits": same, "us": us,
               "before_over_after": {m: round(us[f"before_{m}"] / us[f"after_{m}"], 3) for m in ("queued", "b2b", "op")}}
        out["rows"].append(row); print(json.dumps(row), flush=True)
        json.dump(out, open(sys.argv[1], "w"), indent=1)
        del qs, ks, vs, first
        torch.cuda.empty_cache()
