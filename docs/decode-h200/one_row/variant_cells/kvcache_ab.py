"""attngen.attention_with_kvcache with a variant at d96 and d64, bf16, one new token, contiguous and paged (pages of
16): "before" reads the dispatch table of the tree before the d64/d96 decode variant cells (TABLE, from `git show
2b709f5a^:specs/dispatch/table.yaml`): d96 variant calls then ran padded to d128 (q and the caches copied every call),
d64 softcap, ALiBi and plain windows too; "after" reads the checkout's. One process per mode (the runtime keeps a
shape's kernel once resolved). GPU us per call: a CUDA graph of 20 calls over cache copies rotated past L2, 5
replays, median; eager us: 20 calls back to back, host included, median of 5. Each output against fp32 attention of
the same variant (max abs error) and the spec the table gave.
Usage: python3 docs/decode-h200/one_row/variant_cells/kvcache_ab.py OUT.json before|after TABLE"""
import json, statistics, sys
import torch
import attngen
from attngen.eval.table_ab import read_table_from, record_specs
from attngen.core.variants import SCORES
from attngen.eval.verify.cases import attention_torch

MODE = sys.argv[2]
if MODE == "before":
    read_table_from(sys.argv[3])
SEEN = record_specs()

# (name, B, Hq, Hkv, keys, d, page, variant kwargs): Phi-3-mini's decode (32/32 heads of 96, a 2047-key window),
# GQA d96 and d64 with softcap, ALiBi or a window
CASES = [("phi3 window", 8, 32, 32, 4096, 96, 16, {"window": (2047, 0)}),
         ("phi3 window", 8, 32, 32, 16384, 96, 16, {"window": (2047, 0)}),
         ("phi3 window", 1, 32, 32, 16384, 96, 0, {"window": (2047, 0)}),
         ("softcap", 8, 32, 8, 8192, 96, 16, {"softcap": 30.0}),
         ("alibi", 8, 32, 8, 4096, 96, 0, {"alibi": True}),
         ("sinks", 4, 32, 8, 8192, 96, 16, {"sinks": True}),
         ("softcap", 8, 32, 8, 8192, 64, 16, {"softcap": 30.0}),
         ("alibi", 8, 32, 8, 4096, 64, 0, {"alibi": True}),
         ("window", 8, 32, 8, 16384, 64, 16, {"window": (1023, 0)})]


def timed(step, n, calls=20):
    for i in range(n):
        step(i)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            step(i)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    gpu, eager = [], []
    for _ in range(5):
        g.replay(); s.record(); g.replay(); e.record(); e.synchronize()
        gpu.append(s.elapsed_time(e) * 1000 / calls)
    for _ in range(5):
        torch.cuda.synchronize(); s.record()
        for i in range(calls):
            step(i)
        e.record(); e.synchronize(); eager.append(s.elapsed_time(e) * 1000 / calls)
    return round(statistics.median(gpu), 2), round(statistics.median(eager), 2)


rows = []
for name, b, hq, hkv, sk, d, page, var in CASES:
    g = torch.Generator(device="cuda").manual_seed(0)
    dt = torch.bfloat16
    copies = max(2, min(8, -(-200_000_000 // (2 * b * hkv * sk * d * 2))))
    q = torch.randn((b, hq, 1, d), generator=g, device="cuda").to(dt)
    lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
    caches = []
    for _ in range(copies):
        k = torch.randn((b, hkv, sk, d), generator=g, device="cuda").to(dt)
        v = torch.randn((b, hkv, sk, d), generator=g, device="cuda").to(dt)
        caches.append((k, v))
    kw = {"causal": True, "cache_seqlens": lens}
    mods, ref_kw = (), {}
    if "window" in var:
        kw["window"] = var["window"]; ref_kw["window"] = var["window"]
    if "softcap" in var:
        kw["softcap"] = var["softcap"]; mods = ((SCORES["softcap"], var["softcap"]),)
    if "alibi" in var:
        slopes = torch.rand(hq, device="cuda", generator=g) * 0.3
        kw["alibi_slopes"] = slopes; mods = ((SCORES["alibi"], slopes),)
    if "sinks" in var:
        sinks = torch.randn(hq, device="cuda", generator=g)
        kw["sinks"] = sinks; mods = ((SCORES["sink"], sinks),)
    calls = []
    for k, v in caches:
        if page:   # pages of `page` keys, a shuffled block table
            pages = b * sk // page
            perm = torch.randperm(pages, device="cuda", generator=g)
            kp = k.reshape(b, hkv, sk // page, page, d).permute(0, 2, 1, 3, 4).reshape(pages, hkv, page, d)
            vp = v.reshape(b, hkv, sk // page, page, d).permute(0, 2, 1, 3, 4).reshape(pages, hkv, page, d)
            kpool, vpool = torch.empty_like(kp), torch.empty_like(vp)
            kpool[perm], vpool[perm] = kp, vp
            table = perm.reshape(b, sk // page).to(torch.int32)
            calls.append((kpool, vpool, {"block_table": table}))
        else:
            calls.append((k, v, {}))
    del caches
    SEEN.clear()
    step = lambda i: attngen.attention_with_kvcache(q, calls[i % len(calls)][0], calls[i % len(calls)][1],
                                                    **kw, **calls[i % len(calls)][2])
    out = step(0).float()
    k0, v0 = (calls[0][0], calls[0][1])
    if page:   # the first copy's cache back in order for the reference
        rows = calls[0][2]["block_table"].flatten().long()
        k0 = k0[rows].reshape(b, sk // page, hkv, page, d).permute(0, 2, 1, 3, 4).reshape(b, hkv, sk, d)
        v0 = v0[rows].reshape(b, sk // page, hkv, page, d).permute(0, 2, 1, 3, 4).reshape(b, hkv, sk, d)
    rep = hq // hkv
    ref, _ = attention_torch(q.float(), k0.float().repeat_interleave(rep, 1), v0.float().repeat_interleave(rep, 1),
                             scale=d ** -0.5, mask="window" if "window" in var else "causal", alignment="bottom_right",
                             modifiers=mods, **ref_kw)
    err = float((out - ref).abs().max())
    gpu, eager = timed(step, len(calls))
    row = {"case": name, "grid": f"B{b} {hq}/{hkv} Sk{sk} d{d} " + (f"pages{page}" if page else "contiguous"),
           "gpu_us": gpu, "eager_us": eager, "max_err": err, "specs": sorted(set(SEEN))}
    rows.append(row)
    print(json.dumps(row), flush=True)
    del calls
json.dump({"command": " ".join(["python3"] + sys.argv), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "mode": MODE, "rows": rows}, open(sys.argv[1], "w"), indent=1)
