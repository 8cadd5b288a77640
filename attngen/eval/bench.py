"""`attngen bench`: time generated kernels beside torch SDPA's backends, on the same inputs.

Method: CUDA events around every call, a warm-up first, the median of many calls; inputs rotate
over enough buffer sets that a call never finds its q, k, v in L2; a long GPU sleep is queued
before the timed calls so the host enqueues them all while the GPU waits, and launch overhead on
the host never shows as GPU time. Beside it, the eager time: the same calls back to back as a user
makes them (each allocating its output), host included, wall clock from the first call to the end
of the last, over the number of calls: what an eager model feels when the host is the bottleneck.
FLOPs = 4 B H Sq Sk D, halved for causal. A kernel is timed on a
shape only after its output on that shape's inputs passed the verifier's error rule.
"""
from __future__ import annotations

import io
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import fsutil
from ..errors import ToolError
from .timing import time_calls, time_eager

DEFAULT_SHAPES = ((1, 8, 512, 64), (4, 16, 2048, 64), (4, 16, 2048, 128), (2, 16, 8192, 64), (2, 16, 8192, 128))
SDPA_BACKENDS = ("flash", "cudnn", "efficient", "default")
DTYPES = {"fp16": "float16", "bf16": "bfloat16"}
CHECK_HEADS = 2          # heads of batch 0 compared with the fp32 reference before timing
CAUSAL_CHOICES = {"both": (False, True), "yes": (True,), "no": (False,)}   # --causal -> mask variants timed
PLOT_FORMATS = ("png", "svg", "pdf")   # --plot file suffixes


@dataclass(frozen=True)
class BenchRun:
    """What a convention's bench gives back: the table to print and the JSON report."""

    text: str
    report: dict
    written: tuple = ()                 # files it wrote itself (a plot)


@dataclass(frozen=True)
class Case:
    batch: int
    heads: int
    seqlen: int
    head_dim: int
    dtype: str
    causal: bool
    head_dim_v: int = 0        # V's head dim where it differs (shape BxHxSxDxDv); 0: head_dim

    @property
    def v_dim(self) -> int:
        return self.head_dim_v or self.head_dim

    @property
    def shape_text(self) -> str:
        return (f"{self.batch}x{self.heads}x{self.seqlen}x{self.head_dim}"
                + (f"x{self.head_dim_v}" if self.head_dim_v else ""))

    @property
    def label(self) -> str:
        return f"{self.shape_text} {self.dtype}{' causal' if self.causal else ''}"

    @property
    def flops(self) -> float:
        """2 B H S^2 (D + Dv): Q.K^T and P.V (4 B H S^2 D when V's head dim is D); halved for causal."""
        f = 2.0 * self.batch * self.heads * self.seqlen * self.seqlen * (self.head_dim + self.v_dim)
        return f / 2 if self.causal else f

    def tflops(self, median_us: float) -> float:
        return self.flops / (median_us * 1e-6) / 1e12


@dataclass
class Timing:
    impl: str                  # spec name, or sdpa:<backend>
    median_us: float | None = None
    tflops: float | None = None
    spread_pct: float | None = None   # (p90 - p10) / median of the calls
    status: str = "ok"         # ok | unsupported | failed-check | error
    note: str = ""
    eager_us: float | None = None     # back-to-back calls, host included (wall / calls)


@dataclass
class CaseResult:
    case: Case
    timings: list[Timing] = field(default_factory=list)

    def get(self, impl: str) -> Timing | None:
        for t in self.timings:
            if t.impl == impl:
                return t
        return None


@dataclass
class BenchReport:
    gpu: str
    environment: dict
    results: list[CaseResult]

    def ratios(self, impl: str, backend: str) -> list[float]:
        """impl's speed over the backend's (time_backend / time_impl) on every case both ran."""
        out = []
        for r in self.results:
            a, b = r.get(impl), r.get(f"sdpa:{backend}")
            if a and b and a.status == "ok" and b.status == "ok":
                out.append(b.median_us / a.median_us)
        return out

    def geomean(self, impl: str, backend: str) -> float | None:
        rs = self.ratios(impl, backend)
        return math.exp(sum(map(math.log, rs)) / len(rs)) if rs else None

    def impls(self) -> list[str]:
        seen = []
        for r in self.results:
            for t in r.timings:
                if not t.impl.startswith("sdpa:") and t.impl not in seen:
                    seen.append(t.impl)
        return seen

    @classmethod
    def from_dict(cls, d: dict, case_type: type = Case) -> "BenchReport":
        """Inverse of as_dict (e.g. to redraw a plot from a saved --json report); case_type: the
        report's Case class (a subclass with fields of its own, such as the backward bench's)."""
        results = [CaseResult(case_type(**r["case"]), [Timing(**t) for t in r["timings"]]) for r in d["results"]]
        return cls(d["gpu"], d["environment"], results)

    def as_dict(self) -> dict:
        return {"gpu": self.gpu, "environment": self.environment,
                "results": [{"case": asdict(r.case), "label": r.case.label, "flops": r.case.flops,
                             "timings": [asdict(t) for t in r.timings]} for r in self.results],
                "geomean_vs_flash": {i: self.geomean(i, "flash") for i in self.impls()}}


def parse_shape(text: str) -> tuple[int, ...]:
    """(B, H, S, D) from BxHxSxD, or (B, H, S, D, Dv) from BxHxSxDxDv (V's head dim Dv differs)."""
    parts = text.lower().split("x")
    if len(parts) not in (4, 5) or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"shape {text!r} is not BxHxSxD or BxHxSxDxDv (e.g. 4x16x2048x64, 4x16x2048x192x128)")
    out = tuple(int(p) for p in parts)
    return out[:4] if len(out) == 5 and out[4] == out[3] else out


# -- timing --------------------------------------------------------------------------------------

def input_sets(torch, case: Case, device, generator) -> list[tuple]:
    """Enough (q, k, v) sets that cycling through them defeats L2 reuse (at least 2)."""
    dtype = getattr(torch, DTYPES[case.dtype])
    shape = (case.batch, case.heads, case.seqlen, case.head_dim)
    v_shape = shape[:3] + (case.v_dim,)
    set_bytes = (2 * math.prod(shape) + math.prod(v_shape)) * 2
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    free, _ = torch.cuda.mem_get_info(device)
    n = max(2, math.ceil(3 * l2 / set_bytes))
    n = max(1, min(n, int(0.5 * free // set_bytes), 16))
    return [tuple(torch.randn(s, generator=generator, device=device, dtype=torch.float32).to(dtype)
                  for s in (shape, shape, v_shape)) for _ in range(n)]


def time_timing(torch, t: Timing, case: Case, fn, sets, *, reps: int, eager=None) -> None:
    """Fill t's GPU time and spread (time_calls of fn), TFLOP/s of the case, and eager time
    (time_eager of `eager`, the call as a user makes it; default fn)."""
    t.median_us, t.spread_pct = time_calls(torch, fn, sets, reps=reps)
    t.tflops = case.tflops(t.median_us)
    t.eager_us = time_eager(torch, eager or fn, sets, reps=reps)


def kernel_call(torch, kernel, sets, causal: bool):
    """fn(q, k, v) for time_calls: runs `kernel` into an output buffer preallocated per input set,
    so the timed calls allocate nothing."""
    outs = [s[0].new_empty(s[0].shape[:-1] + s[2].shape[-1:]) for s in sets]   # q's shape, V's head dim
    index = {id(s[0]): i for i, s in enumerate(sets)}

    def call(q, k, v):
        kernel(q, k, v, causal=causal, out=outs[index[id(q)]])
    return call


def sdpa_callable(torch, backend: str, causal: bool):
    import torch.nn.functional as F
    if backend == "default":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    which = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
             "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]

    def run(q, k, v):
        with sdpa_kernel([which]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


def check_output(torch, kernel, q, k, v, causal: bool) -> tuple[bool, str]:
    """The verifier's rule on the first heads of batch 0 of the bench inputs."""
    from ..runtime import default_scale
    from .cases import error_bound, reference_errors
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
            and ("causal" if case.causal else "none") in plan.masks)


def run_bench(spec_paths, *, shapes=DEFAULT_SHAPES, dtypes=("fp16", "bf16"), causals=(False, True),
              backends=SDPA_BACKENDS, reps: int = 30, seed: int = 0, on_step=None, on_compile=None) -> BenchReport:
    """Time every spec on every case it supports, and each SDPA backend, on the same inputs."""
    from ..runtime import gpu_modules, load
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


def environment(torch) -> dict:
    import subprocess
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        driver = "unknown"
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "driver": driver}


def total_steps(spec_plans, shapes, dtypes, causals, backends) -> int:
    cases = cases_for(shapes, dtypes, causals)
    return sum(sum(supports(p, c) for p in spec_plans) + len(backends) for c in cases)


def pyplot():
    """matplotlib.pyplot drawing off-screen; a ToolError when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        raise ToolError("--plot needs matplotlib: python3 -m pip install -e '.[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_format(path: str | Path) -> str:
    """The image format a plot file's suffix asks for; a ValueError for one not in PLOT_FORMATS."""
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in PLOT_FORMATS:
        raise ValueError(f"{str(path)!r} does not end in {', '.join('.' + f for f in PLOT_FORMATS)}")
    return suffix


def plot_image(report: BenchReport, fmt: str = "png", call: str = "") -> bytes:
    """TFLOP/s per shape: each spec beside the SDPA backends, one panel per dtype x causal (call:
    named in each panel's title, e.g. "backward")."""
    plt = pyplot()
    panels = sorted({(r.case.dtype, r.case.causal) for r in report.results})
    fig, axes = plt.subplots(len(panels), 1, figsize=(12, 3.6 * len(panels)), squeeze=False)
    impls = report.impls() + [f"sdpa:{b}" for b in SDPA_BACKENDS]
    for ax, (dtype, causal) in zip(axes[:, 0], panels):
        rows = [r for r in report.results if r.case.dtype == dtype and r.case.causal == causal]
        labels = [r.case.shape_text for r in rows]
        shown = set()
        for x, r in enumerate(rows):
            # each shape's bars centred on its slot: only the implementations that ran it (a spec of
            # one head dim leaves the other's shapes empty)
            ran = [i for i in impls if r.get(i) and r.get(i).status == "ok"]
            width = 0.8 / max(1, len(ran))
            for j, impl in enumerate(ran):
                # one fixed color per implementation across panels; SDPA backends hatched
                ax.bar(x - 0.4 + (j + 0.5) * width, r.get(impl).tflops, width,
                       label=None if impl in shown else impl, color=plt.cm.tab20(impls.index(impl) % 20),
                       hatch="//" if impl.startswith("sdpa:") else None, edgecolor="black", linewidth=0.3)
                shown.add(impl)
        ax.set_xticks(range(len(rows)), labels, rotation=20, ha="right", fontsize=8)
        ax.set_ylabel("TFLOP/s")
        ax.set_title(f"{call + ', ' if call else ''}{dtype}, {'causal' if causal else 'non-causal'} - {report.gpu}")
        ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format=fmt, dpi=110)
    finally:
        plt.close(fig)
    return buf.getvalue()


def plot(report: BenchReport, path: str | Path, call: str = "") -> None:
    """Draw the plot into `path` atomically (its suffix picks the format); a failed write is a
    WriteError and leaves any previous file as it was."""
    fsutil.atomic_write_bytes(path, plot_image(report, plot_format(path), call))


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
    return []


def bench_specs(paths, plans, opts, progress, on_compile):
    """`attngen bench` on specs of the forward convention: the padded shapes beside SDPA's backends,
    or with opts.varlen the varlen call beside torch's varlen flash path."""
    from ..runtime import gpu_modules
    if opts.varlen:
        from . import varlen_bench as VB
        gpu_modules()  # no GPU, torch or CUDA driver: say so (exit 4) before any progress is drawn
        with progress("bench varlen", len(paths) * len(opts.causals)) as bar:
            def step(r):
                bar.label = f"{r['spec']} {'causal' if r['causal'] else 'none'}"
                bar.update(1)
            report = VB.run_varlen_bench(paths, lengths=opts.lengths or VB.MIXED_LENGTHS, heads=opts.heads,
                                         dtypes=opts.dtypes, causals=opts.causals, reps=opts.reps, on_step=step,
                                         on_compile=on_compile)
        return BenchRun(VB.format_varlen(report), report)
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


def format_bench(report, backends) -> str:
    """The bench table: one row per case and implementation (GPU time, and eager time: back to
    back calls with the host included), ratios of GPU time against each SDPA backend."""
    lines = [f"GPU: {report.gpu}; torch {report.environment['torch']}, CUDA {report.environment['cuda']}, "
             f"driver {report.environment['driver']}",
             f"{'case':<30} {'impl':<24} {'time us':>9} {'eager us':>9} {'TFLOP/s':>8} {'spread':>6}  "
             + " ".join(f"{'/' + b:>9}" for b in backends)]
    for r in report.results:
        for t in r.timings:
            if t.status != "ok":
                lines.append(f"{r.case.label:<30} {t.impl:<24} {t.status:>9}  {t.note[:70]}")
                continue
            ratios = []
            for b in backends:
                ref = r.get(f"sdpa:{b}")
                ok = ref is not None and ref.status == "ok" and not t.impl.startswith("sdpa:")
                ratios.append(f"{ref.median_us / t.median_us:>9.2f}" if ok else f"{'':>9}")
            eager = f"{t.eager_us:>9.1f}" if t.eager_us is not None else f"{'-':>9}"
            lines.append(f"{r.case.label:<30} {t.impl:<24} {t.median_us:>9.1f} {eager} {t.tflops:>8.1f} "
                         f"{t.spread_pct:>5.1f}%  " + " ".join(ratios))
    lines.append("")
    lines.append("geometric-mean speed ratio (SDPA time / spec time) per spec:")
    for impl in report.impls():
        parts = []
        for b in backends:
            g = report.geomean(impl, b)
            parts.append(f"{b} {g:.2f}" if g else f"{b} -")
        lines.append(f"  {impl:<24} " + ", ".join(parts))
    return "\n".join(lines)
