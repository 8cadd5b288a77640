"""Contiguous e4m3 d128 caches: the 3-stage cell against the 2-stage one, each at its default split count and launched
as built (the split kernel a programmatic dependent of the kernel ahead), timed three ways, alternating rounds:
"queued" (events around each call, medians of 30), "b2b" (30 calls back to back between two events: a loop of
attention calls) and "op" (a small torch op before each call: a decode step's attention follows other kernels).
fp16 or bf16 queries; 32/8 and 32/32 heads, B1-B32, 1k-32k keys.
Usage: python3 docs/decode-h200/e4m3_route_short/route_modes.py OUT.json [fp16|bf16] [ROUNDS] [GRIDS]
(GRIDS, e.g. 1x32x8,2x32x32: only those B x H x Hkv)"""
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "measurements"))
import host_time  # noqa: E402
import attngen  # noqa: E402
from attngen.eval.bench.decode import median_time_us  # noqa: E402

BF16 = len(sys.argv) > 2 and sys.argv[2] == "bf16"
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
QDT = torch.bfloat16 if BF16 else torch.float16
SPECS = Path(attngen.__file__).resolve().parents[1] / "specs"
names = {"s3": "h200_decode_d128_kv_e4m3_contiguous", "s2": "h200_decode_d128_kv_e4m3_contiguous_s2"}
cells = {k: attngen.load(SPECS / f"{n}{'_bf16' if BF16 else ''}.yaml") for k, n in names.items()}
scales = {"k_scale": torch.tensor([0.7], device="cuda"), "v_scale": torch.tensor([1.3], device="cuda")}
side = torch.randn(4096, device="cuda")
GRIDS = [(b, h, hkv) for h, hkv in ((32, 8), (32, 32)) for b in ((1, 2, 4, 8, 16, 32) if hkv == 8 else (1, 2, 4, 8))]
if len(sys.argv) > 4:
    GRIDS = [tuple(map(int, g.split("x"))) for g in sys.argv[4].split(",")]
out = {"command": " ".join(["python3"] + sys.argv), "device": torch.cuda.get_device_name(), "torch": torch.__version__,
       "dtype": "bf16" if BF16 else "fp16", "rows": []}
for b, h, hkv in GRIDS:
    for sk in (1024, 2048, 4096, 8192, 16384, 32768):
        kv_bytes = 2 * b * hkv * sk * 128
        rot = max(2, min(8, int(3 * 60e6 // kv_bytes) + 1))
        qs = [torch.randn(b, h, 1, 128, device="cuda", dtype=QDT) for _ in range(rot)]
        ks = [torch.randn(b, hkv, sk, 128, device="cuda", dtype=torch.float16).to(torch.float8_e4m3fn) for _ in range(rot)]
        vs = [torch.randn(b, hkv, sk, 128, device="cuda", dtype=torch.float16).to(torch.float8_e4m3fn) for _ in range(rot)]
        at = {"i": 0}

        def runner(k, op=False):
            def run(i=None):
                j = at["i"] % rot if i is None else i
                at["i"] += 1
                if op:
                    side.mul_(1.0)
                return k(qs[j], ks[j], vs[j], **scales)
            return run
        times = {f"{c}_{m}": [] for c in cells for m in ("queued", "b2b", "op")}
        splits = {}
        for r in range(rounds):
            for c, k in (cells.items() if r % 2 == 0 else list(cells.items())[::-1]):
                times[f"{c}_queued"].append(median_time_us(torch, runner(k), 30, rot))
                times[f"{c}_b2b"].append(host_time.gpu_time(runner(k), n=30, repeats=3))
                times[f"{c}_op"].append(host_time.gpu_time(runner(k, True), n=30, repeats=3))
                splits[c] = k.last_splits
        us = {w: round(statistics.median(v), 2) for w, v in times.items()}
        row = {"grid": f"B{b} {h}/{hkv} Sk{sk}", "rows": b * h, "group": h // hkv, "KV_MB": round(kv_bytes / 1e6, 1),
               "splits": splits, "us": us,
               "s3_over_s2": {m: round(us[f"s3_{m}"] / us[f"s2_{m}"], 3) for m in ("queued", "b2b", "op")}}
        out["rows"].append(row); print(json.dumps(row), flush=True)
        json.dump(out, open(sys.argv[1], "w"), indent=1)
        del qs, ks, vs
        torch.cuda.empty_cache()
