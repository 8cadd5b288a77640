"""The small GPT's training step (#61: "the small GPT step >= 1.0x SDPA, eager and under torch.compile"):
`attngen bench --gpt-step`'s run (attngen/eval/bench/gpt_step.py), with this script's options.

The model (attngen/eval/bench/gpt_model.py, which train_compare.py imports too: default 4 layers, d_model 512,
8 heads of 64, 1024 tokens, batch 8, bf16 autocast, AdamW) with attngen.attention and with SDPA (its own choice
of backend), eager and torch.compile'd, from one initialization, in one process: the first step checked
against SDPA's, then N steps back to back per variant and round, the host clock to the synchronize after them
/ N; the four take turns over the rounds, each figure the median of its rounds.

Usage (GPU machine, repository root): python3 docs/backward-h200/gpt_step_bench.py [OUT.json] [--rounds 7]
[--steps 20] [--layers 4] [--d-model 512] [--heads 8] [--seq 1024] [--batch 8]

docs/backward-h200/gpt_step.json was written by this script before it called the bench's run (its own loop,
the same clocks and order; a first loss per variant instead of the check; that report's keys differ).
"""
import argparse
import json
from pathlib import Path

from attngen.eval.bench.gpt_step import GptShape, format_gpt_step, run_gpt_step


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
    args = ap.parse_args()
    shape = GptShape(args.layers, args.d_model, args.heads, args.seq, args.batch)
    report = run_gpt_step(shape, steps=args.steps, rounds=args.rounds)
    print(format_gpt_step(report), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
