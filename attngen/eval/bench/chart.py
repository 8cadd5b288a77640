"""The chart of `attngen bench --plot`: TFLOP/s per shape, each spec beside SDPA's backends (matplotlib)."""
from __future__ import annotations

import io
from pathlib import Path

from ... import fsutil
from ...errors import ToolError
from .report import BenchReport
from .shared import SDPA_BACKENDS

PLOT_FORMATS = ("png", "svg", "pdf")   # --plot file suffixes


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


__all__ = ["PLOT_FORMATS", "plot", "plot_format", "plot_image", "pyplot"]
