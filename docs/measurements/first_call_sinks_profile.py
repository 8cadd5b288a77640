"""cProfile of a process's first training step with learned sinks (the shape of first_call_sinks_train.py), cumulative
and internal time. Usage: python3 docs/measurements/first_call_sinks_profile.py"""
import cProfile, io, pstats, sys, time
import torch
torch.manual_seed(0)
B, S, H, KV, D = 2, 1024, 64, 8, 64
q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
k = torch.randn(B, KV, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
v = torch.randn(B, KV, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
s = torch.randn(H, device="cuda", dtype=torch.float32, requires_grad=True)
do = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
pr = cProfile.Profile(); pr.enable()
t0 = time.perf_counter()
import attngen
t1 = time.perf_counter()
o = attngen.attention(q, k, v, causal=True, window=(127, 0), sinks=s)
torch.cuda.synchronize(); t2 = time.perf_counter()
g = torch.autograd.grad(o, (q, k, v, s), do)
torch.cuda.synchronize(); t3 = time.perf_counter()
pr.disable()
print(f"import {1e3*(t1-t0):.1f} ms, forward {1e3*(t2-t1):.1f} ms, backward {1e3*(t3-t2):.1f} ms")
text = io.StringIO(); st = pstats.Stats(pr, stream=text); st.sort_stats("cumulative").print_stats(45)
print(text.getvalue()[:9000])
text = io.StringIO(); st = pstats.Stats(pr, stream=text); st.sort_stats("tottime").print_stats(15)
print(text.getvalue()[:4000])
