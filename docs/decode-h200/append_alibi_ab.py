"""d256 ALiBi append: the cell's kernel with the rows' modifiers held (as before) against made per tile
(row_mods_per_tile), alternating in one process; and the new paged / window functions beside the plain
d256 append cell. GPU time per call: CUDA events around back-to-back calls, median of rounds."""
import dataclasses, json, statistics, sys
import torch
import attngen
from attngen.plan import make_plan
from attngen.spec import load_spec

out_path, rounds = sys.argv[1], int(sys.argv[2])
cell = "specs/h200_decode_d256_append_alibi.yaml"
plan = make_plan(load_spec(cell))
assert plan.row_mods_per_tile
new = attngen.load(plan)
old = attngen.load(dataclasses.replace(plan, row_mods_per_tile=False))
plain = attngen.load("specs/h200_decode_d256_append.yaml")


def time_calls(fn, reps=20):
    fn(); torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record(); torch.cuda.synchronize()
    return a.elapsed_time(b) / reps * 1e3


rows = []
g = torch.Generator(device="cuda").manual_seed(0)
for (b, h, kvh, sk, mask, paged) in [(1, 32, 8, 16384, "causal", False), (8, 32, 8, 8192, "causal", False),
                                     (8, 32, 8, 8192, "none", False), (32, 32, 8, 4096, "causal", False),
                                     (8, 32, 8, 8192, "causal", True), (8, 32, 8, 8192, "window", True),
                                     (8, 32, 8, 8192, "window", False)]:
    d = 256
    r = lambda *s: torch.randn(s, generator=g, device="cuda").half()
    q, kn, vn = r(b, h, 1, d), r(b, kvh, 1, d), r(b, kvh, 1, d)
    lens = torch.full((b,), sk - 1, dtype=torch.int32, device="cuda")
    slopes = torch.rand(h, generator=g, device="cuda") * 0.1
    kw = dict(cache_seqlens=lens, k=kn, v=vn)
    if mask == "causal":
        kw["causal"] = True
    if mask == "window":
        kw["window"] = (1024, 0)
    if paged:
        page = 16
        kc, vc = r(b * sk // page, kvh, page, d), r(b * sk // page, kvh, page, d)
        kw["block_table"] = torch.randperm(b * sk // page, generator=g, device="cuda").to(torch.int32).view(b, -1)
    else:
        kc, vc = r(b, kvh, sk, d), r(b, kvh, sk, d)
    calls = {"plain_append": lambda: plain(q, kc, vc, **kw)}
    if not paged and mask != "window":
        calls["alibi_held"] = lambda: old(q, kc, vc, alibi_slopes=slopes, **kw)
    calls["alibi_per_tile"] = lambda: new(q, kc, vc, alibi_slopes=slopes, **kw)
    if "alibi_held" in calls:
        o1, o2 = calls["alibi_held"](), calls["alibi_per_tile"]()
        torch.cuda.synchronize()
        assert torch.equal(o1, o2), "held and per-tile outputs differ"
    ts = {n: [] for n in calls}
    for _ in range(rounds):
        for n, fn in calls.items():
            ts[n].append(time_calls(fn))
    kv_bytes = 2 * b * kvh * sk * d * 2
    row = {"cell": f"B{b} {h}/{kvh} Sk{sk} d{d} {mask} {'pages of 16' if paged else 'contiguous'}",
           "us": {n: round(statistics.median(v), 2) for n, v in ts.items()},
           "spread": {n: [round(min(v), 2), round(max(v), 2)] for n, v in ts.items()},
           "TB/s_per_tile": round(kv_bytes / statistics.median(ts["alibi_per_tile"]) / 1e6, 2)}
    if "alibi_held" in ts:
        row["held/per_tile"] = round(statistics.median(ts["alibi_held"]) / statistics.median(ts["alibi_per_tile"]), 4)
    print(json.dumps(row), flush=True)
    rows.append(row)
json.dump({"command": f"python3 docs/decode-h200/append_alibi_ab.py OUT {rounds}", "device": torch.cuda.get_device_name(),
           "torch": torch.__version__, "rounds": rounds, "rows": rows}, open(out_path, "w"), indent=1)
