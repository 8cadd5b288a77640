"""`attngen bench` on forward specs: each spec's padded call on (B, H, S, D) shapes beside torch
SDPA's backends, on the same inputs, or with --varlen its varlen call (varlen.py). FLOPs = 4 B H Sq Sk D,
halved for causal. A kernel is timed on a shape only after its output on that shape's inputs passed
the verifier's error rule."""
from __future__ import annotations

from . import varlen as varlen_bench
from .chart import plot, pyplot
from .report import BenchReport, BenchRun, Case, CaseResult, Timing, format_bench
from .shared import (CHECK_HEADS, DEFAULT_SHAPES, SDPA_BACKENDS, environment, input_sets, sdpa_callable,
                     time_timing)
from ..verify.cases import error_bound, reference_errors


def kernel_call(torch, kernel, sets, causal: bool):
    """fn(q, k, v) for time_calls: runs `kernel` into an output buffer preallocated per input set,
    so the timed calls allocate nothing."""
    outs = [s[0].new_empty(s[0].shape[:-1] + s[2].shape[-1:]) for s in sets]   # q's shape, V's head dim
    index = {id(s[0]): i for i, s in enumerate(sets)}

    def call(q, k, v):
        kernel(q, k, v, causal=causal, out=outs[index[id(q)]])
    return call


def check_output(torch, kernel, q, k, v, causal: bool) -> tuple[bool, str]:
    """The verifier's rule on the first heads of batch 0 of the bench inputs."""
    from ...runtime import default_scale
    scale = default_scale(q.shape[-1])
    out = kernel(q, k, v, causal=causal, scale=scale)
    h = min(CHECK_HEADS, q.shape[1])
    qs, ks, vs, os_ = (t[:1, :h] for t in (q, k, v, out))
    err, low, _ = reference_errors(torch, qs, ks, vs, os_, scale=scale, mask="causal" if causal else "none",
                                   alignment=None)
    bound = error_bound(low)
    ok = bool(torch.isfinite(out).all().item()) and err <= bound
    return ok, f"max err {err:.3g} vs bound {bound:.3g}"


def cases_for(shapes, dtypes, causals) -> list[Case]:
    return [Case(*shape[:4], dt, c, *shape[4:]) for shape in shapes for dt in dtypes for c in causals]


def supports(plan, case: Case) -> bool:
    """The spec (of the forward convention: eval.conventions hands this bench only those) runs the case."""
    return (plan.spec.dtype == case.dtype and plan.head_dim == case.head_dim and plan.v_dim == case.v_dim
            and ("causal" if case.causal else "none") in plan.entry_functions)


def run_bench(spec_paths, *, shapes=DEFAULT_SHAPES, dtypes=("fp16", "bf16"), causals=(False, True),
              backends=SDPA_BACKENDS, reps: int = 30, seed: int = 0, on_step=None, on_compile=None) -> BenchReport:
    """Time every spec on every case it supports, and each SDPA backend, on the same inputs."""
    from ...runtime import gpu_modules, load
    torch = gpu_modules()[0]
    device = torch.device("cuda", torch.cuda.current_device())
    kernels = [load(p, on_compile=on_compile) for p in spec_paths]
    cases = cases_for(shapes, dtypes, causals)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    results = []
    for case in cases:
        res = CaseResult(case)
        sets = input_sets(torch, case, device, gen)
        for kernel in kernels:
            if not supports(kernel.plan, case):
                continue
            t = Timing(kernel.plan.spec.name)
            ok, note = check_output(torch, kernel, *sets[0], case.causal)
            if not ok:
                t.status, t.note = "failed-check", note
            else:
                time_timing(torch, t, case, kernel_call(torch, kernel, sets, case.causal), sets, reps=reps,
                            eager=lambda q, k, v, kernel=kernel: kernel(q, k, v, causal=case.causal))
            res.timings.append(t)
            if on_step:
                on_step(case, t)
        for backend in backends:
            t = Timing(f"sdpa:{backend}")
            fn = sdpa_callable(torch, backend, case.causal)
            try:
                fn(*sets[0])
                torch.cuda.synchronize()
            except RuntimeError as exc:
                t.status, t.note = "unsupported", str(exc).splitlines()[0][:120]
            else:
                time_timing(torch, t, case, fn, sets, reps=reps)
            res.timings.append(t)
            if on_step:
                on_step(case, t)
        del sets
        torch.cuda.empty_cache()
        results.append(res)
    return BenchReport(torch.cuda.get_device_name(device), environment(torch), results)


def total_steps(spec_plans, shapes, dtypes, causals, backends) -> int:
    cases = cases_for(shapes, dtypes, causals)
    return sum(sum(supports(p, c) for p in spec_plans) + len(backends) for c in cases)


def check_options(paths, plans, opts) -> list[str]:
    """Problems of `attngen bench`'s options with these forward specs (no GPU needed)."""
    # Every call of a spec with score modifiers or an expression, and of one whose masks are only
    # variants (a window), takes arguments the bench's cases do not carry.
    taking = [p.spec.name for p in plans if p.score_variants or not {"none", "causal"} & set(p.masks)]
    if taking:
        return [f"{', '.join(taking)} {'takes' if len(taking) == 1 else 'take'} variant arguments (window=, softcap=, "
                f"alibi_slopes= or an expression's params=) that `attngen bench` does not pass yet: time "
                f"{'it' if len(taking) == 1 else 'them'} with "
                f"`python3 docs/variants-h200/variant_bench.py OUT.json window,scores,expr` (in the repository), "
                f"beside FA2 and FlexAttention"]
    if opts.varlen:
        plain = [p.spec.name for p in plans if not p.varlen]
        if plain:
            return [f"--varlen times the varlen call; {', '.join(plain)} {'has' if len(plain) == 1 else 'have'} "
                    f"none (give specs with varlen: true)"]
    else:
        only = [p.spec.name for p in plans if not p.spec.padded]
        if only:
            return [f"{', '.join(only)} {'serves' if len(only) == 1 else 'serve'} varlen calls only (varlen: only: no "
                    f"padded function): time {'it' if len(only) == 1 else 'them'} with --varlen"]
    return []


def bench_specs(paths, plans, opts, progress, on_compile):
    """`attngen bench` on specs of the forward convention: the padded shapes beside SDPA's backends,
    or with opts.varlen the varlen call beside torch's varlen flash path."""
    from ...runtime import gpu_modules
    if opts.varlen:
        return varlen_bench.bench_specs(paths, plans, opts, progress, on_compile)
    if opts.plot_file:
        pyplot()   # no matplotlib: say so (exit 3) before the run, not after it
    gpu_modules()  # no GPU, torch or CUDA driver: say so (exit 4) before any progress is drawn
    shapes = opts.shapes or DEFAULT_SHAPES
    steps = total_steps(plans, shapes, opts.dtypes, opts.causals, opts.backends)
    with progress("bench", steps) as bar:
        def step(case, timing):
            bar.label = f"{case.label} {timing.impl}"
            bar.update(1)
        report = run_bench(paths, shapes=shapes, dtypes=opts.dtypes, causals=opts.causals, backends=opts.backends,
                           reps=opts.reps, on_step=step, on_compile=on_compile)
    written = ()
    if opts.plot_file:
        plot(report, opts.plot_file)
        written = (opts.plot_file,)
    return BenchRun(format_bench(report, opts.backends), report.as_dict(), written)
