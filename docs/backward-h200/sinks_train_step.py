"""The gpt-oss zoo training cells (learned sinks) and two plain training steps: host and GPU time per step,
one code version per process; run it once per tree (PYTHONPATH picks the attngen) and it appends a row.

    python3 docs/backward-h200/sinks_train_step.py LABEL OUT.json

Per cell: zoo_queued_us (attngen bench's time_calls with the zoo's 30 calls: GPU time once its sleep covers
the host), host_cpu_us (50 steps back to back, host clock to the last call's return, median of 5),
eager_wall_us (the same with the synchronize after them), gpu_us (30 steps queued behind a GPU sleep,
CUDA events, median of 5); the clocks are docs/measurements/host_time.py's (the recorded run had the same
clocks with 10 warm-up steps, not 20, and a 50 ms sleep, not 100). "zoo" is the zoo's step (attngen/eval/zoo.py:
the fp32 sinks cloned each step), "sinks parameter" the same step with the sinks at one address, as a model's
parameter.
"""
import json
import os
import sys
from pathlib import Path

import torch

import attngen
from attngen.eval import zoo
from attngen.eval.bench.timing import time_calls

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))   # the helpers the scripts share
from host_time import gpu_time, host_and_wall  # noqa: E402


def measure(call):
    cpu, wall = host_and_wall(call, n=50, repeats=5)
    return {"zoo_queued_us": round(time_calls(torch, lambda: call(), [()], reps=30)[0], 1),
            "host_cpu_us": round(cpu, 1), "eager_wall_us": round(wall, 1),
            "gpu_us": round(gpu_time(call, n=30, repeats=5), 1)}


def sinks_as_parameter(prepared, layer):
    t = prepared.tensors
    s = t["sinks"].detach().requires_grad_()      # one address every step, as a model's parameter

    def run():
        xs = [t[n].detach().requires_grad_() for n in ("q", "k", "v")]
        o = attngen.attention(*xs, **zoo._keywords(layer, t, s))
        return torch.autograd.grad(o, xs + [s], t["dout"])
    return run


def plain_step(shape, causal):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(shape, generator=g, device="cuda").to(torch.bfloat16) for _ in range(4))

    def run():
        xs = [x.detach().requires_grad_() for x in (q, k, v)]
        o = attngen.attention(*xs, causal=causal)
        return torch.autograd.grad(o, xs, do)
    return run


def main(label, out):
    res = {"label": label}
    for name in ("gptoss_20b_global", "gptoss_20b_local"):
        layer = zoo.LAYER[name]
        prepared = zoo.prepare(torch, layer, "train")
        res[name + " zoo"] = measure(prepared.run)
        res[name + " sinks parameter"] = measure(sinks_as_parameter(prepared, layer))
    res["plain 1x8x512x64 causal"] = measure(plain_step((1, 8, 512, 64), True))
    res["plain 4x16x2048x128"] = measure(plain_step((4, 16, 2048, 128), False))
    print(json.dumps(res, indent=1), flush=True)
    rows = json.load(open(out)) if os.path.exists(out) else []
    rows.append(res)
    json.dump(rows, open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
