"""Varlen calls with score modifiers (softcap, ALiBi, learned sinks) on packed K/V, and with a second
argument containing "paged" the same calls through a block table (pages of 16, each sequence's pages in
order), checked bit for bit against the packed output: 16 sequences of 304-4096 queries and keys, 32/8
heads, causal bottom-right (and windows), GPU µs per call (attngen bench's queued timing, median of 30).

Usage (GPU machine, repository root): python3 docs/varlen-h200/paged_scores_bench.py OUT.json [paged]
Run it in two trees alternately (without "paged" in one that has no paged scores cells) to compare."""
import json, sys
import torch
import attngen
from attngen.eval.bench.timing import time_calls
from attngen.runtime.calls.varlen import cu_seqlens

paged_ok = "paged" in sys.argv[2]
CASES = [  # d, dtype, kw, window
    (64, torch.bfloat16, {"sinks": 1}, (128, 0)), (64, torch.bfloat16, {"sinks": 1}, None),
    (128, torch.bfloat16, {"softcap": 30.0, "alibi": 1, "sinks": 1}, None), (128, torch.float16, {"alibi": 1}, None),
    (256, torch.bfloat16, {"softcap": 50.0}, None), (256, torch.bfloat16, {"softcap": 50.0}, (4096, 0)),
]
LENS = [4096, 3008, 2048, 1504, 1024, 784, 512, 304] * 2   # multiples of 16: a sequence starts on a page
rows = []
g = torch.Generator(device="cuda").manual_seed(0)
for d, dt, mods, window in CASES:
    hq, hkv = 32, 8
    tot = sum(LENS)
    cu = cu_seqlens(torch, LENS, "cuda")
    sets = []
    for _ in range(3):
        q = torch.randn(tot, hq, d, device="cuda", generator=g).to(dt)
        k = torch.randn(tot, hkv, d, device="cuda", generator=g).to(dt)
        v = torch.randn(tot, hkv, d, device="cuda", generator=g).to(dt)
        sets.append((q, k, v))
    kw = {}
    if "softcap" in mods: kw["softcap"] = mods["softcap"]
    if "alibi" in mods: kw["alibi_slopes"] = torch.rand(hq, device="cuda") * 0.3
    if "sinks" in mods: kw["sinks"] = torch.randn(hq, device="cuda")
    fn = lambda q, k, v: attngen.attention_varlen(q, k, v, cu, cu, max(LENS), max(LENS), causal=True, window=window,
                                                  alignment="bottom_right", **kw)
    us, spread = time_calls(torch, fn, sets, reps=30)
    row = {"d": d, "dtype": str(dt), "mods": sorted(mods), "window": window, "packed_us": round(us, 1)}
    if paged_ok:
        pg = 16
        psets = []
        for q, k, v in sets:
            kp = k.view(tot // pg, pg, hkv, d); vp = v.view(tot // pg, pg, hkv, d)
            # sequence b's pages: its rows are contiguous and start at a multiple of 16 (lengths are)
            starts = cu[:-1].tolist()
            cols = max(-(-n // pg) for n in LENS)
            table = torch.zeros(len(LENS), cols, dtype=torch.int32, device="cuda")
            for b, (s0, n) in enumerate(zip(starts, LENS)):
                ids = torch.arange(s0 // pg, s0 // pg + -(-n // pg), dtype=torch.int32, device="cuda")
                table[b, :len(ids)] = ids
            psets.append((q, kp, vp, table))
        used = torch.tensor(LENS, dtype=torch.int32, device="cuda")
        pfn = lambda q, kp, vp, t: attngen.attention_varlen(q, kp, vp, cu, None, max(LENS), max(LENS), causal=True,
                                                            window=window, block_table=t, seqused_k=used, **kw)
        a = fn(*sets[0]); b = pfn(*psets[0])
        row["paged_equal"] = bool(torch.equal(a, b))
        row["paged16_us"] = round(time_calls(torch, pfn, psets, reps=30)[0], 1)
    rows.append(row)
    print(row, flush=True)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
