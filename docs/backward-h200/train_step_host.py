"""Host time of a training step's attention: attngen.attention's eager path (library.train, a
torch.autograd.Function) beside the op it replaces in eager mode (attngen::attention_train with its
registered backward, which torch.compile traces) and SDPA's cuDNN backend, in one process.

Usage: python3 docs/backward-h200/train_step_host.py [OUT.json]

One step: o = attention(q, k, v, causal); torch.autograd.grad(o, (q, k, v), do). CPU µs per step:
host_time.py's clock (50 steps back to back, no synchronize inside, the synchronize after them not
counted), the median of 3 rounds of 3, the three paths taking turns; the gradients of the two
attngen paths are compared first (dk and dv bit for bit; dq's fp32 atomics add in any order).
"""
from pathlib import Path
import json
import statistics
import sys

import torch
from torch.nn.attention import SDPBackend

import attngen
from attngen.ops import library
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))   # the helpers the scripts share
from host_time import host_and_wall
from train_step_bench import sdpa, step   # beside this script

CELLS = (((1, 8, 512, 64), False), ((16, 16, 512, 128), True), ((4, 16, 2048, 128), False))


def through_the_op(q, k, v, causal):
    """attngen's forward as torch.compile traces it: the op with its registered backward."""
    library.backward_kernel(q, k, v, causal, "bhsd")
    return torch.ops.attngen.attention_train(q, k, v, causal, None, None, "bhsd", False)[0]


def paths(q, k, v, do, causal):
    impls = {"attngen eager": lambda q, k, v, causal: attngen.attention(q, k, v, causal=causal),
             "attngen op": through_the_op, "sdpa cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)}
    return {name: step(attention, q, k, v, do, causal) for name, attention in impls.items()}


def main(out_path=None):
    rows = []
    for shape, causal in CELLS:
        q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
        do = torch.randn(*shape, device="cuda", dtype=torch.float16)
        fns = paths(q, k, v, do, causal)
        a, b = fns["attngen eager"](), fns["attngen op"]()
        assert torch.equal(a[1], b[1]) and torch.equal(a[2], b[2]), "dk, dv differ between the two paths"
        assert (a[0].float() - b[0].float()).abs().max() <= 1e-3 * max(b[0].float().abs().max().item(), 1.0)
        got = {n: [] for n in fns}
        for _ in range(3):
            for n, fn in fns.items():
                got[n].append(host_and_wall(fn, n=50, repeats=3)[0])
        row = {"shape": "x".join(map(str, shape)), "causal": causal, **{n: statistics.median(t) for n, t in got.items()}}
        print(json.dumps(row), flush=True)
        rows.append(row)
    if out_path:
        with open(out_path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "command": "python3 docs/backward-h200/train_step_host.py OUT.json", "rows": rows}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main(*sys.argv[1:2])
