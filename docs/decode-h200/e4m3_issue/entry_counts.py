"""attngen.attention_with_kvcache on contiguous e4m3 caches (k_scale, v_scale per tensor), d128, where the table
serves the 2-stage cells and their split count changed: the count of one block per SM below 64 tiles ("before", the
rule patched to ignore the plan's co_resident_min_tiles) against two per SM from 16 tiles ("after"), one process per
mode (the runtime keeps a shape's launch once worked out), each call a CUDA graph of 30 calls (GPU us per call,
caches rotated past L2), 5 rounds, medians; entry_counts.sh runs the two modes in turn.
Usage: python3 docs/decode-h200/e4m3_issue/entry_counts.py OUT.json before|after"""
import json, statistics, sys
import torch
import attngen
import attngen.runtime.calls.decode as decode_calls

MODE = sys.argv[2]
rule = decode_calls.split_blocks_per_sm
if MODE == "before":
    decode_calls.split_blocks_per_sm = lambda cb, blocks, tiles, kernel_combine=False, min_tiles=0: rule(
        cb, blocks, tiles, kernel_combine, 0)
CASES = [(dt, b, h, hkv, sk) for dt in ("fp16", "bf16") for b, h, hkv in ((4, 32, 8), (8, 32, 8), (16, 32, 8), (4, 32, 32))
         for sk in (2048, 4096, 6144)]
scales = (torch.tensor([0.7], device="cuda"), torch.tensor([1.3], device="cuda"))
out = {"command": f"python3 docs/decode-h200/e4m3_issue/entry_counts.py OUT.json {MODE}", "gpu": torch.cuda.get_device_name(),
       "torch": torch.__version__, "rows": []}


def graph(q, sets, lens, calls=30):
    step = lambda i: attngen.attention_with_kvcache(q, sets[i % len(sets)][0], sets[i % len(sets)][1], cache_seqlens=lens,
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


for dt, b, h, hkv, sk in CASES:
    tdt = torch.float16 if dt == "fp16" else torch.bfloat16
    q = torch.randn(b, h, 1, 128, device="cuda", dtype=tdt)
    lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
    copies = max(2, min(8, -(-200_000_000 // (2 * b * hkv * sk * 128))))
    sets = [tuple(torch.randn(b, hkv, sk, 128, device="cuda", dtype=torch.float16).to(torch.float8_e4m3fn) for _ in range(2))
            for _ in range(copies)]
    g = graph(q, sets, lens)
    times = [time_graph(g) for _ in range(5)]
    row = {"dtype": dt, "grid": f"B{b} {h}/{hkv} Sk{sk}", "mode": MODE, "us": round(statistics.median(times), 2),
           "rounds": [round(t, 2) for t in times]}
    out["rows"].append(row); print(json.dumps(row), flush=True)
    json.dump(out, open(sys.argv[1], "w"), indent=1)
    del g, sets; torch.cuda.empty_cache()
