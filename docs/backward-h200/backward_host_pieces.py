"""Where the host time of a training call's backward goes: each layer of attngen's backward path
called alone, beside SDPA's whole call and its flash backward op alone, at 1x8x512x64 fp16 (small
enough that the host sets the pace).

Usage: python3 docs/backward-h200/backward_host_pieces.py

Per layer: CPU µs per call, 1000 calls back to back (no synchronize inside), median of 5 rounds
after 50 warm-up calls; the synchronize after each round is not counted. Then the backward under
cProfile (500 calls), by own time.
"""
import cProfile
import io
import pstats
import statistics
import time

import torch
import torch.nn.functional as F

import attngen
from attngen.ops import library

q, k, v = (torch.randn(1, 8, 512, 64, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
do = torch.randn(1, 8, 512, 64, device="cuda", dtype=torch.float16)
o, s = attngen.attention(q, k, v), F.scaled_dot_product_attention(q, k, v)
qd, kd, vd = q.detach(), k.detach(), v.detach()
od, lse = torch.ops.attngen.attention(qd, kd, vd, False, None, None, "bhsd")
kernel = library.backward_kernel(qd, kd, vd, False, "bhsd")
kernel(qd, kd, vd, od, lse, do)
prepared = next(iter(kernel._prepared.values()))
shapes, shape_maps = prepared.extra   # scratch shapes; the TMA maps of a kind that reads Q and dO by TMA
scratch = kernel._scratch(qd, shapes)
pointers = (qd.data_ptr(), kd.data_ptr(), vd.data_ptr(), od.data_ptr(), lse.data_ptr(), do.data_ptr(), qd.data_ptr(),
            kd.data_ptr(), vd.data_ptr(), scratch[0].data_ptr(), scratch[1].data_ptr(), 0)
pointers += shape_maps.values(pointers) if shape_maps else ()
flash = torch.ops.aten._scaled_dot_product_flash_attention(qd, kd, vd, 0.0, False, False)


def per_call(fn, n=1000, rounds=5):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t) / n * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)


LAYERS = {
    "torch.autograd.grad, attngen": lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True),
    "torch.autograd.grad, SDPA": lambda: torch.autograd.grad(s, (q, k, v), do, retain_graph=True),
    "op attngen::attention_backward": lambda: torch.ops.attngen.attention_backward(do, qd, kd, vd, od, lse, False, None,
                                                                                  None, "bhsd", False),
    "op aten flash backward (SDPA's)": lambda: torch.ops.aten._scaled_dot_product_flash_attention_backward(
        do, qd, kd, vd, flash[0], flash[1], flash[2], flash[3], flash[4], flash[5], 0.0, False, flash[6], flash[7]),
    "library.backward (no op dispatch)": lambda: library.backward(do, qd, kd, vd, od, lse, False, None, None, "bhsd"),
    "table lookup (backward_kernel)": lambda: library.backward_kernel(qd, kd, vd, False, "bhsd"),
    "kernel(...) (a prepared call)": lambda: kernel(qd, kd, vd, od, lse, do),
    "five allocations (dq, dk, dv, scratch)": lambda: (torch.empty_like(qd), torch.empty_like(kd), torch.empty_like(vd),
                                                       kernel._scratch(qd, shapes)),
    "the maps (TMA kinds; cached per pointer)": lambda: shape_maps.values(pointers[:12]) if shape_maps else (),
    "three launches (_run)": lambda: kernel._run(prepared, pointers),
}
for name, fn in LAYERS.items():
    print(f"{name:40s} {per_call(fn):7.1f} µs", flush=True)
profile = cProfile.Profile()
profile.enable()
for _ in range(500):
    torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
profile.disable()
torch.cuda.synchronize()
text = io.StringIO()
pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(12)
print(text.getvalue())
