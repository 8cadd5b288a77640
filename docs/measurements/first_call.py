"""A process's first attngen call: the time spent in attngen (import + first call), torch imported and
the inputs made first. Usage: python3 docs/measurements/first_call.py fwd|dec  (PROFILE=1: cProfile)
fwd: 2x16x2048x128 fp16 causal; dec: 8 x 32/8 heads, one new token, 4096 keys, fp16."""
import sys, time, json, os
import torch
mode = sys.argv[1] if len(sys.argv) > 1 else "fwd"
dev = "cuda"
torch.manual_seed(0)
if mode == "fwd":
    q, k, v = (torch.randn(2, 16, 2048, 128, device=dev, dtype=torch.float16) for _ in range(3))
else:
    q = torch.randn(8, 32, 1, 128, device=dev, dtype=torch.float16)
    k, v = (torch.randn(8, 8, 4096, 128, device=dev, dtype=torch.float16) for _ in range(2))
torch.cuda.synchronize()
prof = os.environ.get("PROFILE")
if prof:
    import cProfile, pstats
    pr = cProfile.Profile(); pr.enable()
t0 = time.perf_counter()
import attngen
t1 = time.perf_counter()
if mode == "fwd":
    o = attngen.attention(q, k, v, causal=True)
else:
    o = attngen.attention(q, k, v)
t2 = time.perf_counter()
torch.cuda.synchronize()
t3 = time.perf_counter()
if prof:
    pr.disable(); pstats.Stats(pr).sort_stats("cumulative").print_stats(30)
t4 = time.perf_counter(); attngen.attention(q, k, v, causal=(mode == "fwd")); t5 = time.perf_counter()
print(json.dumps({"mode": mode, "import_ms": round((t1-t0)*1e3, 1), "call_ms": round((t2-t1)*1e3, 1),
                  "attngen_ms": round((t2-t0)*1e3, 1), "sync_ms": round((t3-t2)*1e3, 1), "second_call_ms": round((t5-t4)*1e3, 2)}))
