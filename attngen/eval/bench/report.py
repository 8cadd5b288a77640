"""What every call's `attngen bench` reports: its cases, each implementation's timing on them, the
report (ratios against SDPA's backends, geometric means, JSON) and its table."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field


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
    # the GPU alone with the calls back to back (no event between two): what a loop of calls gets, a kernel
    # launched as a programmatic dependent starting before the one ahead has ended (median_us cannot show that)
    back_to_back_us: float | None = None


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

    def ratios(self, impl: str, backend: str, timing: str = "median_us") -> list[float]:
        """impl's speed over the backend's (time_backend / time_impl) on every case both ran; timing: the
        Timing field compared (median_us: per call; back_to_back_us: the calls back to back)."""
        out = []
        for r in self.results:
            a, b = r.get(impl), r.get(f"sdpa:{backend}")
            if a and b and a.status == "ok" and b.status == "ok" and getattr(a, timing) and getattr(b, timing):
                out.append(getattr(b, timing) / getattr(a, timing))
        return out

    def geomean(self, impl: str, backend: str, timing: str = "median_us") -> float | None:
        rs = self.ratios(impl, backend, timing)
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


def format_bench(report, backends) -> str:
    """The bench table: one row per case and implementation (GPU time per call; the GPU time of calls back
    to back; eager time: back to back calls with the host included), ratios of GPU time per call against
    each SDPA backend."""
    lines = [f"GPU: {report.gpu}; torch {report.environment['torch']}, CUDA {report.environment['cuda']}, "
             f"driver {report.environment['driver']}",
             "(time: GPU per call, an event on each side; b2b: GPU per call with the calls back to back, as a model's "
             "loop runs them; eager: back to back, host included; ratios compare time)",
             f"{'case':<30} {'impl':<24} {'time us':>9} {'b2b us':>9} {'eager us':>9} {'TFLOP/s':>8} {'spread':>6}  "
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
            eager, b2b = (f"{us:>9.1f}" if us is not None else f"{'-':>9}" for us in (t.eager_us, t.back_to_back_us))
            lines.append(f"{r.case.label:<30} {t.impl:<24} {t.median_us:>9.1f} {b2b} {eager} {t.tflops:>8.1f} "
                         f"{t.spread_pct:>5.1f}%  " + " ".join(ratios))
    lines.append("")
    lines.append("geometric-mean speed ratio (SDPA time / spec time) per spec, per call and back to back (b2b):")
    for impl in report.impls():
        parts = []
        for b in backends:
            g, g2 = (report.geomean(impl, b, timing) for timing in ("median_us", "back_to_back_us"))
            parts.append(f"{b} {g:.2f}" if g else f"{b} -")
            parts[-1] += f" (b2b {g2:.2f})" if g2 else ""
        lines.append(f"  {impl:<24} " + ", ".join(parts))
    return "\n".join(lines)


__all__ = ["BenchReport", "BenchRun", "Case", "CaseResult", "Timing", "format_bench", "parse_shape"]
