"""A small GPT trained from one initialization with attngen's attention and with torch SDPA: do the
loss curves agree as closely as SDPA agrees with itself?

Usage: python3 docs/backward-h200/train_compare.py OUT.json [--steps 300] [--layers 6] [--d-model 512] [--heads 8]
                                              [--seq 1024] [--batch 8] [--dtype bf16]

Three runs from the same initial weights and the same batches (a synthetic token stream with
structure a model can learn): SDPA twice (its run-to-run noise: FlashAttention-2's backward adds dQ
with atomics in no fixed order, so two runs drift apart), then attngen.attention (its backward runs
the dispatch table's backward spec). Autocast in the given dtype, AdamW. Reports every step's loss
and the max / mean |difference| of attngen against SDPA beside SDPA against itself.
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F

from attngen.eval.bench.gpt_model import GPT   # the model `attngen bench --gpt-step` trains


def batches(steps, batch, seq, vocab, device):
    """A learnable stream: each token is a fixed function of the two before it, with 10 % noise."""
    g = torch.Generator(device="cpu").manual_seed(1234)
    table = torch.randint(0, vocab, (vocab, vocab), generator=g)
    out = []
    for _ in range(steps):
        x = torch.empty(batch, seq + 1, dtype=torch.long)
        x[:, :2] = torch.randint(0, vocab, (batch, 2), generator=g)
        for t in range(2, seq + 1):
            x[:, t] = table[x[:, t - 2], x[:, t - 1]]
        noise = torch.rand(batch, seq + 1, generator=g) < 0.1
        x[noise] = torch.randint(0, vocab, (int(noise.sum()),), generator=g)
        out.append(x.to(device))
    return out


def run(args, use_attngen, data, init):
    model = GPT(args.vocab, args.d_model, args.heads, args.layers, args.seq, use_attngen).cuda()
    model.load_state_dict(init)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    dtype = getattr(torch, {"bf16": "bfloat16", "fp16": "float16"}[args.dtype])
    losses = []
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for x in data:
        with torch.autocast("cuda", dtype=dtype):
            logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.float().view(-1, args.vocab), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, time.perf_counter() - t0


def compare(args) -> dict:
    """The three runs of `args` (see main's options) and their differences."""
    torch.manual_seed(0)
    init = {k: v.clone() for k, v in GPT(args.vocab, args.d_model, args.heads, args.layers, args.seq,
                                           False).state_dict().items()}
    data = batches(args.steps, args.batch, args.seq, args.vocab, "cuda")
    runs, seconds = {}, {}
    for name, use in (("sdpa", False), ("sdpa_again", False), ("attngen", True)):
        runs[name], seconds[name] = run(args, use, data, init)

    def diff(a, b):
        d = [abs(x - y) for x, y in zip(runs[a], runs[b])]
        return {"max": max(d), "mean": sum(d) / len(d), "last_50_mean": sum(d[-50:]) / len(d[-50:])}
    return {"args": vars(args), "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "attngen_vs_sdpa": diff("attngen", "sdpa"), "sdpa_vs_sdpa": diff("sdpa_again", "sdpa"),
            "seconds": seconds, "losses": runs}


def options(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    return ap.parse_args(argv)


def main():
    args = options()
    report = compare(args)
    for name, losses in report["losses"].items():
        print(f"{name}: first loss {losses[0]:.4f}, last {losses[-1]:.4f}, {report['seconds'][name]:.1f} s")
    print(json.dumps({k: report[k] for k in ("attngen_vs_sdpa", "sdpa_vs_sdpa")}))
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
