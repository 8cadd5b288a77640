"""attngen.attention_with_kvcache on contiguous e4m3 caches (k_scale, v_scale per tensor), d128, where the table's
routing for 4 or fewer query rows per KV head changed past 16384 keys (batch 2-3 of 32/8 heads, batch 4 of 16/8) and
past 65536 (fewer rows): "before" reads the table as committed before (TABLE, e.g. from `git show
3156affb:specs/dispatch/table.yaml`), "after" the checkout's; calls whose cell did not change are timed as controls.
One process per mode (the runtime keeps a shape's kernel once resolved), each call a CUDA graph of 30 calls (GPU us
per call, caches rotated past L2), 5 replays, medians; the spec each call took is recorded. With `op`, a small torch
op goes before each call in the graph (a decode step's attention follows other kernels); without, the calls run back
to back. "after" also times the same calls on 16-bit caches of the query dtype (`fp16_us`). With `eager`, each call is
also timed eager (`eager_us`: 20 calls back to back as a user makes them, host included, medians; no graph).
entry_ab.sh runs the two modes in turn.
HEAD_DIM=64 in the environment: the d64 calls whose routing changed past 32768 keys (fp16) and their controls.
Usage: python3 docs/decode-h200/e4m3_b1/entry_ab.py OUT.json before|after [TABLE] [bf16] [op] [eager]"""
import json, os, statistics, sys
import torch
import attngen
from attngen.eval.table_ab import read_table_from, record_specs

MODE = sys.argv[2]
BF16 = "bf16" in sys.argv[3:]
OP = "op" in sys.argv[3:]
EAGER = "eager" in sys.argv[3:]
side = torch.randn(4096, device="cuda")
if MODE == "before":
    read_table_from(sys.argv[3])
SEEN = record_specs()   # the specs the table gave the case's call (the runtime resolves a shape once)
CASES = ([(2, 32, 8, sk) for sk in (16384, 32768, 65536, 131072)] + [(3, 32, 8, 32768)]
         + [(1, 32, 8, sk) for sk in (32768, 65536, 131072)] + [(4, 16, 8, sk) for sk in (32768, 131072)]
         + [(2, 16, 8, 131072), (4, 32, 8, 32768)])
D = int(os.environ.get("HEAD_DIM", "128"))
if D == 64:
    CASES = ([(1, 32, 8, sk) for sk in (32768, 65536, 131072)] + [(2, 32, 8, sk) for sk in (65536, 131072)]
             + [(3, 32, 8, 65536), (2, 16, 8, 131072), (4, 32, 8, 65536), (1, 32, 32, 131072)])
scales = (torch.tensor([0.7], device="cuda"), torch.tensor([1.3], device="cuda"))
dt = torch.bfloat16 if BF16 else torch.float16
out = {"command": " ".join(["python3"] + sys.argv), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
       "rows": []}


def graph(q, sets, lens, calls=30, e4m3=True):
    kw = {"k_scale": scales[0], "v_scale": scales[1]} if e4m3 else {}

    def step(i):
        if OP:
            side.mul_(1.0)
        return attngen.attention_with_kvcache(q, sets[i % len(sets)][0], sets[i % len(sets)][1], cache_seqlens=lens, **kw)
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
    q = torch.randn(b, h, 1, D, device="cuda", dtype=dt)
    lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
    copies = max(2, min(8, -(-200_000_000 // (2 * b * hkv * sk * D))))
    sets = [tuple(torch.randn(b, hkv, sk, D, device="cuda", dtype=torch.float16).to(torch.float8_e4m3fn) for _ in range(2))
            for _ in range(copies)]
    SEEN.clear()
    g = graph(q, sets, lens)
    times = [time_graph(g) for _ in range(5)]
    row = {"head_dim": D, "dtype": "bf16" if BF16 else "fp16", "op": OP, "grid": f"B{b} {h}/{hkv} Sk{sk}", "mode": MODE, "specs": sorted(set(SEEN)),
           "us": round(statistics.median(times), 2), "rounds": [round(t, 2) for t in times]}
    if EAGER:
        from attngen.eval.bench.decode import eager_time_us
        row["eager_us"] = round(eager_time_us(torch, lambda i: attngen.attention_with_kvcache(
            q, sets[i][0], sets[i][1], cache_seqlens=lens, k_scale=scales[0], v_scale=scales[1]), 20, len(sets)), 2)
    if MODE == "after":
        del g, sets; torch.cuda.empty_cache()
        copies16 = max(2, min(8, -(-200_000_000 // (4 * b * hkv * sk * D))))
        sets = [tuple(torch.randn(b, hkv, sk, D, device="cuda", dtype=dt) for _ in range(2))
                for _ in range(copies16)]
        g = graph(q, sets, lens, e4m3=False)
        row["fp16_us"] = round(statistics.median(time_graph(g) for _ in range(5)), 2)
        row["fp16_over_e4m3"] = round(row["fp16_us"] / row["us"], 3)
    out["rows"].append(row); print(json.dumps(row), flush=True)
    json.dump(out, open(sys.argv[1], "w"), indent=1)
    del g, sets; torch.cuda.empty_cache()
