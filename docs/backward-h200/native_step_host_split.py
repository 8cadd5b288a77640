"""Where the 1x8x512x64 fp16 (no mask) training step's host time goes, attngen's native step against SDPA's own
choice, in one process: CPU us of the forward call alone (with and without grad), and of the whole step
(forward + torch.autograd.grad), medians of 5 alternating rounds of 100; then a torch.profiler CPU table of 50
steps of each. Usage (GPU machine, repository root): python3 docs/backward-h200/native_step_host_split.py"""
import json, statistics, sys
import torch
import torch.nn.functional as F
import attngen
from attngen.runtime import native
native.build(torch)
sys.path.insert(0, "docs/measurements")
from host_time import host_and_wall
q, k, v = (torch.randn(1, 8, 512, 64, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
do = torch.randn(1, 8, 512, 64, device="cuda", dtype=torch.float16)
fa = lambda: attngen.attention(q, k, v)
fs = lambda: F.scaled_dot_product_attention(q, k, v)
def step(f):
    return lambda: torch.autograd.grad(f(), (q, k, v), do)
for _ in range(5):
    step(fa)(); step(fs)()
print("node", type(fa().grad_fn).__name__)
paths = {"attngen fwd": fa, "sdpa fwd": fs, "attngen step": step(fa), "sdpa step": step(fs)}
def nograd(f):
    def r():
        with torch.no_grad():
            return f()
    return r
paths["attngen fwd nograd"] = nograd(fa); paths["sdpa fwd nograd"] = nograd(fs)
got = {n: [] for n in paths}
for _ in range(5):
    for n, f in paths.items():
        got[n].append(host_and_wall(f, n=100, repeats=3)[0])
print(json.dumps({n: round(statistics.median(t), 1) for n, t in got.items()}))
from torch.profiler import profile, ProfilerActivity
for name in ("attngen step", "sdpa step"):
    f = paths[name]
    with profile(activities=[ProfilerActivity.CPU]) as p:
        for _ in range(50):
            f()
        torch.cuda.synchronize()
    print("==", name)
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))
