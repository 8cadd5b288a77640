"""Why a cell timed call by call and the same cell called back to back disagree: contiguous e4m3 d128 cells (3-stage,
112.5 KiB, and 2-stage, 80.5 KiB: two blocks of either fit an SM) and, as controls, the fp16-cache d128 cell (192 KiB:
one per SM) and the d64 one, each loaded twice, "pdl" as built (the split kernel launched as a programmatic
dependent of the kernel ahead of it) and "plain" (launched the usual way), timed per call ("queued": events around
each call, medians of 30) and back to back ("b2b": 30 calls between two events), alternating rounds; the
split count each took, and where the blocks of a call ran (%smid of every block, read by a kernel queued with the
same launch right after: not possible from Python, so the SMs' spread is inferred from time only).
Usage: python3 docs/decode-h200/pdl_packing/pdl_packing.py OUT.json [ROUNDS]"""
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "measurements"))
import host_time  # noqa: E402
import attngen  # noqa: E402
from attngen.eval.bench.decode import median_time_us  # noqa: E402

rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
SPECS = Path(attngen.__file__).resolve().parents[1] / "specs"
CELLS = [("h200_decode_d128_kv_e4m3_contiguous", 128), ("h200_decode_d128_kv_e4m3_contiguous_s2", 128),
         ("h200_decode_d128_contiguous", 128), ("h200_decode_d64_contiguous", 64)]
GRIDS = [(16, 32, 8, 4096), (16, 32, 8, 2048), (4, 32, 32, 4096), (8, 32, 8, 4096), (32, 32, 8, 4096)]
scales = {"k_scale": torch.tensor([0.7], device="cuda"), "v_scale": torch.tensor([1.3], device="cuda")}
out = {"command": f"python3 docs/decode-h200/pdl_packing/pdl_packing.py OUT.json {rounds}",
       "device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
for name, d in CELLS:
    e4m3 = "e4m3" in name
    kernels = {"pdl": attngen.load(SPECS / f"{name}.yaml"), "plain": attngen.load(SPECS / f"{name}.yaml")}
    split_names = {n for _key, n in kernels["plain"].plan.parts[0].functions}
    for n in split_names:
        kernels["plain"].functions[n] = kernels["plain"].functions[n]._replace(programmatic=False)
    for b, h, hkv, sk in GRIDS:
        kv_bytes = 2 * b * hkv * sk * d * (1 if e4m3 else 2)
        rot = max(2, min(8, int(3 * 60e6 // kv_bytes) + 1))
        qs = [torch.randn(b, h, 1, d, device="cuda", dtype=torch.float16) for _ in range(rot)]
        mk = lambda: torch.randn(b, hkv, sk, d, device="cuda", dtype=torch.float16)
        ks = [mk().to(torch.float8_e4m3fn) if e4m3 else mk() for _ in range(rot)]
        vs = [mk().to(torch.float8_e4m3fn) if e4m3 else mk() for _ in range(rot)]
        kw = scales if e4m3 else {}
        at = {"i": 0}

        def runner(k):
            def run(i=None):
                j = at["i"] % rot if i is None else i
                at["i"] += 1
                return k(qs[j], ks[j], vs[j], **kw)
            return run
        times = {f"{w}_{m}": [] for w in kernels for m in ("queued", "b2b")}
        for r in range(rounds):
            for w, k in (kernels.items() if r % 2 == 0 else list(kernels.items())[::-1]):
                times[f"{w}_queued"].append(median_time_us(torch, runner(k), 30, rot))
                times[f"{w}_b2b"].append(host_time.gpu_time(runner(k), n=30, repeats=3))
        row = {"cell": name, "grid": f"B{b} {h}/{hkv} Sk{sk}", "KV_MB": round(kv_bytes / 1e6, 1),
               "splits": kernels["pdl"].last_splits, "us": {w: round(statistics.median(v), 2) for w, v in times.items()}}
        out["rows"].append(row); print(json.dumps(row), flush=True)
        json.dump(out, open(sys.argv[1], "w"), indent=1)
        del qs, ks, vs
        torch.cuda.empty_cache()
