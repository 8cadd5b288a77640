"""cProfile of a process's first training step with learned sinks (first_call_sinks_train.py's inputs),
cumulative and internal time. Usage: python3 docs/measurements/first_call_sinks_profile.py"""
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from first_call_sinks_train import inputs  # noqa: E402

q, k, v, s, do = inputs()
pr = cProfile.Profile()
pr.enable()
t0 = time.perf_counter()
import attngen  # noqa: E402
t1 = time.perf_counter()
o = attngen.attention(q, k, v, causal=True, window=(127, 0), sinks=s)
torch.cuda.synchronize()
t2 = time.perf_counter()
g = torch.autograd.grad(o, (q, k, v, s), do)
torch.cuda.synchronize()
t3 = time.perf_counter()
pr.disable()
print(f"import {1e3 * (t1 - t0):.1f} ms, forward {1e3 * (t2 - t1):.1f} ms, backward {1e3 * (t3 - t2):.1f} ms")
for order, rows in (("cumulative", 45), ("tottime", 15)):
    text = io.StringIO()
    pstats.Stats(pr, stream=text).sort_stats(order).print_stats(rows)
    print(text.getvalue()[:9000])
