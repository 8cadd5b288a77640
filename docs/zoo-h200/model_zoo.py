"""The model zoo timed (attngen/eval/zoo.py, docs/model-zoo.md): every zoo cell through attngen's entry
point, checked against the written-out fp32 reference under the error rule, then timed beside torch's
peers for the same call in the same process, and a JSON report and a markdown table written.

    python3 docs/zoo-h200/model_zoo.py [--out OUT.json] [--md OUT.md] [--only LAYER,...] [--cells train,...]
                                       [--flex] [--reps 30]
    python3 docs/zoo-h200/model_zoo.py --warm-list   # the zoo's spec paths, for `attngen warm` (no GPU)

Timing: `attngen bench`'s (eval/bench/timing.py time_calls): CUDA events around each of `reps` calls
queued behind a GPU sleep, after 5 warm-up calls; the median, µs. The inputs are the cell's own (they
fit in L2 for the smaller cells, alike for every peer). A training step is forward plus backward
(torch.autograd.grad of the output at a fixed dout: no gradient accumulation), for attngen and every peer.

Torch's peers, each timed where it runs (a peer that raises is recorded with its error):
- train: SDPA on each backend (flash, cudnn, efficient, math, forced through sdpa_kernel; GQA by
  enable_gqa, or with K and V repeated beforehand where a backend takes no GQA; a window or ALiBi as an
  explicit attn_mask, bool or an additive bias), the written-out attention in the inputs' dtype
  (eager), and with --flex FlexAttention (torch.compile'd; block mask for causal and window, score_mod
  for softcap and ALiBi, sinks through its LSE: o * sigmoid(lse - sink)). Softcap and sinks leave SDPA out.
- varlen_prefill: torch's varlen flash forward (aten._flash_attention_forward with cu_seqlens, window and
  ALiBi slopes where the call has them), SDPA per sequence (default backend), eager per sequence.
- paged_decode: SDPA on each backend over the contiguous caches with a mask hiding the keys past each
  sequence's length and outside the window (torch has no paged attention; the contiguous caches are
  the same keys), SDPA per sequence on its own keys, eager per sequence.
The ratio is the best peer's time / attngen's (above 1: attngen faster).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from attngen.eval import zoo  # noqa: E402

BACKENDS = ("flash", "cudnn", "efficient", "math")


def warm_list() -> list[str]:
    from attngen.ops.dispatch import SPECS_DIR
    return [str(Path(SPECS_DIR) / f"{name}.yaml") for name in zoo.served_specs()]


# -- torch's peers -----------------------------------------------------------------------------------

def sdpa_mask(torch, layer, sq: int, sk: int, slopes, lengths=None, dtype=None):
    """SDPA's attn_mask for the layer's call, or None where is_causal says it all: a bool mask (True:
    visible) for a window or padded keys, an additive bias in `dtype` for ALiBi. Queries sit at the end
    of each sequence's keys (decode: lengths per batch row)."""
    if layer.window is None and slopes is None and lengths is None:
        return None
    dev = "cuda"
    if lengths is None:
        lens = torch.full((1,), sk, device=dev)
    else:
        lens = torch.tensor(lengths, device=dev)
    pos = torch.arange(sq, device=dev)[None, :, None] + (lens[:, None, None] - sq)   # (B, Sq, 1)
    key = torch.arange(sk, device=dev)[None, None, :]
    visible = key < lens[:, None, None]
    if layer.causal:
        visible = visible & (key <= pos)
    if layer.window is not None:
        visible = visible & (key >= pos - (layer.window - 1))
    visible = visible[:, None]                                                      # (B, 1, Sq, Sk)
    if slopes is None:
        return visible
    bias = -slopes.float().reshape(1, -1, 1, 1) * (pos - key).abs()[:, None].float()
    return bias.masked_fill(~visible, float("-inf")).to(dtype)


def sdpa_call(torch, layer, backend, q, k, v, mask, repeat: bool):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    which = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
             "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
    gqa = q.shape[1] != k.shape[1] and not repeat
    kwargs = dict(attn_mask=mask, is_causal=layer.causal and mask is None, scale=layer.softmax_scale)
    if gqa:
        kwargs["enable_gqa"] = True
    if backend is None:
        return F.scaled_dot_product_attention(q, k, v, **kwargs)
    with sdpa_kernel([which[backend]]):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)


def sdpa_expressible(layer) -> bool:
    return layer.softcap is None and not layer.sinks


def train_peers(torch, layer, t, flex: bool) -> dict:
    """{name: fn()} of torch's training steps for the cell's inputs."""
    dout, slopes = t["dout"], t.get("alibi_slopes")
    peers = {}

    def step(fn, xs):
        def run():
            o = fn(*xs)
            return torch.autograd.grad(o, xs, dout)
        return run

    base = [t[n].detach().clone().requires_grad_() for n in ("q", "k", "v")]
    if sdpa_expressible(layer):
        s = layer.seqlen
        mask = sdpa_mask(torch, layer, s, s, slopes, dtype=base[0].dtype)
        group = layer.heads // layer.kv_heads
        repeated = [base[0]] + [x.detach().repeat_interleave(group, dim=1).requires_grad_() for x in base[1:]]
        for backend in BACKENDS:
            peers[f"sdpa_{backend}"] = step(lambda q, k, v, b=backend: sdpa_call(torch, layer, b, q, k, v, mask, False),
                                            base)
            if group > 1:
                peers[f"sdpa_{backend}_kv_repeated"] = step(
                    lambda q, k, v, b=backend: sdpa_call(torch, layer, b, q, k, v, mask, True), repeated)
    sinks = t.get("sinks")
    eager_xs = base + ([sinks.detach().to(base[0].dtype).requires_grad_()] if layer.sinks else [])
    peers["eager"] = step(lambda *xs: zoo.reference_attention(torch, *xs[:3], layer, slopes,
                                                              xs[3] if layer.sinks else None), eager_xs)
    if flex:
        peers["flex"] = flex_step(torch, layer, t, base, sinks, dout)
    return peers


def flex_step(torch, layer, t, base, sinks, dout):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    torch._dynamo.reset()      # each layer compiles afresh: past dynamo's recompile limit a call runs flex eagerly
    compiled = torch.compile(flex_attention, dynamic=False)
    slopes, cap = t.get("alibi_slopes"), layer.softcap
    left = None if layer.window is None else layer.window - 1

    def mask_mod(b, h, q_idx, kv_idx):
        keep = kv_idx >= 0
        if layer.causal:
            keep = keep & (kv_idx <= q_idx)
        if left is not None:
            keep = keep & (kv_idx >= q_idx - left)
        return keep

    def score_mod(score, b, h, q_idx, kv_idx):
        if cap is not None:
            score = cap * torch.tanh(score / cap)
        if slopes is not None:
            score = score - slopes[h] * (q_idx - kv_idx).abs()
        return score

    s = layer.seqlen
    block = create_block_mask(mask_mod, None, None, s, s) if (layer.causal or left is not None) else None
    xs = base + ([sinks.detach().clone().requires_grad_()] if layer.sinks else [])

    def run():
        kw = dict(block_mask=block, scale=layer.softmax_scale, enable_gqa=layer.heads != layer.kv_heads)
        if cap is not None or slopes is not None:
            kw["score_mod"] = score_mod
        if layer.sinks:
            o, lse = compiled(*xs[:3], return_lse=True, **kw)
            o = o * torch.sigmoid(lse - xs[3].reshape(1, -1, 1))[..., None].to(o.dtype)
        else:
            o = compiled(*xs[:3], **kw)
        return torch.autograd.grad(o, xs, dout)
    return run


def varlen_peers(torch, layer, t, lengths) -> dict:
    q, k, v, cu = t["q"], t["k"], t["v"], t["cu_seqlens"]
    slopes, longest = t.get("alibi_slopes"), max(lengths)
    peers = {}
    seqs, at = [], 0
    for n in lengths:
        seqs.append(tuple(x[at:at + n].transpose(0, 1)[None] for x in (q, k, v)))
        at += n
    if sdpa_expressible(layer):
        kw = {"scale": layer.softmax_scale}
        if layer.window is not None:
            kw.update(window_size_left=layer.window - 1, window_size_right=0)
        if slopes is not None:
            kw["alibi_slopes"] = slopes

        def flash_varlen():
            return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, longest, longest, 0.0, layer.causal,
                                                           False, **kw)[0]
        peers["flash_varlen"] = flash_varlen
        masks = [sdpa_mask(torch, layer, n, n, slopes, dtype=q.dtype) for n in lengths]

        def sdpa_loop():
            return [sdpa_call(torch, layer, None, *s, m, False) for s, m in zip(seqs, masks)]
        peers["sdpa_per_sequence"] = sdpa_loop

    def eager_loop():
        return [zoo.reference_attention(torch, *s, layer, slopes, t.get("sinks")) for s in seqs]
    peers["eager_per_sequence"] = eager_loop
    return peers


def decode_peers(torch, layer, t, lengths) -> dict:
    q, kc, vc = t["q"], t["k_cache"], t["v_cache"]
    slopes = t.get("alibi_slopes")
    peers = {}
    if sdpa_expressible(layer):
        mask = sdpa_mask(torch, layer, 1, kc.shape[2], slopes, lengths=lengths, dtype=q.dtype)
        group = layer.heads // layer.kv_heads
        kr, vr = (x.repeat_interleave(group, dim=1) for x in (kc, vc))
        for backend in BACKENDS:
            peers[f"sdpa_{backend}_padded"] = lambda b=backend: sdpa_call(torch, layer, b, q, kc, vc, mask, False)
            if group > 1:
                peers[f"sdpa_{backend}_padded_kv_repeated"] = \
                    lambda b=backend: sdpa_call(torch, layer, b, q, kr, vr, mask, True)
        first = [0 if layer.window is None else max(0, n - layer.window) for n in lengths]
        seqs = [(q[i:i + 1], kc[i:i + 1, :, lo:n], vc[i:i + 1, :, lo:n])
                for i, (lo, n) in enumerate(zip(first, lengths))]
        masks = [None if slopes is None else sdpa_mask(torch, layer, 1, n - lo, slopes, dtype=q.dtype)
                 for lo, n in zip(first, lengths)]

        def sdpa_loop():
            return [sdpa_call(torch, layer, None, *s, m, False) for s, m in zip(seqs, masks)]
        peers["sdpa_per_sequence"] = sdpa_loop

    def eager_loop():
        return [zoo.reference_attention(torch, q[i:i + 1], kc[i:i + 1, :, :n], vc[i:i + 1, :, :n], layer, slopes,
                                        t.get("sinks")) for i, n in enumerate(lengths)]
    peers["eager_per_sequence"] = eager_loop
    return peers


# -- the run -----------------------------------------------------------------------------------------

def time_us(torch, fn, reps: int) -> float:
    from attngen.eval.bench.timing import time_calls
    return time_calls(torch, lambda: fn(), [()], reps=reps)[0]


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def run_one(torch, layer, cell, reps: int, flex: bool) -> dict:
    row = {"model": layer.model, "layer": layer.name, "config": layer.label, "cell": cell}
    prepared = zoo.prepare(torch, layer, cell)
    result = zoo.check(torch, prepared)
    row["status"] = result.status
    if result.status == "refused":
        row["message"] = result.message
        return row
    worst = result.worst
    row.update(passed=result.passed, outputs={o.name: {"err": o.err, "torch_err": o.low_err, "bound": o.bound}
                                              for o in result.outputs},
               worst_output=worst.name, max_err=worst.err, bound=worst.bound)
    row["attngen_us"] = time_us(torch, prepared.run, reps)
    if cell == "train":
        peers = train_peers(torch, layer, prepared.tensors, flex)
    elif cell == "varlen_prefill":
        peers = varlen_peers(torch, layer, prepared.tensors, prepared.extra["lengths"])
    else:
        peers = decode_peers(torch, layer, prepared.tensors, prepared.extra["lengths"])
    times, errors = {}, {}
    for name, fn in peers.items():
        try:
            fn()
            torch.cuda.synchronize()
            times[name] = time_us(torch, fn, reps)
        except Exception as exc:    # a backend that does not take the call: recorded, not timed
            errors[name] = first_line(exc)
            torch.cuda.synchronize()
    row["torch_us"], row["torch_errors"] = times, errors
    if times:
        best = min(times, key=times.get)
        row.update(best_torch=best, best_torch_us=times[best], ratio=times[best] / row["attngen_us"])
    return row


def markdown(rows) -> str:
    lines = ["| model | layer | cell | attngen | max err / bound | attngen µs | best torch | torch µs | ratio |",
             "|---|---|---|---|---|---:|---|---:|---:|"]
    for r in rows:
        if r["status"] == "refused":
            lines.append(f"| {r['model']} | {r['layer']} | {r['cell']} | refused | | | | | |")
            continue
        err = f"{r['max_err']:.2g} / {r['bound']:.2g} ({r['worst_output']})" + ("" if r["passed"] else " FAIL")
        best = r.get("best_torch", "none ran")
        torch_us = f"{r['best_torch_us']:.1f}" if "best_torch_us" in r else ""
        ratio = f"{r['ratio']:.2f}x" if "ratio" in r else ""
        lines.append(f"| {r['model']} | {r['layer']} | {r['cell']} | served | {err} | {r['attngen_us']:.1f} | {best} | "
                     f"{torch_us} | {ratio} |")
    served = [r for r in rows if r["status"] == "served"]
    ratios = [r["ratio"] for r in served if "ratio" in r]
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else float("nan")
    lines.append("")
    lines.append(f"{len(served)} of {len(rows)} cells served, {sum(r['passed'] for r in served)} within the error "
                 f"rule; geometric mean of the ratios {geo:.2f}x")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/zoo-h200/zoo_h200.json", help="the JSON report")
    ap.add_argument("--md", default=None, help="also write the markdown table here")
    ap.add_argument("--only", default="", help="comma-separated layer names (default: every layer)")
    ap.add_argument("--cells", default=",".join(zoo.CELLS), help="comma-separated cells")
    ap.add_argument("--flex", action="store_true", help="time FlexAttention's training step too (compiles)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warm-list", action="store_true", help="print the spec paths the served cells load, and exit")
    args = ap.parse_args(argv)
    if args.warm_list:
        print(" ".join(warm_list()))
        return 0
    import torch
    sys.path.insert(0, str(ROOT / "docs" / "measurements"))
    from gpu_timing import write_report
    only = {x for x in args.only.split(",") if x}
    unknown = only - set(zoo.LAYER)
    if unknown:
        ap.error(f"unknown layers {sorted(unknown)}; the layers are {', '.join(zoo.LAYER)}")
    cells = [c for c in args.cells.split(",") if c]
    rows = []
    for layer, cell in zoo.zoo_cells():
        if (only and layer.name not in only) or cell not in cells:
            continue
        row = run_one(torch, layer, cell, args.reps, args.flex)
        print(json.dumps(row), flush=True)
        rows.append(row)
        torch.cuda.empty_cache()
    write_report(args.out, rows)
    table = markdown(rows)
    print(table)
    if args.md:
        Path(args.md).write_text(table)
    return 0 if all(r["status"] == "refused" or r["passed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
