"""The small GPT's training step (#61: "the small GPT step >= 1.0x SDPA, eager and under torch.compile";
`attngen bench --gpt-step` times the same step, with a first-step check):
the model of docs/backward-h200/train_compare.py (default 4 layers, d_model 512, 8 heads of 64, 1024
tokens, batch 8, bf16 autocast, AdamW) with attngen.attention and with SDPA (its own choice of backend),
eager and torch.compile'd, from one initialization, in one process.

A step: forward under autocast, cross-entropy, zero_grad, backward, optimizer step. Time per step: N
steps back to back, the host clock from the first to the synchronize after the last, / N (what a
training loop feels: host and GPU together); the four variants take turns over the rounds, the median
of the rounds reported. The first step's loss of each variant is printed beside SDPA eager's.

Usage (GPU machine, repository root): python3 docs/backward-h200/gpt_step_bench.py [OUT.json] [--rounds 7]
[--steps 20] [--layers 4] [--batch 8] [--seq 1024]
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from attngen.eval.bench.gpt_model import training_step as make_step

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_compare import GPT, batches  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=512)
    args = ap.parse_args()
    dtype = torch.bfloat16
    torch.manual_seed(0)
    init = {k: v.clone() for k, v in GPT(args.vocab, args.d_model, args.heads, args.layers, args.seq,
                                           False).state_dict().items()}
    data = batches(args.steps, args.batch, args.seq, args.vocab, "cuda")
    steps, first_loss = {}, {}
    for name, use_attngen, compiled in (("sdpa eager", False, False), ("attngen eager", True, False),
                                        ("sdpa compiled", False, True), ("attngen compiled", True, True)):
        model = GPT(args.vocab, args.d_model, args.heads, args.layers, args.seq, use_attngen).cuda()
        model.load_state_dict(init)
        scratch = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
        first_loss[name] = make_step(model, scratch, dtype, args.vocab)(data[0]).item()   # eager, then start over
        model.load_state_dict(init)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
        steps[name] = make_step(torch.compile(model) if compiled else model, opt, dtype, args.vocab)
        for x in data[:3]:   # warm-up (the compiled ones compile here)
            steps[name](x)
        torch.cuda.synchronize()
    times = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for x in data:
                step(x)
            torch.cuda.synchronize()
            times[name].append((time.perf_counter() - t0) / len(data) * 1e3)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "args": vars(args),
              "ms_per_step": {n: statistics.median(t) for n, t in times.items()}, "rounds_ms": times,
              "first_loss": first_loss}
    ms = report["ms_per_step"]
    for mode in ("eager", "compiled"):
        a, s = ms[f"attngen {mode}"], ms[f"sdpa {mode}"]
        print(f"{mode:<9} attngen {a:7.3f} ms  sdpa {s:7.3f} ms  sdpa/attngen {s / a:5.3f}", flush=True)
    print("first-step loss:", json.dumps(first_loss))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
