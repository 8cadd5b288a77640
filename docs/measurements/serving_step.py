"""One serving step as an inference engine runs it: 64 sequences whose keys sit in a paged pool, a
few of them prefilling a chunk of their prompt and the rest decoding one token, all in one call of
attngen.attention_varlen(..., block_table=, seqused_k=) (FlashAttention's paged varlen form, the
one vLLM runs mixed batches through), beside the best torch path for the same step: SDPA per
sequence on each sequence's keys laid out contiguously (torch has no paged attention; the gather
into contiguous caches is done beforehand and not timed, which favours torch).

Checked first: attngen's output against an fp32 reference per sequence (bottom-right causal: a
chunk's queries are the last of their sequence), under the error rule (twice the error of torch's
own low-precision SDPA on the same step). Then timed three ways, each side alike:
- GPU: CUDA events around calls queued behind a GPU sleep (attngen bench's timing, median of 30);
- eager: calls back to back, host included (median over rounds of wall clock / calls);
- graph: the step captured in a CUDA graph and replayed (queued timing of the replay).

Usage (repository root, H100/H200 with the gpu extra):
    python3 docs/measurements/serving_step.py [--json OUT.json] [--page-size 16] [--dtype bf16]
        [--heads 32/8] [--head-dim 128] [--prefill 8] [--chunk 512] [--context 512:8192] [--seed 0]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import attngen  # noqa: E402
from attngen.eval.bench.timing import time_calls, time_eager  # noqa: E402
from attngen.eval.verify.cases import error_bound  # noqa: E402
from attngen.eval.verify.decode import paged_cache  # noqa: E402
from gpu_timing import write_report  # noqa: E402

SEQUENCES = 64


def step_inputs(args, dtype, gen):
    """The step's tensors: per-sequence contexts (keys in the cache, the new tokens included), the new
    query tokens packed back to back, the K/V pool with its block table, and the contiguous caches."""
    lo, hi = (int(x) for x in args.context.split(":"))
    contexts = torch.randint(lo, hi + 1, (SEQUENCES,), generator=gen, device="cuda").tolist()
    new = [args.chunk if s < args.prefill else 1 for s in range(SEQUENCES)]
    contexts = [max(c, n) for c, n in zip(contexts, new)]
    hq, hkv = (int(x) for x in args.heads.split("/"))
    d, cap = args.head_dim, max(contexts)
    k = torch.randn(SEQUENCES, cap, hkv, d, generator=gen, device="cuda").to(dtype)
    v = torch.randn(SEQUENCES, cap, hkv, d, generator=gen, device="cuda").to(dtype)
    kp, vp, table = paged_cache(torch, k, v, contexts, args.page_size, "bshd", generator=gen)
    q = torch.randn(sum(new), hq, d, generator=gen, device="cuda").to(dtype)
    offsets = [0]
    for n in new:
        offsets.append(offsets[-1] + n)
    cu_q = torch.tensor(offsets, dtype=torch.int32, device="cuda")
    used = torch.tensor(contexts, dtype=torch.int32, device="cuda")
    return dict(q=q, k=k, v=v, kp=kp, vp=vp, table=table, cu_q=cu_q, used=used, contexts=contexts, new=new,
                offsets=offsets, hq=hq, hkv=hkv)


def bottom_right(n: int, ctx: int):
    """(n, ctx) bool: query i (the (ctx - n + i)-th token) sees keys 0 .. ctx - n + i."""
    rows = torch.arange(n, device="cuda")[:, None] + (ctx - n)
    return torch.arange(ctx, device="cuda")[None, :] <= rows


def per_sequence(t, dtype=None):
    """The SDPA-per-sequence step over contiguous caches: a list of per-sequence calls (q view, k, v,
    mask or None), K and V in (1, Hkv, ctx, D), repeated to Hq heads only where SDPA refuses GQA."""
    calls = []
    for s, (ctx, n) in enumerate(zip(t["contexts"], t["new"])):
        q = t["q"][t["offsets"][s]:t["offsets"][s + 1]].transpose(0, 1).unsqueeze(0)
        k = t["k"][s, :ctx].transpose(0, 1).unsqueeze(0).contiguous()
        v = t["v"][s, :ctx].transpose(0, 1).unsqueeze(0).contiguous()
        if dtype is not None:
            q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        calls.append((q, k, v, bottom_right(n, ctx) if n > 1 else None))
    return calls


def sdpa_step(calls, outs, gqa: bool, hq: int, hkv: int):
    """Run every sequence's SDPA into its slice of `outs` (total, Hq, D)."""
    at = 0
    for q, k, v, mask in calls:
        if not gqa and hq != hkv:
            k, v = k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa and hq != hkv)
        n = q.shape[2]
        outs[at:at + n].copy_(o[0].transpose(0, 1))
        at += n
    return outs


def graph_of(fn):
    """fn captured in a CUDA graph (after warm-up on a side stream): the replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def timings(fn, reps: int) -> dict:
    out = {"gpu_us": time_calls(torch, lambda: fn(), [()], reps=reps)[0],
           "eager_us": time_eager(torch, lambda: fn(), [()], reps=reps)}
    try:
        replay = graph_of(fn)
        out["graph_us"] = time_calls(torch, lambda: replay(), [()], reps=reps)[0]
    except Exception as exc:    # a path that cannot be captured: recorded, not timed
        out["graph_error"] = str(exc).strip().splitlines()[0][:200]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--dtype", choices=("fp16", "bf16"), default="bf16")
    ap.add_argument("--heads", default="32/8")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--prefill", type=int, default=8, help="sequences prefilling a chunk (the rest decode one token)")
    ap.add_argument("--chunk", type=int, default=512, help="new tokens of a prefilling sequence")
    ap.add_argument("--context", default="512:8192", help="LO:HI, each sequence's keys after the step")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    dtype = torch.float16 if args.dtype == "fp16" else torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    t = step_inputs(args, dtype, gen)
    max_q, max_k = max(t["new"]), max(t["contexts"])

    def ours():
        return attngen.attention_varlen(t["q"], t["kp"], t["vp"], t["cu_q"], None, max_q, max_k, causal=True,
                                        block_table=t["table"], seqused_k=t["used"])

    out = ours().float()
    attngen.check_errors()
    # fp32 reference and torch's low-precision error, per sequence on the contiguous caches
    ref = sdpa_step(per_sequence(t, torch.float32), torch.empty_like(out), True, t["hq"], t["hkv"])
    calls = per_sequence(t)
    low_out = torch.empty_like(t["q"])
    try:
        sdpa_step(calls, low_out, True, t["hq"], t["hkv"])
        gqa = True
    except RuntimeError:
        gqa = False
        sdpa_step(calls, low_out, False, t["hq"], t["hkv"])
    err = (out - ref).abs().max().item()
    bound = error_bound((low_out.float() - ref).abs().max().item())
    kv_bytes = sum(2 * c * t["hkv"] * args.head_dim * t["k"].element_size() for c in t["contexts"])
    row = {"sequences": SEQUENCES, "prefill": args.prefill, "chunk": args.chunk, "decode": SEQUENCES - args.prefill,
           "query_tokens": sum(t["new"]), "keys": sum(t["contexts"]), "kv_bytes": kv_bytes,
           "page_size": args.page_size, "heads": args.heads, "head_dim": args.head_dim, "dtype": args.dtype,
           "max_err": err, "bound": bound, "passed": err <= bound, "sdpa_gqa": gqa}
    if not row["passed"]:
        print(json.dumps(row))
        raise SystemExit(f"attngen's step exceeds the error rule: {err:.3g} > {bound:.3g}")
    row["attngen"] = timings(ours, args.reps)
    outs = torch.empty_like(t["q"])
    row["sdpa_per_sequence"] = timings(lambda: sdpa_step(calls, outs, gqa, t["hq"], t["hkv"]), args.reps)
    for how in ("gpu_us", "eager_us", "graph_us"):
        a, b = row["attngen"].get(how), row["sdpa_per_sequence"].get(how)
        row[f"ratio_{how.removesuffix('_us')}"] = b / a if a and b else None
    print(json.dumps(row, indent=1))
    if args.json:
        write_report(args.json, [row])
    return 0


if __name__ == "__main__":
    sys.exit(main())
