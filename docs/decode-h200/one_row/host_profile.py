"""Host time of one-row calls through attngen.attention: plain and with variants, per call, then cProfile.
ROUTE_ALL=1: the route takes every variant the decode call serves, whatever the call's work (library.ROUTE_VARIANTS
widened, ROUTE_VARIANT_MIN_WORK 0), as the trial tree that made host_profile.txt did; PROFILE=names (comma-separated,
default softcap,plain) picks the profiled calls; VARIANT_PREPARED=0: forward_variant keeps no prepared call
(_PREPARED_VARIANT stays empty), as before it had them."""
import cProfile, pstats, time, io, os
import torch, attngen
from attngen.ops import library
if os.environ.get("ROUTE_ALL") == "1":
    library.ROUTE_VARIANTS = frozenset({"softcap", "window", "alibi", "sink"})
    library.ROUTE_VARIANT_MIN_WORK = 0   # whatever the call's work
if os.environ.get("VARIANT_PREPARED") == "0":
    class _Unkept(dict):
        def __setitem__(self, key, value):
            pass
    library._PREPARED_VARIANT = _Unkept()
torch.manual_seed(0)
q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
k, v = (torch.randn(1, 8, 1024, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
sinks = torch.randn(32, device="cuda")
calls = {"plain": lambda: attngen.attention(q, k, v),
         "softcap": lambda: attngen.attention(q, k, v, causal=True, alignment="bottom_right", softcap=30.0),
         "sinks": lambda: attngen.attention(q, k, v, causal=True, alignment="bottom_right", sinks=sinks),
         "window": lambda: attngen.attention(q, k, v, causal=True, alignment="bottom_right", window=(1023, 1023)),
         "kvcache_softcap": lambda: attngen.attention_with_kvcache(q, k, v, softcap=30.0),
         "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)}
for name, fn in calls.items():
    for _ in range(50): fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(400):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
        if len(ts) % 50 == 0: torch.cuda.synchronize()
    ts.sort(); print(f"{name:16s} host per call median {ts[len(ts)//2]*1e6:7.2f} us  p10 {ts[len(ts)//10]*1e6:7.2f}", flush=True)
for name in os.environ.get("PROFILE", "softcap,plain").split(","):
    pr = cProfile.Profile(); pr.enable()
    for _ in range(300): calls[name]()
    pr.disable(); torch.cuda.synchronize()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22); print(name, s.getvalue()[:6000])
