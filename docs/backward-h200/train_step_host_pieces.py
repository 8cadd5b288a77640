"""Where a training step's host time goes (#61): attngen.attention's eager step beside SDPA's own choice of
backend, a Python torch.autograd.Function that launches nothing (one allocation each way; through
Function.apply and through its C++ base's apply) and a C++ autograd node (a view), then the same steps
with autograd's multithreading off (the backward on the calling thread), then attngen's step in pieces:
its Function's forward and backward bodies timed from inside (the backward runs on autograd's device
thread), and the backward and forward bodies on the calling thread alone.

One step: o = f(q, k, v, causal); torch.autograd.grad(o, (q, k, v), do). CPU us per step:
docs/measurements/host_time.py's clock (100 steps back to back, no synchronize inside), the paths
taking turns, median of 5 rounds. --profile adds cProfile of the backward body (device thread) and
of the calling thread.

Usage (GPU machine, repository root): python3 docs/backward-h200/train_step_host_pieces.py [--profile]
Run once per code version (PYTHONPATH picks which attngen) for a before and after."""
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import attngen
from attngen.ops import library

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))   # the shared helpers
from host_time import host_and_wall  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_step_bench import step  # noqa: E402
from train_step_host_floor import Nothing  # noqa: E402  (a Python node that launches nothing)

ACC = {}


def timed(name, fn):
    def wrapper(*a):
        t = time.perf_counter()
        r = fn(*a)
        ACC[name] = ACC.get(name, 0.0) + time.perf_counter() - t
        return r
    return wrapper


TRAIN_CLS = getattr(library, "_PreparedTrain", library._EagerTrain)   # attention()'s Function, after and before e871b65
SUPER_NOTHING = super(torch.autograd.Function, Nothing).apply


def attngen_eager(q, k, v, c):
    return attngen.attention(q, k, v, causal=c)


def sdpa(q, k, v, c):
    return F.scaled_dot_product_attention(q, k, v, is_causal=c)


def main():
    print(torch.cuda.get_device_name(), torch.__version__, sys.version.split()[0])
    for shape, causal in (((1, 8, 512, 64), False), ((16, 16, 512, 128), True)):
        q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
        do = torch.randn(*shape, device="cuda", dtype=torch.float16)
        impls = {"attngen eager": attngen_eager, "sdpa default": sdpa,
                 "nothing py": Nothing.apply, "nothing C apply": SUPER_NOTHING}
        fns = {n: step(f, q, k, v, do, causal) for n, f in impls.items()}
        fns["view (C++ node)"] = (lambda: torch.autograd.grad(q.view_as(q), (q,), do))
        got = {n: [] for n in fns}
        for _ in range(5):
            for n, fn in fns.items():
                got[n].append(host_and_wall(fn, n=100, repeats=3)[0])
        print(f"== {shape} causal={causal}: CPU us per step (median of 5 rounds)")
        for n, t in got.items():
            print(f"  {n:<22} {statistics.median(t):7.1f}   (min {min(t):6.1f})")
        # single-threaded autograd: the backward on the calling thread
        with torch.autograd.set_multithreading_enabled(False):
            for n in ("attngen eager", "sdpa default", "nothing py"):
                t = [host_and_wall(fns[n], n=100, repeats=3)[0] for _ in range(3)]
                print(f"  single-thread autograd {n:<22} {statistics.median(t):7.1f}")
        # pieces: our bodies timed from inside
        f0, b0 = TRAIN_CLS.forward, TRAIN_CLS.backward
        TRAIN_CLS.forward = staticmethod(timed("fwd body", f0))
        TRAIN_CLS.backward = staticmethod(timed("bwd body", b0))
        n = 300
        for _ in range(30):
            fns["attngen eager"]()
        torch.cuda.synchronize()
        ACC.clear()
        ta = tg = 0.0
        for _ in range(n):
            t0 = time.perf_counter()
            o = attngen.attention(q, k, v, causal=causal)
            t1 = time.perf_counter()
            torch.autograd.grad(o, (q, k, v), do)
            t2 = time.perf_counter()
            ta += t1 - t0
            tg += t2 - t1
        torch.cuda.synchronize()
        print(f"  pieces per step (us): attention() {ta / n * 1e6:.1f}, of it forward body {ACC['fwd body'] / n * 1e6:.1f};"
              f" autograd.grad {tg / n * 1e6:.1f}, of it backward body (device thread) {ACC['bwd body'] / n * 1e6:.1f}")
        # the backward body on the main thread
        o, lse = attngen.attention(q, k, v, causal=causal, return_lse=True)
        qd, kd, vd, od = q.detach(), k.detach(), v.detach(), o.detach()
        t = host_and_wall(lambda: library.backward(do, qd, kd, vd, od, lse, causal, None, None, "bhsd"), n=200)[0]
        print(f"  library.backward on the main thread {t:.1f} us; forward (return_lse) under no_grad "
              f"{host_and_wall(lambda: library.forward(qd, kd, vd, causal, None, None, 'bhsd', True), n=200)[0]:.1f}")
        if "--profile" not in sys.argv:
            TRAIN_CLS.forward, TRAIN_CLS.backward = f0, b0
            continue
        # profile of the backward body on the device thread
        prof = cProfile.Profile()

        def profiled(ctx, go, gl):
            prof.enable()
            try:
                return b0(ctx, go, gl)
            finally:
                prof.disable()
        TRAIN_CLS.backward = staticmethod(profiled)
        for _ in range(300):
            fns["attngen eager"]()
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(14)
        print("  backward body on the device thread, cProfile (300 steps):\n" + s.getvalue()[-3500:])
        TRAIN_CLS.backward = b0
        prof2 = cProfile.Profile()
        prof2.enable()
        for _ in range(300):
            fns["attngen eager"]()
        prof2.disable()
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(prof2, stream=s).sort_stats("tottime").print_stats(18)
        print("  main thread, cProfile (300 steps):\n" + s.getvalue()[-4500:])
        TRAIN_CLS.forward, TRAIN_CLS.backward = f0, b0


if __name__ == "__main__":
    main()
