"""attngen.attention_with_kvcache on contiguous e4m3 caches (k_scale, v_scale per tensor), d128, 1k-4k keys, where
the table's routing between the 3-stage and the 2-stage cells changed: "before" reads the table as committed before
(TABLE, e.g. from `git show 205a70f3:specs/dispatch/table.yaml`), "after" the checkout's. One process per mode (the
runtime keeps a shape's kernel once resolved), each call a CUDA graph of 30 calls (GPU us per call, caches rotated
past L2), 5 rounds, medians; the spec each call took is recorded. With `op`, a small torch op goes before each call
in the graph (a decode step's attention follows other kernels, so its split kernel cannot start early); without,
the calls run back to back. entry_route.sh runs the two modes in turn.
Usage: python3 docs/decode-h200/e4m3_route_short/entry_route.py OUT.json before|after [TABLE] [bf16] [op]"""
import json, statistics, sys
import torch
import attngen
from attngen.eval.table_ab import read_table_from, record_specs

MODE = sys.argv[2]
BF16 = "bf16" in sys.argv[3:]
OP = "op" in sys.argv[3:]
side = torch.randn(4096, device="cuda")
if MODE == "before":
    read_table_from(sys.argv[3])
SEEN = record_specs()   # the specs the table gave the case's call (the runtime resolves a shape once)
CASES = [(b, h, hkv, sk) for b, h, hkv in ((1, 32, 8), (2, 32, 8), (4, 32, 8), (8, 32, 8), (16, 32, 8), (32, 32, 8),
                                           (1, 32, 32), (2, 32, 32), (4, 32, 32), (8, 32, 32))
         for sk in ((1024, 2048, 4096) + ((8192, 16384, 32768) if b * hkv <= 64 else ()))]
scales = (torch.tensor([0.7], device="cuda"), torch.tensor([1.3], device="cuda"))
dt = torch.bfloat16 if BF16 else torch.float16
out = {"command": " ".join(["python3"] + sys.argv), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
       "rows": []}


def graph(q, sets, lens, calls=30):
    def step(i):
        if OP:
            side.mul_(1.0)
        return attngen.attention_with_kvcache(q, sets[i % len(sets)][0], sets[i % len(sets)][1], cache_seqlens=lens,
                                              k_scale=scales[0], v_scale=scales[1])
    for i in range(len(sets)):
        step(i)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            step(i)
    return g


def time_graph(g, calls=30):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    g.replay(); start.record(); g.replay(); end.record(); end.synchronize()
    return start.elapsed_time(end) * 1000 / calls


for b, h, hkv, sk in CASES:
    q = torch.randn(b, h, 1, 128, device="cuda", dtype=dt)
    lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
    copies = max(2, min(8, -(-200_000_000 // (2 * b * hkv * sk * 128))))
    sets = [tuple(torch.randn(b, hkv, sk, 128, device="cuda", dtype=torch.float16).to(torch.float8_e4m3fn) for _ in range(2))
            for _ in range(copies)]
    SEEN.clear()
    g = graph(q, sets, lens)
    times = [time_graph(g) for _ in range(5)]
    row = {"dtype": "bf16" if BF16 else "fp16", "op": OP, "grid": f"B{b} {h}/{hkv} Sk{sk}", "mode": MODE, "specs": sorted(set(SEEN)),
           "us": round(statistics.median(times), 2), "rounds": [round(t, 2) for t in times]}
    out["rows"].append(row); print(json.dumps(row), flush=True)
    json.dump(out, open(sys.argv[1], "w"), indent=1)
    del g, sets; torch.cuda.empty_cache()
