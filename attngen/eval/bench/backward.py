"""`attngen bench` on backward specs (backward: dq_atomic, wgmma_dq_red): the spec's backward call beside SDPA's
flash and cuDNN backward, on the same inputs.

Method: attngen bench's (eval/bench/): CUDA events around calls queued behind a GPU sleep, the
median; input sets rotated so that a call never finds its tensors in L2; beside it the eager time,
back-to-back calls as a user makes them (each allocating its gradients), host included. An input set
is q, k, v and dout (standard normal) with the forward's o and lse from attngen.attention (the
dispatch table's forward spec on this GPU). The spec's call is `kernel(q, k, v, o, lse, dout,
causal=...)` -> (dq, dk, dv): its preprocess, main and convert launches. SDPA's is
torch.autograd.grad of its output under sdpa_kernel([backend]), its forward run once per input set
(the graph kept). Before timing, the spec's gradients on the first heads of batch 0 are checked
against fp32 gradients under the verifier's rule (eval/verify/backward.py); a spec that fails is not timed
on that case. FLOPs = 2.5 x the forward's 4 B H S^2 D (halved for causal): the backward's five
products against the forward's two.
"""
from __future__ import annotations

from dataclasses import dataclass

from .chart import plot, pyplot
from .report import BenchReport, BenchRun, Case, CaseResult, Timing, format_bench, parse_shape
from .shared import CHECK_HEADS, environment, input_sets, time_timing
from ..verify.backward import attention_gradients, judge_gradients
from ..verify.cases import CaseResult as Checked, exact_fp32_matmul

DEFAULT_SHAPES = ((4, 16, 2048), (1, 16, 8192))   # B, H, S; D is each spec's head dim
SDPA_BACKWARD = ("flash", "cudnn")                 # the SDPA backends timed beside the specs
BACKWARD_FLOPS = 2.5                               # the backward's FLOPs over the forward's


@dataclass(frozen=True)
class BackwardCase(Case):
    """A bench case of the backward call (its report's cases carry "call": "backward")."""

    call: str = "backward"

    @property
    def flops(self) -> float:
        return BACKWARD_FLOPS * super().flops


def check_options(paths, plans, opts) -> list[str]:
    """Problems of `attngen bench`'s options with these backward specs (no GPU needed)."""
    from ...core.variants import MASKS
    problems = []
    taking = [p.spec.name for p in plans if p.score_variants or any(MASKS[m].takes_window for m in p.masks)]
    if taking:
        one = len(taking) == 1
        problems.append(f"{', '.join(taking)} {'takes' if one else 'take'} variant arguments (window=, softcap=, "
                        f"alibi_slopes=) that `attngen bench` does not pass to backward specs: `attngen verify` "
                        f"checks {'it' if one else 'them'}; in the repository, "
                        f"`python3 docs/backward-h200/window_backward_bench.py OUT.json` times the window specs of "
                        f"both classes and `python3 docs/backward-h200/score_backward_bench.py OUT.json` the softcap "
                        f"and ALiBi ones")
    only = [p.spec.name for p in plans if not p.spec.padded]      # varlen: only, no padded function
    if opts.varlen or only:
        named = ", ".join(p.spec.name for p in plans) if opts.varlen else ", ".join(only) + ": varlen calls only"
        problems.append(f"{'--varlen: ' if opts.varlen else ''}`attngen bench` does not time the varlen backward "
                        f"({named}); time it with `python3 docs/backward-h200/varlen_backward_bench.py OUT.json` "
                        f"(in the repository)")
    return problems


def backward_cases(plans, shapes=(), dtypes=("fp16", "bf16"), causals=(False, True)):
    """({case: indices of the plans that time it}, notes on what is left out): each spec on the
    shapes (BxHxSxD; default DEFAULT_SHAPES at its head dim) of its head dim, in its own dtype, with
    the masks it has functions for."""
    cases, notes = {}, []
    for i, plan in enumerate(plans):
        name, dtype, d = plan.spec.name, plan.spec.dtype, plan.head_dim
        if dtype not in dtypes:
            notes.append(f"{name}: not timed, it is {dtype} (--dtype {', '.join(dtypes)})")
            continue
        others = [t for t in dtypes if t != dtype]
        if others:
            notes.append(f"{name}: {', '.join(others)} not timed (the spec is {dtype})")
        given = [parse_shape(s) if isinstance(s, str) else tuple(s) for s in shapes or ()]
        for shape in given or [s + (d,) for s in DEFAULT_SHAPES]:
            if shape[3:] != (d,) * len(shape[3:]):   # D (and Dv where given) must be the spec's head dim
                notes.append(f"{name}: {'x'.join(map(str, shape))} skipped (the spec's head dim is {d}, for q, k "
                             f"and v alike)")
                continue
            for causal in causals:
                if ("causal" if causal else "none") in plan.masks:
                    cases.setdefault(BackwardCase(*shape[:4], dtype, causal), []).append(i)
    return cases, notes


def gradient_inputs(torch, case: Case, device, generator) -> tuple[list[tuple], str | None]:
    """([(q, k, v, o, lse, dout)], problem): bench's input_sets (rotated past L2) with dout standard
    normal, and o and lse from attngen's forward (the dispatch table's spec for this GPU). Where no
    forward spec serves the case, o and lse are None and the problem says why (else None)."""
    from ... import ops
    sets = [s + (torch.randn(s[0].shape, generator=generator, device=device, dtype=torch.float32).to(s[0].dtype),)
            for s in input_sets(torch, case, device, generator)]
    try:
        forward = [ops.attention(q, k, v, causal=case.causal, return_lse=True) for q, k, v, _ in sets]
    except LookupError as exc:
        return [(q, k, v, None, None, dout) for q, k, v, dout in sets], f"no forward for o and lse: {exc}"
    return [(q, k, v, o, lse, dout) for (q, k, v, dout), (o, lse) in zip(sets, forward)], None


def check_gradients(torch, kernel, q, k, v, o, lse, dout, causal: bool) -> tuple[bool, str]:
    """The backward verifier's rule on the first heads of batch 0 of the bench inputs: dq, dk and
    dv against fp32 gradients, each error within 2x torch's own in the inputs' dtype."""
    from ...runtime import default_scale
    grads = kernel(q, k, v, o, lse, dout, causal=causal)
    h = min(CHECK_HEADS, q.shape[1])
    qs, ks, vs, ds = (t[:1, :h] for t in (q, k, v, dout))
    call = dict(scale=default_scale(q.shape[-1]), mask="causal" if causal else "none", alignment=None)
    with exact_fp32_matmul(torch):
        ref = attention_gradients(qs.float(), ks.float(), vs.float(), ds.float(), **call)
    low = attention_gradients(qs, ks, vs, ds, **call)
    checked = Checked(kernel.name, "", call["mask"], None, passed=False)
    judge_gradients(torch, checked, [g[:1, :h] for g in grads], ref[2:], low[2:], kernel.plan.spec.dtype)
    if not checked.passed:
        return False, "; ".join(checked.problems)
    return True, f"max err {checked.max_err:.3g} vs bound {checked.bound:.3g}"


def backward_call(torch, kernel, sets, causal: bool):
    """fn(q, k, v, o, lse, dout) for time_calls: the kernel's gradients into buffers preallocated
    per input set, so that the timed calls allocate only the kernel's own fp32 scratch."""
    grads = {id(s[0]): tuple(torch.empty_like(t) for t in s[:3]) for s in sets}

    def call(q, k, v, o, lse, dout):
        dq, dk, dv = grads[id(q)]
        kernel(q, k, v, o, lse, dout, causal=causal, dq=dq, dk=dk, dv=dv)
    return call


def sdpa_sets(torch, backend: str, sets, causal: bool) -> list[tuple]:
    """(out, q, k, v, dout) per input set: SDPA's forward under one backend on leaves sharing the
    set's q, k, v, its graph kept for the timed backward calls."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    which = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
    out = []
    for q, k, v, _o, _lse, dout in sets:
        leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
        with torch.enable_grad(), sdpa_kernel([which]):
            o = F.scaled_dot_product_attention(*leaves, is_causal=causal)
        out.append((o, *leaves, dout))
    return out


def sdpa_backward(torch, out, q, k, v, dout):
    return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)


def run_backward_bench(spec_paths, *, shapes=(), dtypes=("fp16", "bf16"), causals=(False, True),
                       backends=SDPA_BACKWARD, reps: int = 30, seed: int = 0, on_step=None, on_compile=None) -> dict:
    """Time every backward spec on every case it takes (backward_cases), after checking its
    gradients there, and each SDPA backend's backward on the same inputs: the report as a dict."""
    from ...runtime import gpu_modules, load
    torch = gpu_modules()[0]
    device = torch.device("cuda", torch.cuda.current_device())
    kernels = [load(p, on_compile=on_compile) for p in spec_paths]
    cases, notes = backward_cases([k.plan for k in kernels], shapes, dtypes, causals)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    results = []

    def done(res, t):
        res.timings.append(t)
        if on_step:
            on_step(res.case, t)

    for case, which in cases.items():
        res = CaseResult(case)
        sets, missing = gradient_inputs(torch, case, device, gen)
        for kernel in (kernels[i] for i in which):
            t = Timing(kernel.plan.spec.name)
            if missing:
                t.status, t.note = "error", missing.splitlines()[0][:120]
            else:
                ok, t.note = check_gradients(torch, kernel, *sets[0], case.causal)
                if not ok:
                    t.status = "wrong"
                else:
                    time_timing(torch, t, case, backward_call(torch, kernel, sets, case.causal), sets, reps=reps,
                                eager=lambda q, k, v, o, lse, dout, kernel=kernel: kernel(q, k, v, o, lse, dout,
                                                                                          causal=case.causal))
            done(res, t)
        for backend in backends:
            t = Timing(f"sdpa:{backend}")
            try:
                graphs = sdpa_sets(torch, backend, sets, case.causal)
                sdpa_backward(torch, *graphs[0])
                torch.cuda.synchronize()
            except (RuntimeError, ValueError) as exc:
                t.status, t.note = "unsupported", str(exc).splitlines()[0][:120]
            else:
                time_timing(torch, t, case, lambda *g: sdpa_backward(torch, *g), graphs, reps=reps)
            graphs = None
            done(res, t)
        sets = None
        torch.cuda.empty_cache()
        results.append(res)
    report = BenchReport(torch.cuda.get_device_name(device), environment(torch), results).as_dict()
    return {**report, "call": "backward", "notes": notes}


def total_steps(plans, opts, backends) -> int:
    cases, _ = backward_cases(plans, opts.shapes, opts.dtypes, opts.causals)
    return sum(len(which) + len(backends) for which in cases.values())


def format_backward(report: dict) -> str:
    """bench's table of a backward report (a dict, as --json writes it): per case and implementation
    the GPU and eager times, TFLOP/s and the ratios against each SDPA backend timed, then the notes."""
    backends = []
    for r in report["results"]:
        backends += [t["impl"][5:] for t in r["timings"] if t["impl"].startswith("sdpa:")
                     and t["impl"][5:] not in backends]
    lines = ["backward: dq, dk, dv of the spec's call (preprocess, main, convert) given q, k, v, dout and attngen's "
             "forward o and lse;",
             f"sdpa:<backend>: torch.autograd.grad of SDPA's output; TFLOP/s: {BACKWARD_FLOPS:g} x the forward's "
             f"4 B H S^2 D (halved for causal)",
             format_bench(BenchReport.from_dict(report, BackwardCase), backends)]
    if report.get("notes"):
        lines += ["", "not timed:"] + [f"  {n}" for n in report["notes"]]
    return "\n".join(lines)


def bench_specs(paths, plans, opts, progress, on_compile):
    """`attngen bench` on backward specs: the padded shapes (opts.shapes, default DEFAULT_SHAPES at
    each spec's head dim) beside SDPA's flash and cuDNN backward; --plot draws their TFLOP/s."""
    from ...runtime import gpu_modules
    if opts.plot_file:
        pyplot()   # no matplotlib: say so (exit 3) before the run, not after it
    gpu_modules()  # no GPU, torch or CUDA driver: say so (exit 4) before any progress is drawn
    backends = tuple(b for b in opts.backends if b in SDPA_BACKWARD)
    with progress("bench backward", total_steps(plans, opts, backends)) as bar:
        def step(case, timing):
            bar.label = f"{case.label} {timing.impl}"
            bar.update(1)
        report = run_backward_bench(paths, shapes=opts.shapes, dtypes=opts.dtypes, causals=opts.causals,
                                    backends=backends, reps=opts.reps, on_step=step, on_compile=on_compile)
    written = ()
    if opts.plot_file:
        plot(BenchReport.from_dict(report, BackwardCase), opts.plot_file, call="backward")
        written = (opts.plot_file,)
    return BenchRun(format_backward(report), report, written)


__all__ = ["BackwardCase", "DEFAULT_SHAPES", "SDPA_BACKWARD", "backward_cases", "bench_specs", "check_gradients",
           "check_options", "format_backward", "run_backward_bench"]
