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

The step itself lives in attngen (`attngen bench --serving`, attngen/eval/bench/serving.py); this script is
its earlier command line, kept for the reports it wrote.

Usage (repository root, H100/H200 with the gpu extra):
    python3 docs/measurements/serving_step.py [--json OUT.json] [--page-size 16] [--dtype bf16]
        [--heads 32/8] [--head-dim 128] [--prefill 8] [--chunk 512] [--context 512:8192] [--seed 0]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attngen.eval.bench.serving import ServingStep, parse_context, run_serving_bench  # noqa: E402
from gpu_timing import write_report  # noqa: E402


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
    hq, hkv = (int(x) for x in args.heads.split("/"))
    step = ServingStep(prefill=args.prefill, chunk=args.chunk, context=parse_context(args.context), heads=hq,
                       kv_heads=hkv, head_dim=args.head_dim, page_size=args.page_size, dtype=args.dtype,
                       seed=args.seed)
    try:
        row = run_serving_bench(step, args.reps)["rows"][0]
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    print(json.dumps(row, indent=1))
    if args.json:
        write_report(args.json, [row])
    return 0


if __name__ == "__main__":
    sys.exit(main())
