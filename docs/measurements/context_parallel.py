"""Context parallelism with attngen as SDPA's flash backend (#62).

torch's `context_parallel` shards the sequence of q, k, v (and of every buffer it is given) over the
ranks of a device mesh and turns SDPA into ring attention over NCCL: each rank keeps its queries and
sees every rank's keys in turn; each block is a call of aten's flash ops, which `attngen.enable()`
overrides, and the partial results merge through their LSE. The backward takes the merged out and
LSE, as aten's contract says. Nothing of the ring is attngen's own: the same process group spans
hosts (torchrun --nnodes N), so this runs across hosts unchanged.

What each rank checks, for causal and full attention (bf16):
- the CP forward and gradients (its shard) against an fp32 reference of the whole sequence, under
  the error rule (attngen.eval.verify.cases.error_bound: twice the error of torch's own flash
  attention, attngen inactive, one GPU, the whole sequence, plus a floor);
- that attngen ran the blocks (attngen.integrations.sdpa.STATS) and torch's kernel ran none;
- the step time (forward + backward, CUDA events, medians) with CP against one GPU alone.

Causal runs with torch's load balancer (each rank holds a front and a back chunk of the sequence);
torch refuses it for a full mask, whose work is even without it, so that case runs without.

The references are sharded by the same context (they ride along as buffers), so each rank compares
its own shard, whatever order the load balancer gives the rows.

Run on one host with two GPUs:
    python3 -m torch.distributed.run --nproc_per_node 2 docs/measurements/context_parallel.py --json OUT.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import context_parallel
from torch.nn.attention import SDPBackend, sdpa_kernel

try:        # torch's switch for its causal load balancer (2.11: in the _context_parallel package)
    from torch.distributed.tensor.experimental._context_parallel._attention import _cp_options
except ImportError:
    from torch.distributed.tensor.experimental._attention import _cp_options

import attngen
from attngen.eval.verify.cases import error_bound
from attngen.integrations import sdpa


def grads_of(q, k, v, dout, causal, dtype=None):
    """(out, dq, dk, dv) of SDPA on copies of q, k, v (in `dtype` when given), out.backward(dout)."""
    leaves = [t.detach().to(dtype or t.dtype).requires_grad_(True) for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
    out.backward(dout.to(out.dtype))
    return [out.detach()] + [t.grad for t in leaves]


def timed(step, iters: int) -> float:
    """Median ms of `step()` (CUDA events, after two warm-up runs, ranks in step)."""
    for _ in range(2):
        step()
    times = []
    for _ in range(iters):
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def max_over_ranks(value: float) -> float:
    t = torch.tensor([value], device="cuda", dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def run_case(mesh, shape, dtype, causal: bool, iters: int) -> dict:
    torch.manual_seed(0)            # every rank makes the same whole-sequence inputs
    q, k, v, dout = (torch.randn(shape, device="cuda", dtype=dtype) for _ in range(4))
    attngen.disable()
    with sdpa_kernel([SDPBackend.MATH]):
        ref = grads_of(q, k, v, dout, causal, torch.float32)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        torch_low = grads_of(q, k, v, dout, causal)                      # torch's own flash, one GPU
        single_torch_ms = timed(lambda: grads_of(q, k, v, dout, causal), iters)
    attngen.enable()
    single_ms = timed(lambda: grads_of(q, k, v, dout, causal), iters)   # attngen, one GPU, whole sequence

    cq, ck, cv, cdo = (t.detach().clone() for t in (q, k, v, dout))
    riders = [t.clone() for t in ref + torch_low]
    buffers = [cq, ck, cv, cdo, *riders]
    before = dict(sdpa.STATS)
    # torch's load balancer (each rank a front and a back chunk, so causal work is even) serves causal
    # attention only; a full mask's work is even without it, and torch refuses it there.
    balanced = _cp_options.enable_load_balance
    _cp_options.enable_load_balance = causal
    with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2] * len(buffers),
                          no_restore_buffers=set(buffers)):
        cp = grads_of(cq, ck, cv, cdo, causal)
        ran = {key: n - before.get(key, 0) for key, n in sdpa.STATS.items() if n != before.get(key, 0)}
        cp_ms = timed(lambda: grads_of(cq, ck, cv, cdo, causal), iters)
    _cp_options.enable_load_balance = balanced
    ref_s, low_s = riders[:4], riders[4:]
    names = ("out", "dq", "dk", "dv")
    errors = {n: max_over_ranks((c.float() - r).abs().max().item()) for n, c, r in zip(names, cp, ref_s)}
    bounds = {n: error_bound(max_over_ranks((t.float() - r).abs().max().item()))
              for n, t, r in zip(names, low_s, ref_s)}
    return {"shape": list(shape), "dtype": str(dtype).removeprefix("torch."), "causal": causal,
            "ranks": dist.get_world_size(), "load_balanced": causal, "errors": errors, "bounds": bounds,
            "passed": all(errors[n] <= bounds[n] for n in names),
            "calls": {" ".join(key): n for key, n in ran.items()},
            "attngen_ran_every_block": bool(ran) and all(who == "attngen" for _, who in ran),
            "cp_step_ms": round(cp_ms, 3), "one_gpu_step_ms": round(single_ms, 3),
            "one_gpu_torch_flash_step_ms": round(single_torch_ms, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the results here (rank 0)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl")
    mesh = init_device_mesh("cuda", (world,))
    shape = (args.batch, args.heads, args.seq, args.head_dim)
    results = [run_case(mesh, shape, torch.bfloat16, causal, args.iters) for causal in (True, False)]
    attngen.disable()
    if rank == 0:
        text = json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": results},
                          indent=1)
        print(text)
        if args.json:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
