"""Merge timing: each merge spec of a listed dtype on a few cells (batch x heads x seqlen, parts), beside
the same merge written in torch (logsumexp, exp, a weighted sum), with the bytes it must move (every part
and LSE read once, the output and its LSE written once) as GB/s."""
from __future__ import annotations

from dataclasses import dataclass

from .report import BenchRun
from .timing import time_calls


@dataclass(frozen=True)
class MergeCell:
    batch: int
    heads: int
    seqlen: int
    parts: int

    @property
    def label(self) -> str:
        return f"B{self.batch} H{self.heads} S{self.seqlen} parts{self.parts}"


# Ring attention's merges: two parts (a step into the running result) and four, at prefill lengths.
CELLS = (MergeCell(1, 32, 8192, 2), MergeCell(4, 32, 4096, 2), MergeCell(4, 32, 4096, 4), MergeCell(1, 32, 32768, 8))


def torch_merge(torch, outs, lses):
    """The merge in plain torch (bhsd parts), as a user without the kernel writes it."""
    stacked = torch.stack(lses)
    lse = torch.logsumexp(stacked, dim=0)
    weight = torch.exp(stacked - lse[None]).nan_to_num(0.0)
    out = sum(w[..., None] * o.float() for w, o in zip(weight, outs)).to(outs[0].dtype)
    return out, lse


def bench_cell(torch, kernel, cell: MergeCell, reps: int) -> dict:
    g = torch.Generator(device=kernel.device).manual_seed(0)
    shape = (cell.batch, cell.heads, cell.seqlen, kernel.plan.head_dim)
    outs = [torch.randn(shape, generator=g, device=kernel.device).to(kernel.dtype) for _ in range(cell.parts)]
    lses = [torch.randn(shape[:3], generator=g, device=kernel.device) for _ in range(cell.parts)]
    ours = time_calls(torch, lambda: kernel(outs, lses), [()], reps=reps)[0]
    theirs = time_calls(torch, lambda: torch_merge(torch, outs, lses), [()], reps=reps)[0]
    moved = (cell.parts + 1) * (outs[0].numel() * outs[0].element_size() + lses[0].numel() * 4)
    return {"cell": cell.label, "attngen_us": ours, "torch_us": theirs, "gbps": moved / (ours * 1e-6) / 1e9,
            "speedup": theirs / ours}


def check_options(paths, plans, opts) -> list[str]:
    """No option of `attngen bench` is a merge's own; none is refused."""
    return []


def bench_specs(paths, plans, opts, progress, on_compile):
    """`attngen bench` on merge specs: every cell of CELLS beside the torch merge; None under --varlen."""
    from ...runtime import gpu_modules, load
    if opts.varlen:
        return None
    torch = gpu_modules()[0]
    rows = []
    with progress("bench merge", len(paths) * len(CELLS)) as bar:
        for path in paths:
            kernel = load(path, on_compile=on_compile)
            if kernel.plan.spec.dtype not in opts.dtypes:
                bar.update(len(CELLS))
                continue
            for cell in CELLS:
                r = bench_cell(torch, kernel, cell, opts.reps)
                r.update(spec=kernel.name, dtype=kernel.plan.spec.dtype, head_dim=kernel.plan.head_dim)
                rows.append(r)
                bar.label = f"{kernel.name} {cell.label}"
                bar.update(1)
    lines = [f"GPU: {torch.cuda.get_device_name(0)}; bytes = every part and LSE read, the output and LSE written",
             f"{'cell':<28} {'spec':<24} {'us':>9} {'GB/s':>7} {'torch us':>9} {'speedup':>8}"]
    lines += [f"{r['cell']:<28} {r['spec']:<24} {r['attngen_us']:>9.1f} {r['gbps']:>7.0f} {r['torch_us']:>9.1f} "
              f"{r['speedup']:>8.2f}" for r in rows]
    return BenchRun("\n".join(lines), {"gpu": torch.cuda.get_device_name(0), "rows": rows})


__all__ = ["CELLS", "MergeCell", "bench_specs", "check_options", "torch_merge"]
