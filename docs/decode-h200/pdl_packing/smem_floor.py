"""Does the 3-stage e4m3 cell's loss back to back come from its blocks sharing SMs? Each cell loaded three times:
"pdl" as built (the split kernel a programmatic dependent of the kernel ahead), "plain" (launched the usual way) and
"floor" (as built, but asking for FLOOR bytes of shared memory per block, more than half an SM's, so that no two
blocks share an SM: a dependent call's blocks cannot be placed beside the blocks of the call ahead). Grids of at most
128 blocks, fp16 queries; timed one call at a time ("queued"), 30 back to back ("b2b") and 30 with a small torch op
before each ("op"), alternating rounds; the three give the same bits.
Usage: python3 docs/decode-h200/pdl_packing/smem_floor.py OUT.json [ROUNDS]"""
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "measurements"))
import host_time  # noqa: E402
import attngen  # noqa: E402
from attngen.eval.bench.decode import median_time_us  # noqa: E402

FLOOR = 116 * 1024   # two blocks need 2 x (FLOOR + 1 KiB reserved) > the SM's 228 KiB
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
SPECS = Path(attngen.__file__).resolve().parents[1] / "specs"
CELLS = [("h200_decode_d128_kv_e4m3_contiguous", 128, [(16, 32, 8, 1024), (16, 32, 8, 2048), (16, 32, 8, 4096),
                                                       (4, 32, 32, 2048), (4, 32, 32, 4096), (8, 32, 8, 4096)]),
         ("h200_decode_d64_contiguous", 64, [(16, 32, 8, 4096), (8, 32, 8, 4096), (16, 32, 8, 16384)])]
scales = {"k_scale": torch.tensor([0.7], device="cuda"), "v_scale": torch.tensor([1.3], device="cuda")}
side = torch.randn(4096, device="cuda")
out = {"command": f"python3 docs/decode-h200/pdl_packing/smem_floor.py OUT.json {rounds}", "floor_bytes": FLOOR,
       "device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
for name, d, grids in CELLS:
    e4m3 = "e4m3" in name
    kernels = {w: attngen.load(SPECS / f"{name}.yaml") for w in ("pdl", "plain", "floor")}
    split_names = {n for _key, n in kernels["plain"].plan.parts[0].functions}
    info = kernels["floor"]._device(0)
    for n in split_names:
        kernels["plain"].functions[n] = kernels["plain"].functions[n]._replace(programmatic=False)
        kernels["floor"].functions[n] = kernels["floor"].functions[n]._replace(smem_dynamic=FLOOR)
        kernels["floor"]._configure(kernels["floor"].functions[n], info)
    for b, h, hkv, sk in grids:
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
        same = all(torch.equal(first["pdl"], o) for o in first.values())
        times = {f"{w}_{m}": [] for w in kernels for m in ("queued", "b2b", "op")}
        for r in range(rounds):
            for w, k in (kernels.items() if r % 2 == 0 else list(kernels.items())[::-1]):
                times[f"{w}_queued"].append(median_time_us(torch, runner(k), 30, rot))
                times[f"{w}_b2b"].append(host_time.gpu_time(runner(k), n=30, repeats=3))
                times[f"{w}_op"].append(host_time.gpu_time(runner(k, True), n=30, repeats=3))
        row = {"cell": name, "grid": f"B{b} {h}/{hkv} Sk{sk}", "splits": kernels["pdl"].last_splits,
               "blocks": b * hkv * kernels["pdl"].last_splits, "same_bits": same,
               "us": {w: round(statistics.median(v), 2) for w, v in times.items()}}
        out["rows"].append(row); print(json.dumps(row), flush=True)
        json.dump(out, open(sys.argv[1], "w"), indent=1)
        del qs, ks, vs, first
        torch.cuda.empty_cache()
