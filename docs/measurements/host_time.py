"""Host time and GPU time per call of attngen's kernels beside torch SDPA, in one process.

Usage: python3 docs/measurements/host_time.py [--json FILE] [--label NAME] [--no-torch]
Run once per code version (PYTHONPATH picks which attngen), e.g. before and after a change.

- eager CPU us/call: N calls back to back, host clock from the first call to the return of the
  last (no synchronization inside; the GPU queue never fills at these sizes), every row measured
  once per round, round-robin, median over 7 rounds;
- eager wall us/call: the same, plus the final synchronize, over N;
- GPU us/call: N calls queued behind a GPU sleep (so the host is hidden), CUDA events around them.
Medians of 7 repeats. Inputs are allocated once.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import attngen

ROOT = Path(__file__).resolve().parents[2]
N = 200


def host_and_wall(call, n=N, repeats=7):
    for _ in range(20):
        call()
    torch.cuda.synchronize()
    cpu, wall = [], []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            call()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        cpu.append((t1 - t0) / n * 1e6)
        wall.append((t2 - t0) / n * 1e6)
    return statistics.median(cpu), statistics.median(wall)


def gpu_time(call, n=50, repeats=7):
    out = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(int(2e8))   # the host queues every call before the GPU reaches them
        start.record()
        for _ in range(n):
            call()
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end) / n * 1e3)
    return statistics.median(out)


PENDING = []


def row(name, call):
    """A row to measure; measure_rows() times every row round-robin, so that the host's slow
    stretches (this machine's CPU time per call drifts by tens of percent over a minute) fall on
    every row alike, not on whichever row ran then."""
    entry = {"name": name}
    PENDING.append((entry, call))
    return entry


def measure_rows(rounds=7):
    cpu = {id(e): [] for e, _ in PENDING}
    wall = {id(e): [] for e, _ in PENDING}
    for _ in range(rounds):
        for entry, call in PENDING:
            c, w = host_and_wall(call, repeats=1)
            cpu[id(entry)].append(c)
            wall[id(entry)].append(w)
    for entry, call in PENDING:
        entry["cpu_us"] = statistics.median(cpu[id(entry)])
        entry["wall_us"] = statistics.median(wall[id(entry)])
        entry["gpu_us"] = gpu_time(call)
        print(f"{entry['name']:<58} cpu {entry['cpu_us']:7.1f}  wall {entry['wall_us']:7.1f}  "
              f"gpu {entry['gpu_us']:7.1f} us/call", flush=True)
    PENDING.clear()


def cu_seqlens(lengths):
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device="cuda")


def decode_loop(step, steps=20):
    """us per step of a decode loop, eager and replayed from a CUDA graph of one step."""
    eager_cpu, eager_wall = host_and_wall(step, n=steps)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        _, graph_wall = host_and_wall(graph.replay, n=steps)
    except Exception as exc:   # the code before the library issue could not be captured
        print(f"  CUDA graph capture failed: {type(exc).__name__}: {exc}"[:300], flush=True)
        graph_wall = float("nan")
    return eager_cpu, eager_wall, graph_wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--label", default="attngen")
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args()
    results = []
    new_api = hasattr(attngen, "__path__") and (Path(attngen.__path__[0]) / "runtime").is_dir()
    print(f"{args.label}: {torch.cuda.get_device_name()}, torch {torch.__version__}, attngen at {attngen.__path__[0]}")
    h = torch.float16
    mma = attngen.load(str(ROOT / "specs/h100_mma_d64.yaml"))
    wg = attngen.load(str(ROOT / "specs/lab/h100_wgmma_d128.yaml"))
    dec = attngen.load(str(ROOT / "specs/h200_decode_d128.yaml"))
    fused = attngen.load(str(ROOT / "specs/h200_decode_d128_fused.yaml"))
    var = attngen.load(str(ROOT / "specs/h100_mma_d64_m128n64w4s2x3q.yaml"))

    q, k, v = (torch.randn(1, 8, 512, 64, device="cuda", dtype=h) for _ in range(3))
    results.append(row(f"{args.label} forward 1x8x512x64 mma", lambda: mma(q, k, v)))
    results.append(row(f"{args.label} forward 1x8x512x64 mma causal lse", lambda: mma(q, k, v, causal=True,
                                                                                        return_lse=True)))
    q2, k2, v2 = (torch.randn(1, 8, 512, 128, device="cuda", dtype=h) for _ in range(3))
    results.append(row(f"{args.label} forward 1x8x512x128 wgmma", lambda: wg(q2, k2, v2)))
    qd = torch.randn(8, 32, 1, 128, device="cuda", dtype=h)
    kd, vd = (torch.randn(8, 8, 8192, 128, device="cuda", dtype=h) for _ in range(2))
    lens = torch.full((8,), 8192, dtype=torch.int32, device="cuda")
    results.append(row(f"{args.label} decode B8 32/8 Sk8192 d128 default", lambda: dec(qd, kd, vd, cache_seqlens=lens)))
    results.append(row(f"{args.label} decode fused B8 32/8 Sk8192 d128 default",
                       lambda: fused(qd, kd, vd, cache_seqlens=lens)))
    if new_api:
        results.append(row(f"{args.label} decode B8 32/8 Sk8192 d128 4 splits (split + combine kernel)",
                           lambda: dec(qd, kd, vd, cache_seqlens=lens, num_splits=4)))
        results.append(row(f"{args.label} decode fused B8 32/8 Sk8192 d128 4 splits (one launch)",
                           lambda: fused(qd, kd, vd, cache_seqlens=lens, num_splits=4)))
    if not new_api:
        results.append(row(f"{args.label} decode B8 32/8 Sk8192 d128 validate=False",
                           lambda: dec(qd, kd, vd, cache_seqlens=lens, validate=False)))
    qp, kp, vp = (torch.randn(1024, 8, 64, device="cuda", dtype=h) for _ in range(3))
    cu = cu_seqlens([512, 512])
    results.append(row(f"{args.label} varlen 2x512 H8 d64 default", lambda: var.varlen(qp, kp, vp, cu, cu)))
    results.append(row(f"{args.label} varlen 2x512 H8 d64 max_seqlen_q, validate=False",
                       lambda: var.varlen(qp, kp, vp, cu, cu, max_seqlen_q=512, validate=False)))

    if new_api:
        results.append(row(f"{args.label} attngen.attention 1x8x512x64", lambda: attngen.attention(q, k, v)))
        results.append(row(f"{args.label} attngen.attention 1x8x512x64 causal", lambda: attngen.attention(
            q, k, v, causal=True)))
        results.append(row(f"{args.label} attngen.attention 1x8x512x128", lambda: attngen.attention(q2, k2, v2)))
        results.append(row(f"{args.label} torch.ops.attngen.attention 1x8x512x64", lambda: torch.ops.attngen.attention(
            q, k, v, False, None, None, "bhsd")))
        results.append(row(f"{args.label} attngen.attention_with_kvcache B8 32/8 Sk8192", lambda: (
            attngen.attention_with_kvcache(qd, kd, vd, cache_seqlens=lens))))
        q1 = torch.randn(1, 32, 1, 128, device="cuda", dtype=h)
        k1, v1 = (torch.randn(1, 8, 8192, 128, device="cuda", dtype=h) for _ in range(2))
        lens1 = torch.full((1,), 8192, dtype=torch.int32, device="cuda")
        results.append(row(f"{args.label} attngen.attention_with_kvcache B1 32/8 Sk8192 (split)", lambda: (
            attngen.attention_with_kvcache(q1, k1, v1, cache_seqlens=lens1))))
        results.append(row(f"{args.label} attngen.attention_varlen 2x512 H8 d64", lambda: attngen.attention_varlen(
            qp, kp, vp, cu, cu, 512, 512)))
    if not args.no_torch:
        results.append(row("torch SDPA forward 1x8x512x64 causal", lambda: F.scaled_dot_product_attention(
            q, k, v, is_causal=True)))
        results.append(row("torch SDPA forward 1x8x512x64", lambda: F.scaled_dot_product_attention(q, k, v)))
        results.append(row("torch SDPA forward 1x8x512x128", lambda: F.scaled_dot_product_attention(q2, k2, v2)))
        results.append(row("torch SDPA decode B8 32/8 Sk8192 d128 (GQA)",
                           lambda: F.scaled_dot_product_attention(qd, kd, vd, enable_gqa=True)))
        if new_api:
            results.append(row("torch SDPA decode B1 32/8 Sk8192 d128 (GQA)",
                               lambda: F.scaled_dot_product_attention(q1, k1, v1, enable_gqa=True)))

    measure_rows()

    # A decode loop: 32 layers, batch 8, GQA 32/8, d128, 4k cache, one new token per step.
    layers = 32
    caches = [(torch.randn(8, 8, 4096, 128, device="cuda", dtype=h), torch.randn(8, 8, 4096, 128, device="cuda", dtype=h))
              for _ in range(layers)]
    qs = torch.randn(8, 32, 1, 128, device="cuda", dtype=h)
    lens4k = torch.full((8,), 4096, dtype=torch.int32, device="cuda")
    outs = torch.empty_like(qs)
    kw = {} if new_api else {"validate": False}

    def ours():
        if new_api:
            for kc, vc in caches:
                attngen.attention_with_kvcache(qs, kc, vc, cache_seqlens=lens4k)
            return
        for kc, vc in caches:
            fused(qs, kc, vc, cache_seqlens=lens4k, out=outs, **kw)

    loop = {"name": f"{args.label} decode loop 32 layers B8 32/8 4k d128"}
    loop["eager_cpu_us"], loop["eager_wall_us"], loop["graph_wall_us"] = decode_loop(ours)
    print(f"{loop['name']:<58} eager cpu {loop['eager_cpu_us']:7.1f}  eager wall {loop['eager_wall_us']:7.1f}  "
          f"graph {loop['graph_wall_us']:7.1f} us/step", flush=True)
    results.append(loop)
    if not args.no_torch:
        def theirs():
            for kc, vc in caches:
                F.scaled_dot_product_attention(qs, kc, vc, enable_gqa=True)
        tl = {"name": "torch SDPA decode loop 32 layers B8 32/8 4k d128"}
        tl["eager_cpu_us"], tl["eager_wall_us"], tl["graph_wall_us"] = decode_loop(theirs)
        print(f"{tl['name']:<58} eager cpu {tl['eager_cpu_us']:7.1f}  eager wall {tl['eager_wall_us']:7.1f}  "
              f"graph {tl['graph_wall_us']:7.1f} us/step", flush=True)
        results.append(tl)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                               "results": results}, indent=2) + "\n")


if __name__ == "__main__" and "--components" not in sys.argv:
    sys.exit(main())


def components():
    """Where a forward call's host time goes, piece by piece (the code after the library issue)."""
    from attngen.runtime import driver
    q = torch.randn(1, 8, 512, 64, device="cuda", dtype=torch.float16)
    mma = attngen.load(str(ROOT / "specs/h100_mma_d64.yaml"))
    mma(q, q, q)
    prepared = next(iter(mma._prepared.values()))
    ptrs = (q.data_ptr(),) * 4 + (0,)

    def t(name, f, n=20000):
        for _ in range(200):
            f()
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        dt = (time.perf_counter() - t0) / n * 1e6
        torch.cuda.synchronize()
        print(f"  {name:<44} {dt:6.2f} us", flush=True)

    print("forward 1x8x512x64 mma, pieces:")
    t("whole call", lambda: mma(q, q, q), 5000)
    t("torch.empty_like(q)", lambda: torch.empty_like(q))
    t("_cuda_getCurrentRawStream", lambda: torch._C._cuda_getCurrentRawStream(0))
    t("driver.current_context", driver.current_context)
    t("_run (pack + launch)", lambda: mma._run(prepared, ptrs), 5000)
    fn, handle, grid = prepared.launches[0]
    state = driver.thread_state()
    import ctypes
    stream = ctypes.c_void_p(torch._C._cuda_getCurrentRawStream(0))
    mma._run(prepared, ptrs)   # leaves this call's Params in the thread's buffer
    t("cuLaunchKernel alone (ctypes, raw)", lambda: mma._launch_kernel(handle, grid[0], grid[1], grid[2], fn.threads, 1, 1,
                                                                   fn.smem_dynamic, stream, state.params, None), 5000)
    # the same launch with the Params as one buffer through `extra` instead of kernelParams
    from attngen.cubin import param_layout
    gap = param_layout(mma.compiled[0].cubin)[fn.name][0]
    size = gap + len(prepared.template)
    raw = ctypes.create_string_buffer(bytes(gap) + prepared.template)
    size_t = ctypes.c_size_t(size)
    extra = (ctypes.c_void_p * 5)(1, ctypes.addressof(raw), 2, ctypes.addressof(size_t), 0)
    t("cuLaunchKernel alone, Params through extra", lambda: mma._launch_kernel(
        handle, grid[0], grid[1], grid[2], fn.threads, 1, 1, fn.smem_dynamic, stream, None, extra), 5000)
    side = torch.cuda.Stream()
    side_handle = ctypes.c_void_p(side.cuda_stream)
    t("cuLaunchKernel alone, on a non-default stream", lambda: mma._launch_kernel(
        handle, grid[0], grid[1], grid[2], fn.threads, 1, 1, fn.smem_dynamic, side_handle, state.params, None), 5000)
    one = torch.zeros(1, device="cuda")
    t("torch one.add_(1) (one torch launch)", lambda: one.add_(1), 5000)
    t("cache key", lambda: (q.shape, q.shape, q.shape, q.stride(), q.stride(), q.stride(), q.dtype, q.dtype, q.dtype,
                            q.get_device(), q.get_device(), q.get_device(), False, None, None, False, "bhsd"))
    print("attngen.attention 1x8x512x64, the public path's pieces:")
    from attngen.ops import library
    t("attngen.attention (whole)", lambda: attngen.attention(q, q, q), 5000)
    t("ops.library.forward (table lookup + kernel)", lambda: library.forward(q, q, q, False, None, None, "bhsd", False),
      5000)
    t("kernel call with the public call's keywords", lambda: mma(q, q, q, causal=False, alignment=None, scale=None,
                                                                layout="bhsd", return_lse=False), 5000)
    t("torch.compiler.is_compiling()", torch.compiler.is_compiling)
    t("torch.is_grad_enabled()", torch.is_grad_enabled)
    t("3 x requires_grad", lambda: q.requires_grad or q.requires_grad or q.requires_grad)
    t("library key", lambda: (q.get_device(), q.dtype, q.shape[-1], False, q.shape[2]))
    import cProfile
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(5000):
        mma(q, q, q)
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(12)


if __name__ == "__main__" and "--components" in sys.argv:
    components()
