"""`attngen bench` on e4m3 forward specs: each spec on quantized inputs (V transposed, descales per
(batch, kv head)), rotated through enough sets to defeat L2, beside torch SDPA's backends in fp16 on the
same shapes. Give fp16 specs in the same command to time them on the same shapes in the same run."""
from __future__ import annotations

from dataclasses import dataclass

from .report import BenchReport, BenchRun, Case, CaseResult, Timing, format_bench
from .shared import DEFAULT_SHAPES, SDPA_BACKENDS, environment, input_sets, sdpa_callable, time_timing
from ..verify.cases import Shape, Variant
from ..verify.forward_fp8 import check_fp8_case


@dataclass(frozen=True)
class Fp8Case(Case):
    """A bench case of the e4m3 call (its report's cases carry "call": "forward_fp8", the table's call)."""

    call: str = "forward_fp8"


def check_options(paths, plans, opts) -> list[str]:
    """Problems of the bench options with these e4m3 specs (no GPU needed)."""
    if opts.varlen:
        return ["--varlen: e4m3 specs have no varlen call"]
    return []


def quantized_sets(torch, sets):
    """(q8, k8, v_t8, q_descale, k_descale, v_descale) for each fp16 (q, k, v) set."""
    from ...runtime.calls.forward_fp8 import quantize_fp8
    return [quantize_fp8(q, k, v) for q, k, v in sets]


def fp8_call(kernel, sets, causal: bool):
    """fn(*quantized set) that runs the kernel into an output preallocated per set (no allocation timed)."""
    outs = {id(s[0]): s[0].new_empty(s[0].shape, dtype=kernel.out_dtype) for s in sets}

    def call(q8, k8, v_t, qd, kd, vd):
        kernel(q8, k8, v_t, q_descale=qd, k_descale=kd, v_descale=vd, causal=causal, out=outs[id(q8)])
    return call


# -- what `attngen sweep` measures of e4m3 specs (eval/conventions.py) ------------------------------

def sweep_inputs(torch, case, device, generator) -> list[tuple]:
    """The sweep's input sets of a case: the bench's fp16 sets, quantized as the bench quantizes them."""
    fp16 = input_sets(torch, Case(case.batch, case.heads, case.seqlen, case.head_dim, "fp16", case.causal), device,
                      generator)
    return quantized_sets(torch, fp16)


def check_candidate(kernel, heads: int, seqlen: int, causal: bool, label: str) -> tuple[bool, str]:
    """The e4m3 verifier's rule on one case of the call's mask, at most 2 heads and 1024 rows (the
    bench's and the sweep's check before timing): (passed, its problems)."""
    h, s = min(heads, 2), min(seqlen, 1024)
    r = check_fp8_case(kernel, Variant("causal" if causal else "none", "top_left" if causal else None),
                       Shape(1, h, h, s, s), 1, label)
    return r.passed, "; ".join(r.problems)


def sweep_check(torch, kernel, q8, k8, v_t, q_descale, k_descale, v_descale, causal: bool) -> tuple[bool, str]:
    return check_candidate(kernel, q8.shape[1], q8.shape[2], causal, "sweep")


def sweep_call(torch, kernel, sets, causal: bool):
    return fp8_call(kernel, sets, causal)


def sweep_flash(torch, sets, causal: bool):
    """torch's flash backend on the sweep's inputs as fp16 (V^T turned back): (fn, its sets)."""
    fp16 = [(q8.half(), k8.half(), v_t.transpose(-1, -2).contiguous().half()) for q8, k8, v_t, *_ in sets]
    return sdpa_callable(torch, "flash", causal), fp16


def run_fp8_bench(paths, *, shapes, causals, backends, reps: int, on_step=None, on_compile=None) -> BenchReport:
    import torch
    from ...runtime import load
    device = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device=device)
    gen.manual_seed(0)
    kernels = [load(str(p), on_compile=on_compile) for p in paths]   # on_compile(arch), as the fp16 bench's
    results = []
    for shape in shapes:
        b, h, s, d = shape[:4]
        for causal in causals:
            case = Fp8Case(b, h, s, d, "e4m3", causal)
            row = CaseResult(case)
            fp16 = input_sets(torch, Case(b, h, s, d, "fp16", causal), device, gen)
            sets = quantized_sets(torch, fp16)
            for kernel in kernels:
                t = Timing(kernel.plan.spec.name)
                mask = "causal" if causal else "none"
                if kernel.plan.head_dim != d:
                    t.status, t.note = "unsupported", f"generated for head_dim {kernel.plan.head_dim}"
                elif mask not in kernel.plan.entry_functions:
                    t.status, t.note = "unsupported", f"no {mask} function (masks: {', '.join(kernel.plan.masks)})"
                else:
                    passed, problems = check_candidate(kernel, h, s, causal, "bench")
                    if not passed:
                        t.status, t.note = "failed-check", problems
                    else:
                        fn = fp8_call(kernel, sets, causal)
                        time_timing(torch, t, case, fn, sets, reps=reps)
                row.timings.append(t)
                if on_step:
                    on_step(case, t)
            for backend in backends:
                t = Timing(f"sdpa:{backend}")
                try:
                    time_timing(torch, t, case, sdpa_callable(torch, backend, causal), fp16, reps=reps)
                except RuntimeError as exc:
                    t.status, t.note = "unsupported", str(exc).splitlines()[0][:120]
                row.timings.append(t)
                if on_step:
                    on_step(case, t)
            results.append(row)
            del fp16, sets
    return BenchReport(torch.cuda.get_device_name(device), environment(torch), results)


def bench_specs(paths, plans, opts, progress, on_compile):
    from ...runtime import gpu_modules
    gpu_modules()
    shapes = opts.shapes or DEFAULT_SHAPES
    backends = opts.backends or ("flash",)
    unknown = [b for b in backends if b not in SDPA_BACKENDS]
    if unknown:
        raise ValueError(f"unknown backend(s) {unknown}")
    steps = len(shapes) * len(opts.causals) * (len(paths) + len(backends))
    with progress("bench e4m3", steps) as bar:
        def step(case, timing):
            bar.label = f"{case.label} {timing.impl}"
            bar.update(1)
        report = run_fp8_bench(paths, shapes=shapes, causals=opts.causals, backends=backends, reps=opts.reps,
                               on_step=step, on_compile=on_compile)
    text = format_bench(report, backends) + "\n(sdpa rows run fp16 inputs of the same shapes; e4m3 rows the quantized ones)"
    return BenchRun(text, report.as_dict())


__all__ = ["bench_specs", "check_options", "run_fp8_bench"]
