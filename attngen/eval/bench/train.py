"""`attngen bench --train`: a training step's attention, forward and backward, through attngen.attention
(the dispatch table's forward and backward specs on this GPU, as a model calls it) beside SDPA's cuDNN
and flash (FlashAttention-2) backends, in one process, over a grid of cells: head dims 64, 128 and
256; 512 to 16k keys (16k tokens per batch); GQA groups 1, 4 and 8; causal and full.

One step is `o = attention(q, k, v, causal)` then `torch.autograd.grad(o, (q, k, v), dout)`. GQA runs
through each peer's own GQA path (SDPA's enable_gqa), so every step includes the sum of dK and dV over
a group; a backend that refuses the call is recorded with its reason, not timed.

Checked first, per cell: attngen's output and gradients against an fp32 reference (SDPA's
memory-efficient backend in fp32, or its math backend where that refuses the head dim; K and V
repeated to the query heads), each within twice the error
of torch's own step in the inputs' dtype (the first peer that runs), plus the verifier's floor; a cell
that fails is reported and not timed.

Timed (eval/bench/timing.py): GPU time, CUDA events around calls queued behind a GPU sleep (the host
hidden), the implementations alternating over `rounds` rounds so that drift in the GPU's clocks
reaches all alike, each cell's figure the median of its rounds; eager, back-to-back steps with the
host included. TFLOP/s counts 3.5 x the forward's 4 B Hq S^2 D (halved for causal).
"""
from __future__ import annotations

import statistics
from typing import NamedTuple

from .timing import time_back_to_back, time_calls, time_eager
from ..verify.cases import error_bound

GRID_HEAD_DIMS = (64, 128, 256)
GRID_SEQLENS = (512, 2048, 8192, 16384)
GRID_TOKENS = 16384                 # batch x seqlen of every grid cell
GRID_HEADS = 16                     # query heads
GRID_GROUPS = (1, 4, 8)             # query heads per KV head
TRAIN_FLOPS = 3.5                   # forward (2 products) + backward (5), over the forward's 2
PEERS = ("cudnn", "flash")          # SDPA backends timed beside attngen


class TrainCell(NamedTuple):
    batch: int
    heads: int
    kv_heads: int
    seqlen: int
    head_dim: int

    @property
    def label(self) -> str:
        heads = f"{self.heads}" if self.heads == self.kv_heads else f"{self.heads}/{self.kv_heads}"
        return f"{self.batch}x{heads}x{self.seqlen}x{self.head_dim}"

    def flops(self, causal: bool) -> float:
        return TRAIN_FLOPS * 4 * self.batch * self.heads * self.seqlen ** 2 * self.head_dim / (2 if causal else 1)


def grid_cells(head_dims=GRID_HEAD_DIMS, seqlens=GRID_SEQLENS, groups=GRID_GROUPS) -> tuple[TrainCell, ...]:
    """The default grid: every head dim x seqlen x group, GRID_TOKENS tokens and GRID_HEADS query heads."""
    return tuple(TrainCell(max(1, GRID_TOKENS // s), GRID_HEADS, GRID_HEADS // g, s, d)
                 for d in head_dims for s in seqlens for g in groups)


def parse_train_cell(text: str) -> TrainCell:
    """'4x32/8x2048x128' (B x Hq/Hkv x S x D) or '4x16x2048x64' (Hkv = Hq) -> TrainCell; ValueError
    saying what is wrong."""
    parts = text.strip().lower().split("x")
    what = f"{text.strip()!r} is not BxHq/HkvxSxD (e.g. 4x32/8x2048x128, or 4x16x2048x64 without GQA)"
    if len(parts) != 4:
        raise ValueError(what)
    hq, _, hkv = parts[1].partition("/")
    try:
        b, hq_n, s, d = int(parts[0]), int(hq), int(parts[2]), int(parts[3])
        hkv_n = int(hkv) if hkv else hq_n
    except ValueError:
        raise ValueError(what) from None
    if min(b, hq_n, hkv_n, s, d) < 1:
        raise ValueError(f"{text.strip()!r}: every size must be at least 1")
    if hq_n % hkv_n:
        raise ValueError(f"{text.strip()!r}: the query heads ({hq_n}) must be a multiple of the KV heads ({hkv_n})")
    return TrainCell(b, hq_n, hkv_n, s, d)


def _step(torch, attention, q, k, v, dout, causal: bool):
    def run():
        o = attention(q, k, v, causal)
        return (o, *torch.autograd.grad(o, (q, k, v), dout))
    return run


def _sdpa(torch, backend):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    chosen = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
              "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]

    def attention(q, k, v, causal):
        with sdpa_kernel([chosen]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
    return attention


def _reference(torch, q, k, v, dout, causal: bool):
    """(o, dq, dk, dv) in fp32 through SDPA's memory-efficient backend, K and V repeated to Hq heads
    (their gradients summed back over each group)."""
    group = q.shape[1] // k.shape[1]
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    kr, vr = (t.repeat_interleave(group, dim=1) for t in leaves[1:])
    try:
        o = _sdpa(torch, "efficient")(leaves[0], kr, vr, causal)
    except RuntimeError:    # a head dim its fp32 kernels do not take: the written-out attention, in fp32
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel([SDPBackend.MATH]):
            o = F.scaled_dot_product_attention(leaves[0], kr, vr, is_causal=causal)
    grads = torch.autograd.grad(o, leaves, dout.float())
    return (o.detach(), *grads)


def bench_cell(torch, attngen, cell: TrainCell, dtype, causal: bool, *, reps: int, rounds: int) -> dict:
    """One cell: checked against fp32, then timed beside the SDPA peers that run it."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    b, hq, hkv, s, d = cell

    def randn(heads):
        return torch.randn((b, heads, s, d), generator=gen, device="cuda").to(dtype)
    q, k, v = (randn(h).requires_grad_() for h in (hq, hkv, hkv))
    dout = randn(hq)
    row = {"cell": cell.label, "dtype": str(dtype).removeprefix("torch."), "causal": causal,
           "flops": cell.flops(causal)}
    steps = {"attngen": _step(torch, lambda q_, k_, v_, c: attngen.attention(q_, k_, v_, causal=c),
                              q, k, v, dout, causal)}
    peers_failed = {}
    for name in PEERS:
        fn = _step(torch, _sdpa(torch, name), q, k, v, dout, causal)
        try:
            fn()
            torch.cuda.synchronize()
            steps[f"sdpa:{name}"] = fn
        except RuntimeError as exc:
            peers_failed[f"sdpa:{name}"] = (str(exc).strip().splitlines() or ["refused"])[0][:200]
    row["refused"] = peers_failed
    try:
        ours = [t.float() for t in steps["attngen"]()]
    except (LookupError, NotImplementedError, ValueError) as exc:
        row["status"] = f"not served: {str(exc).splitlines()[0][:200]}"
        return row
    ref = _reference(torch, q, k, v, dout, causal)
    low_name = next((n for n in steps if n != "attngen"), None)
    low = [t.float() for t in steps[low_name]()] if low_name else None    # torch's own step: its error sets the bound
    errors = {}
    for i, name in enumerate(("out", "dq", "dk", "dv")):
        err = (ours[i] - ref[i]).abs().max().item()
        bound = error_bound((low[i] - ref[i]).abs().max().item()) if low else None
        errors[name] = {"err": err, "bound": bound}
    row["bound_from"] = low_name
    del ours, ref, low
    row["errors"] = errors
    if any(e["bound"] is not None and not e["err"] <= e["bound"] for e in errors.values()):
        row["status"] = "wrong: " + ", ".join(f"{n} {e['err']:.3g} > {e['bound']:.3g}" for n, e in errors.items()
                                              if e["bound"] is not None and not e["err"] <= e["bound"])
        return row
    each = {name: [] for name in steps}
    b2b = {name: [] for name in steps}      # the steps back to back: as a training loop runs them
    for _ in range(rounds):
        for name, fn in steps.items():
            each[name].append(time_calls(torch, lambda fn=fn: fn(), [()], reps=reps)[0])
            b2b[name].append(time_back_to_back(torch, lambda fn=fn: fn(), [()], reps=reps))
    row["us"] = {name: statistics.median(t) for name, t in each.items()}
    row["rounds_us"] = each
    row["b2b_us"] = {name: statistics.median(t) for name, t in b2b.items()}
    row["rounds_b2b_us"] = b2b
    row["eager_us"] = {name: time_eager(torch, lambda fn=fn: fn(), [()], reps=max(5, reps // 2))
                       for name, fn in steps.items()}
    peers = {n: t for n, t in row["us"].items() if n != "attngen"}
    if peers:
        best = min(peers, key=peers.get)
        row.update(best_peer=best, ratio=peers[best] / row["us"]["attngen"])
        row["ratio_b2b"] = min(t for n, t in row["b2b_us"].items() if n != "attngen") / row["b2b_us"]["attngen"]
    row["tflops"] = row["flops"] / (row["us"]["attngen"] * 1e-6) / 1e12
    row["status"] = "ok"
    return row


def run_train_bench(cells, *, dtypes=("bf16",), causals=(False, True), reps: int = 30, rounds: int = 3,
                    on_step=None, on_partial=None) -> dict:
    """The grid's report. on_step(row) after each timing; on_partial(report) too, with the rows so far and
    "partial": the timings left (so a run stopped part-way still leaves what it measured)."""
    import attngen
    from ...runtime import gpu_modules
    torch = gpu_modules()[0]
    rows = []
    total = len(dtypes) * len(cells) * len(causals)
    report = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "call": "train_step",
              "rounds": rounds, "reps": reps, "rows": rows}
    for dtype_name in dtypes:
        dtype = torch.float16 if dtype_name == "fp16" else torch.bfloat16
        for cell in cells:
            for causal in causals:
                row = bench_cell(torch, attngen, cell, dtype, causal, reps=reps, rounds=rounds)
                rows.append(row)
                torch.cuda.empty_cache()
                if on_step:
                    on_step(row)
                if on_partial and len(rows) < total:
                    on_partial({**report, "partial": {"timings_left": total - len(rows)}})
    return report


def format_train(report: dict) -> str:
    lines = [f"GPU: {report['gpu']}; torch {report['torch']}; forward + backward through attngen.attention; "
             f"median of {report['rounds']} alternating rounds",
             f"{'cell':<20} {'dtype':<8} {'causal':>6} {'attngen us':>10} {'TFLOP/s':>8} {'cudnn us':>9} "
             f"{'flash us':>9} {'x best':>7} {'b2b us':>9} {'x b2b':>6} {'eager us':>9} {'cudnn eager':>11}",
             "(us: GPU time per step, steps queued behind a GPU sleep, an event on each side; b2b: GPU time per step "
             "with the steps back to back, as a training loop runs them; eager: back-to-back steps, host included; "
             "x best and x b2b: the fastest SDPA backend's time / attngen's)"]

    def num(x, w=9):
        return f"{x:>{w}.1f}" if x else f"{'-':>{w}}"
    for r in report["rows"]:
        head = f"{r['cell']:<20} {r['dtype']:<8} {str(r['causal']):>6}"
        if r["status"] != "ok":
            lines.append(f"{head} {r['status']}")
            continue
        us, eager = r["us"], r["eager_us"]
        ratio = f"{r['ratio']:>7.2f}" if r.get("ratio") else f"{'-':>7}"
        ratio_b2b = f"{r['ratio_b2b']:>6.2f}" if r.get("ratio_b2b") else f"{'-':>6}"
        lines.append(f"{head} {us['attngen']:>10.1f} {r['tflops']:>8.1f} {num(us.get('sdpa:cudnn'))} "
                     f"{num(us.get('sdpa:flash'))} {ratio} {num(r.get('b2b_us', {}).get('attngen'))} {ratio_b2b} "
                     f"{num(eager.get('attngen'))} {num(eager.get('sdpa:cudnn'), 11)}")
    ok = [r for r in report["rows"] if r["status"] == "ok" and r.get("ratio")]
    if ok:
        lines.append(f"{len(ok)} cells timed; " + ratio_summary(ok, "ratio"))
        b2b = [r for r in ok if r.get("ratio_b2b")]
        if b2b:
            lines.append("back to back: " + ratio_summary(b2b, "ratio_b2b"))
    return "\n".join(lines)


def ratio_summary(rows, key: str) -> str:
    """The geometric mean of rows' `key` ratio (the fastest SDPA backend's time / attngen's) and the cells below 1.0x."""
    import math
    geo = math.exp(sum(math.log(r[key]) for r in rows) / len(rows))
    below = [f"{r['cell']} {'causal' if r['causal'] else 'full'} {r['dtype']} {r[key]:.2f}x" for r in rows if r[key] < 1.0]
    return (f"geometric mean {geo:.2f}x the fastest SDPA backend; "
            + (f"below 1.0x: {'; '.join(below)}" if below else "none below 1.0x"))


__all__ = ["GRID_GROUPS", "GRID_HEAD_DIMS", "GRID_SEQLENS", "TrainCell", "bench_cell", "format_train", "grid_cells",
           "parse_train_cell", "run_train_bench"]
