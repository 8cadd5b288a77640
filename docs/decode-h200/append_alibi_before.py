"""d256 ALiBi appends, contiguous caches, masks none and causal: the kernel that served them before the cell took
pages and windows (its spec as it was, append_alibi_before/h200_decode_d256.yaml, planned with the rows' score
modifiers held: row_mods_per_tile off, which renders that kernel's source byte for byte) against today's cell,
alternating in one process. GPU us per call: calls queued behind a GPU sleep (docs/measurements/host_time.py's
gpu_time), so the appending call's host path is hidden; outputs compared bit for bit.

Usage: python3 docs/decode-h200/append_alibi_before.py OUT.json [ROUNDS]"""
import dataclasses
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "measurements"))
import host_time  # noqa: E402
import attngen  # noqa: E402
from attngen.plan import make_plan  # noqa: E402
from attngen.spec import load_spec  # noqa: E402

out_path, rounds = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 7
before_plan = make_plan(load_spec(str(ROOT / "docs/decode-h200/append_alibi_before/h200_decode_d256_append_alibi.yaml")))
before = attngen.load(dataclasses.replace(before_plan, row_mods_per_tile=False))
now = attngen.load(str(ROOT / "specs/h200_decode_d256_append_alibi.yaml"))
g = torch.Generator(device="cuda").manual_seed(0)
rows = []
for b, sk, causal in ((1, 16384, True), (8, 8192, True), (8, 8192, False), (32, 4096, True), (64, 2048, True)):
    r = lambda *s: torch.randn(s, generator=g, device="cuda").half()   # noqa: E731
    q, kn, vn = r(b, 32, 1, 256), r(b, 8, 1, 256), r(b, 8, 1, 256)
    kc, vc = r(b, 8, sk, 256), r(b, 8, sk, 256)
    lens = torch.full((b,), sk - 1, dtype=torch.int32, device="cuda")
    slopes = torch.rand(32, generator=g, device="cuda") * 0.1
    calls = {name: (lambda k=k: k(q, kc, vc, cache_seqlens=lens, k=kn, v=vn, alibi_slopes=slopes, causal=causal))
             for name, k in (("before", before), ("now", now))}
    o1, o2 = calls["before"](), calls["now"]()
    torch.cuda.synchronize()
    times = {n: [] for n in calls}
    for _ in range(rounds):
        for n, fn in calls.items():
            times[n].append(host_time.gpu_time(fn, n=20, repeats=3))
    row = {"cell": f"B{b} 32/8 Sk{sk} d256 {'causal' if causal else 'none'} contiguous, one new token",
           "gpu_us": {n: round(statistics.median(v), 2) for n, v in times.items()},
           "before/now": round(statistics.median(times["before"]) / statistics.median(times["now"]), 4),
           "bit_equal": bool(torch.equal(o1, o2))}
    print(json.dumps(row), flush=True)
    rows.append(row)
json.dump({"command": f"python3 docs/decode-h200/append_alibi_before.py OUT.json {rounds}",
           "device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows},
          open(out_path, "w"), indent=1)
