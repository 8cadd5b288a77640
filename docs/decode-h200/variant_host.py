"""Host time of the plain decode call (attngen.attention_with_kvcache, no new tokens) over 20 configurations:
d128 and d256, contiguous and pages of 16, causal, window 1024, ALiBi, ALiBi + window, softcap (B8 32/8, cache
4096, one token), with docs/measurements/host_time.py's timers (3 rounds, round-robin), then a cProfile of 2000
calls of the d256 paged ALiBi + window call. Usage: python3 docs/decode-h200/variant_host.py (prints)."""
import cProfile, pstats, sys, time, statistics
from pathlib import Path
import torch, attngen
sys.path.insert(0, "docs/measurements")
import host_time
g = torch.Generator(device="cuda").manual_seed(0)
b, h, kvh, cap = 8, 32, 8, 4096
calls = {}
for d in (128, 256):
    r = lambda *s: torch.randn(s, generator=g, device="cuda").half()
    q = r(b, 1, h, d)
    kc, vc = r(b, cap, kvh, d), r(b, cap, kvh, d)
    kp, vp = r(b * cap // 16, 16, kvh, d), r(b * cap // 16, 16, kvh, d)
    table = torch.randperm(b * cap // 16, generator=g, device="cuda").int().view(b, -1)
    lens = torch.full((b,), cap // 2, dtype=torch.int32, device="cuda")
    slopes = torch.rand(h, generator=g, device="cuda") * 0.1
    for paged in (False, True):
        for var in ("causal", "window", "alibi", "alibi+window", "softcap"):
            kw = dict(cache_seqlens=lens, layout="bshd")
            if paged: kw["block_table"] = table
            if "window" in var: kw["window"] = (1024, 0)
            else: kw["causal"] = True
            if "alibi" in var: kw["alibi_slopes"] = slopes
            if var == "softcap": kw["softcap"] = 30.0
            K, V = (kp, vp) if paged else (kc, vc)
            name = f"d{d} {'paged' if paged else 'contig'} {var}"
            calls[name] = (lambda q=q, K=K, V=V, kw=kw: attngen.attention_with_kvcache(q, K, V, **kw))
for n, c in calls.items():
    host_time.row(n, c)
host_time.measure_rows(rounds=3)
slow = calls["d256 paged alibi+window"]
pr = cProfile.Profile(); pr.enable()
for _ in range(2000): slow()
pr.disable(); torch.cuda.synchronize()
pstats.Stats(pr).sort_stats("tottime").print_stats(14)
