"""Where a backward call's GPU time goes, kernel by kernel: a backward spec's launches (preprocess,
main, convert) beside SDPA's cuDNN and flash backward on the same inputs, from torch.profiler's
CUDA kernel records.

Usage: python3 .ci/backward_kernels.py OUT.json SPEC.yaml [SHAPE ...]   (SHAPE: BxHxSxD, default
4x16x2048x128 1x16x8192x128)

Per call (spec or backend), shape and mask: 20 calls after 5 warm-up calls, inputs rotated over 4
sets so that no call finds its tensors in L2; each kernel's mean duration per call (µs) and the sum,
and the gaps between them (the span from the first kernel's start to the last one's end, less
the sum). fp16 / bf16 from the spec.
"""
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from attngen.eval.backward_bench import gradient_inputs
from attngen.eval.bench import Case
from attngen.runtime import load

CALLS, WARMUP, SETS = 20, 5, 4
BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}


def kernel_split(fn, sets):
    """{kernel name: mean µs per call}, mean span µs per call: fn(set) profiled CALLS times."""
    for i in range(WARMUP):
        fn(sets[i % len(sets)])
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(CALLS):
            fn(sets[i % len(sets)])
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and not e.name.startswith(("Memcpy", "Memset"))]
    per_call, starts, ends = {}, [], []
    for e in kernels:
        per_call[e.name] = per_call.get(e.name, 0.0) + e.device_time / CALLS
    memsets = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.name.startswith("Memset")]
    for e in memsets:
        per_call["(memset) " + e.name] = per_call.get("(memset) " + e.name, 0.0) + e.device_time / CALLS
    every = sorted(kernels + memsets, key=lambda e: e.time_range.start)
    span = (every[-1].time_range.end - every[0].time_range.start) / CALLS if every else 0.0
    return per_call, span


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
            sets = sets[:SETS]
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
                per_call, span = kernel_split(fn, sets)
                total = sum(per_call.values())
                row = {"shape": shape, "causal": causal, "dtype": dtype, "impl": name, "kernels": per_call,
                       "sum_us": total, "span_us": span}
                rows.append(row)
                print(f"{shape} {'causal' if causal else 'none':6} {name:28} sum {total:8.1f} span {span:8.1f}")
                for kname, us in sorted(per_call.items(), key=lambda kv: -kv[1]):
                    print(f"      {us:8.1f}  {kname[:110]}")
            graphs = None
            torch.cuda.empty_cache()
    with open(out_path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
