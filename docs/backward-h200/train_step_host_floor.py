"""The floor a Python autograd node sets under a training step's host time (#61): attngen.attention's eager
step beside SDPA (its default choice and each backend forced through sdpa_kernel), SDPA's own flash kernels
called through a Python torch.autograd.Function (the same GPU work as SDPA's flash backend, a Python backward
node), and a Python Function with no GPU work (one allocation each way). One step: o = f(q, k, v, causal);
torch.autograd.grad(o, (q, k, v), do). CPU us per step (host_time.host_and_wall: 100 steps back to back, no
synchronize inside), median of 5 rounds, the paths taking turns; then the forward alone under no_grad, and a
cProfile of attngen's step.

Usage (GPU machine, repository root): python3 docs/backward-h200/train_step_host_floor.py"""
import cProfile
import io
import json
import pstats
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend
import attngen
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))   # the shared helpers
from host_time import host_and_wall
from train_step_bench import sdpa, step   # beside this script

aten = torch.ops.aten


class FlashPy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal):
        out, lse, cq, ck, mq, mk, seed, offset, _ = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)
        ctx.save_for_backward(q, k, v, out, lse, cq, ck, seed, offset)
        ctx.meta = (mq, mk, causal)
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse, cq, ck, seed, offset = ctx.saved_tensors
        mq, mk, causal = ctx.meta
        dq, dk, dv = aten._scaled_dot_product_flash_attention_backward(do, q, k, v, out, lse, cq, ck, mq, mk, 0.0,
                                                                          causal, seed, offset)
        return dq, dk, dv, None


class Nothing(torch.autograd.Function):
    """A Python node with no GPU work but one allocation each way: the bare cost of the mechanism."""
    @staticmethod
    def forward(ctx, q, k, v, causal):
        ctx.save_for_backward(q, k, v)
        return torch.empty_like(q)

    @staticmethod
    def backward(ctx, do):
        q, k, v = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), None


def sdpa_own_choice(q, k, v, causal):
    """SDPA with no backend forced: the backend it picks itself."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def main():
    for shape, causal in (((1, 8, 512, 64), False), ((16, 16, 512, 128), True)):
        q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
        do = torch.randn(*shape, device="cuda", dtype=torch.float16)
        impls = {"attngen eager": lambda q, k, v, c: attngen.attention(q, k, v, causal=c),
                 "sdpa default": sdpa_own_choice, "sdpa flash": sdpa(SDPBackend.FLASH_ATTENTION),
                 "sdpa cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
                 "flash via python Function": FlashPy.apply, "empty python Function": Nothing.apply}
        fns = {n: step(f, q, k, v, do, causal) for n, f in impls.items()}
        got = {n: [] for n in fns}
        for _ in range(5):
            for n, fn in fns.items():
                got[n].append(host_and_wall(fn, n=100, repeats=3)[0])
        print(json.dumps({"shape": "x".join(map(str, shape)), "causal": causal,
                          **{n: round(statistics.median(t), 1) for n, t in got.items()}}), flush=True)
        # the forward alone, no grad
        with torch.no_grad():
            f = {n: (lambda f=f: f(q, k, v, causal)) for n, f in impls.items() if n != "empty python Function"}
            print(json.dumps({"forward only (no_grad)": {n: round(host_and_wall(fn, n=100, repeats=5)[0], 1)
                                                           for n, fn in f.items()}}), flush=True)
    # cProfile of attngen's step, top entries
    q, k, v = (torch.randn(1, 8, 512, 64, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
    do = torch.randn(1, 8, 512, 64, device="cuda", dtype=torch.float16)
    fn = step(lambda q, k, v, c: attngen.attention(q, k, v, causal=c), q, k, v, do, False)
    for _ in range(50):
        fn()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(300):
        fn()
    pr.disable()
    text = io.StringIO()
    pstats.Stats(pr, stream=text).sort_stats("tottime").print_stats(25)
    print(text.getvalue()[:6000])


if __name__ == "__main__":
    main()
