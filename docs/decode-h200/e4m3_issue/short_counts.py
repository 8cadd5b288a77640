"""The contiguous d128 e4m3 cells (3-stage and 2-stage rings) on caches of 2k-6k keys, where the split rule counts one
block per SM (under CO_RESIDENT_MIN_TILES): every split count of 1-8 forced, and the default, GPU us queued (median of
30 calls, caches rotated past L2), 3 rounds; fp16 queries.
Usage: python3 docs/decode-h200/e4m3_issue/short_counts.py OUT.json"""
import json, sys
import torch
from attngen.runtime import load
from attngen.eval.bench.decode import median_time_us

cells = {n: load(f"specs/{n}.yaml") for n in ("h200_decode_d128_kv_e4m3_contiguous", "h200_decode_d128_kv_e4m3_contiguous_s2")}
out = {"command": "python3 docs/decode-h200/e4m3_issue/short_counts.py OUT.json", "gpu": torch.cuda.get_device_name(),
       "torch": torch.__version__, "note": "k_scale 0.7, v_scale 1.3 per tensor", "rows": []}
d = 128
for b in (4, 8, 16):
    for h, hkv in ((32, 8), (8, 1), (32, 32)):
        for sk in (2048, 4096, 6144):
            rot = max(2, min(8, int(3 * 60e6 // (2 * b * hkv * sk * d)) + 1))
            g = torch.Generator(device="cuda").manual_seed(1)
            qs = [torch.randn((b, h, 1, d), generator=g, device="cuda").half() for _ in range(rot)]
            k8 = [torch.randn((b, hkv, sk, d), generator=g, device="cuda").half().to(torch.float8_e4m3fn) for _ in range(rot)]
            v8 = [torch.randn((b, hkv, sk, d), generator=g, device="cuda").half().to(torch.float8_e4m3fn) for _ in range(rot)]
            kw = {"k_scale": torch.tensor([0.7], device="cuda"), "v_scale": torch.tensor([1.3], device="cuda")}
            for name, kernel in cells.items():
                row = {"cell": name, "grid": f"B{b} {h}/{hkv} Sk{sk}", "us": {}}
                kernel(qs[0], k8[0], v8[0], **kw); row["default_splits"] = kernel.last_splits
                for n in (0, 1, 2, 3, 4, 6, 8):
                    extra = {"num_splits": n} if n else {}
                    times = [median_time_us(torch, lambda i: kernel(qs[i], k8[i], v8[i], **kw, **extra), 30, rot) for _ in range(3)]
                    row["us"]["default" if n == 0 else str(n)] = round(sorted(times)[1], 2)
                out["rows"].append(row); print(json.dumps(row), flush=True)
            json.dump(out, open(sys.argv[1], "w"), indent=1)
            del qs, k8, v8; torch.cuda.empty_cache()
