"""Where a backward call's GPU time goes, kernel by kernel: a backward spec's launches (preprocess,
main, convert) beside SDPA's cuDNN and flash backward on the same inputs, from torch.profiler's
CUDA kernel records.

Usage: python3 docs/backward-h200/backward_kernels.py OUT.json SPEC.yaml [SHAPE ...]   (SHAPE: BxHxSxD, default
4x16x2048x128 1x16x8192x128)

Per call (spec or backend), shape and mask: 20 calls after 5 warm-up calls, rotating over the
input sets `attngen bench` makes so that no call finds its tensors in L2; each kernel's mean GPU
time per call (µs) and their sum. (The calls are launched back to back, not queued behind a GPU
sleep, so the time between kernels, host included, is not reported.) The dtype is the spec's.
"""
from pathlib import Path
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from attngen.eval.bench.backward import gradient_inputs
from attngen.eval.bench import Case
from attngen.runtime import load
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))   # the helpers the scripts share
from gpu_timing import write_report

CALLS, WARMUP = 20, 5
BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}


def kernel_split(fn, sets):
    """{kernel name: mean µs per call}: fn(set) profiled CALLS times (memsets named as such)."""
    for i in range(WARMUP):
        fn(sets[i % len(sets)])
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(CALLS):
            fn(sets[i % len(sets)])
        torch.cuda.synchronize()
    per_call = {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA or e.name.startswith("Memcpy"):
            continue
        name = ("(memset) " + e.name) if e.name.startswith("Memset") else e.name
        per_call[name] = per_call.get(name, 0.0) + e.device_time / CALLS
    return per_call


def main(out_path, spec_path, *shapes):
    kernel = load(spec_path)
    dtype = kernel.plan.spec.dtype
    shapes = shapes or ("4x16x2048x128", "1x16x8192x128")
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    rows = []
    for shape in shapes:
        b, h, s, d = map(int, shape.split("x"))
        for causal in (False, True):
            case = Case(b, h, s, d, dtype, causal)
            sets, missing = gradient_inputs(torch, case, torch.device("cuda"), gen)
            if missing:
                raise SystemExit(missing)
            grads = {id(t[0]): tuple(torch.empty_like(x) for x in t[:3]) for t in sets}
            impls = {kernel.plan.spec.name: lambda t: kernel(*t, causal=causal, dq=grads[id(t[0])][0],
                                                             dk=grads[id(t[0])][1], dv=grads[id(t[0])][2])}
            graphs = {}
            for name, backend in BACKENDS.items():
                graphs[name] = []
                for q, k, v, _o, _lse, dout in sets:
                    leaves = tuple(x.detach().requires_grad_() for x in (q, k, v))
                    with torch.enable_grad(), sdpa_kernel([backend]):
                        o = F.scaled_dot_product_attention(*leaves, is_causal=causal)
                    graphs[name].append((o, leaves, dout))
                impls[f"sdpa:{name}"] = (lambda t, name=name, idx={id(x[0]): i for i, x in enumerate(sets)}:
                                         torch.autograd.grad(graphs[name][idx[id(t[0])]][0],
                                                             graphs[name][idx[id(t[0])]][1],
                                                             graphs[name][idx[id(t[0])]][2], retain_graph=True))
            for name, fn in impls.items():
                per_call = kernel_split(fn, sets)
                total = sum(per_call.values())
                row = {"shape": shape, "causal": causal, "dtype": dtype, "impl": name, "kernels": per_call,
                       "sum_us": total}
                rows.append(row)
                print(f"{shape} {'causal' if causal else 'none':6} {name:28} sum {total:8.1f}")
                for kname, us in sorted(per_call.items(), key=lambda kv: -kv[1]):
                    print(f"      {us:8.1f}  {kname[:110]}")
            graphs = None
            torch.cuda.empty_cache()
    write_report(out_path, rows)


if __name__ == "__main__":
    main(*sys.argv[1:])
