"""One query row through attngen.attention (the forward kernel) against attngen.attention_with_kvcache (the decode
table) and torch SDPA (default backend, and flash alone), bhsd, GPU us per call in CUDA graphs of 20 calls over rotating
K/V copies (past L2), medians of 5 replays; eager: 20 calls back to back, host included, medians of 5.
Usage: python3 docs/decode-h200/one_row/one_row.py OUT.json (MODE=before|after: attngen.attention, the decode call and SDPA only;
MODE=before turns the route off (library.ROUTE_MAX_SEQLEN_Q = 0: the forward's kernels); SQ=N: N query rows, causal
bottom-right; VARIANT=softcap|sinks|window: attngen.attention with it; ENABLE=1: SDPA through attngen.enable();
PREPARED=0: the route without forward()'s prepared call; ROUTE_ALL=1: the route takes every variant the decode call
serves whatever the call's work, library.ROUTE_VARIANTS widened and ROUTE_VARIANT_MIN_WORK 0)"""
import json, statistics, sys
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
import attngen

def time_graph(fn, sets, calls=20):
    for i in range(len(sets)): fn(*sets[i])
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls): fn(*sets[i % len(sets)])
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(5):
        g.replay(); s.record(); g.replay(); e.record(); e.synchronize(); out.append(s.elapsed_time(e) * 1000 / calls)
    return round(statistics.median(out), 2)

def time_eager(fn, sets, calls=20):
    out = []
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(6):
        torch.cuda.synchronize(); s.record()
        for i in range(calls): fn(*sets[i % len(sets)])
        e.record(); e.synchronize(); out.append(s.elapsed_time(e) * 1000 / calls)
    return round(statistics.median(out[1:]), 2)

def sdpa(backend):
    def f(q, k, v):
        with sdpa_kernel([backend]) if backend else _null():
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, attn_mask=keep if SQ > 1 else None)
    return f

class _null:
    def __enter__(self): pass
    def __exit__(self, *a): pass

CASES = [(b, 32, 8, sk, 128) for b in (1, 8, 32) for sk in (1024, 4096, 16384)] + [(8, 32, 8, 4096, 64), (8, 32, 32, 4096, 128)]
import os
ENABLED = os.environ.get('ENABLE') == '1'
BEFORE = os.environ.get('MODE') == 'before'
from attngen.ops import library
from attngen.ops.dispatch import DISPATCH

if ENABLED:
    attngen.enable()
SQ = int(os.environ.get('SQ', '1'))     # query rows per head; the route takes up to SQ of them (causal bottom-right)
library.ROUTE_MAX_SEQLEN_Q = 0 if BEFORE else max(SQ, library.ROUTE_MAX_SEQLEN_Q)   # before: no route at all
VARIANT = os.environ.get('VARIANT', '')   # softcap | sinks | window: attngen.attention with it (bottom-right, causal)
if os.environ.get('PREPARED') == '0':   # the route without forward()'s prepared call (as 48bcf1df)
    library.OneRowDecode.prepared = lambda self, key: None
if os.environ.get('ROUTE_ALL') == '1':
    library.ROUTE_VARIANTS = frozenset({"softcap", "window", "alibi", "sink"})
    library.ROUTE_VARIANT_MIN_WORK = 0   # whatever the call's work
rows = []
for dt in (torch.bfloat16,):
    for b, h, hkv, sk, d in CASES:
        q = torch.randn(b, h, SQ, d, device="cuda", dtype=dt)
        copies = max(2, min(8, -(-200_000_000 // (2 * b * hkv * sk * d * 2))))
        sets = [(q,) + tuple(torch.randn(b, hkv, sk, d, device="cuda", dtype=dt) for _ in range(2)) for _ in range(copies)]
        # SQ > 1: causal, bottom-right (each new token sees the keys up to its own position)
        keep = (torch.arange(sk, device="cuda")[None, :] <= torch.arange(SQ, device="cuda")[:, None] + sk - SQ)
        ref = F.scaled_dot_product_attention(q.float(), sets[0][1].float(), sets[0][2].float(), enable_gqa=True,
                                             attn_mask=keep if SQ > 1 else None)
        extra = ({"softcap": 30.0} if VARIANT == "softcap" else
                 {"sinks": torch.randn(h, device="cuda")} if VARIANT == "sinks" else
                 {"window": (1023, 1023)} if VARIANT == "window" else {})
        causal = SQ > 1 or bool(extra)   # an alignment only with causal (a non-causal call given one is refused)
        fns = {"attention": lambda q, k, v: attngen.attention(q, k, v, causal=causal,
                                                              alignment="bottom_right" if causal else None, **extra),
               "with_kvcache": lambda q, k, v: attngen.attention_with_kvcache(q, k, v, causal=SQ > 1),
               "sdpa_default": sdpa(None), "sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION),
               "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)}
        if ENABLED:
            fns = {"sdpa_through_attngen": sdpa(None)}
        if os.environ.get('MODE'):
            fns = {"attention": fns["attention"], "with_kvcache": fns["with_kvcache"], "sdpa_default": fns["sdpa_default"]}
        row = {"grid": f"B{b} {h}/{hkv} Sk{sk} d{d}", "dtype": str(dt)[6:], "gpu_us": {}, "eager_us": {}, "err": {}}
        for name, fn in fns.items():
            try:
                o = fn(*sets[0]); torch.cuda.synchronize()
                row["err"][name] = float((o.float() - ref).abs().max())
                row["gpu_us"][name] = time_graph(fn, sets)
                row["eager_us"][name] = time_eager(fn, sets)
            except Exception as exc:
                row["err"][name] = f"{type(exc).__name__}: {str(exc)[:120]}"
        rows.append(row)
        print(row["grid"], row["gpu_us"], row["eager_us"], flush=True)
json.dump({"command": " ".join(["python3"] + sys.argv), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "mode": os.environ.get("MODE"), "rows": rows}, open(sys.argv[1], "w"), indent=1)
