"""GQA/MQA backward on the Hopper class: the group-split path (a KV head's query heads spread over
blocks, dK and dV summed in fp32) beside the unsplit path (group_splits=1, the path before it) and
torch SDPA's cuDNN backward, in one process. Per shape: GPU time of the backward call alone (CUDA
events, median of 15 after 3 warm-up calls), TFLOP/s (2.5 x the forward's 4 B H S^2 D, halved for
causal), every split count of the group and the heuristic's, and the largest difference of the split
gradients from the unsplit ones (fp32 sums in another order: a few ulps).

cuDNN: SDPA with enable_gqa=True on the cuDNN backend; where that backend refuses GQA, K and V are
repeated beforehand (the repeat and the group sum of dK, dV left out of its time: the row says so).

Each row also times the forward alone (attngen.attention against SDPA's cuDNN forward), so that a
training step's gap can be put on its forward or its backward.

Usage (repository root, GPU machine): python3 docs/measurements/gqa_backward.py [OUT.json [SHAPES]]
SHAPES: comma-separated BxHq/HkvxSxD, a trailing c for causal (e.g. 32x16/4x512x128c,8x16/2x2048x128c);
default: the shapes below.
"""
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attngen

ROOT = Path(__file__).resolve().parents[2]
# (batch, heads, kv_heads, seqlen, head_dim, causal): Llama 3 / Qwen3 8B (32/8), Qwen3 235B (64/4),
# a 32/4 grid, Falcon-style MQA (d64: 64/1 and 71/1)
SHAPES = [(4, 32, 8, 4096, 128, True), (2, 32, 4, 2048, 128, False), (2, 32, 4, 2048, 128, True),
          (2, 64, 4, 2048, 128, True), (2, 64, 1, 2048, 64, True), (2, 64, 1, 2048, 64, False),
          (2, 71, 1, 2048, 64, True)]
DTYPE = torch.bfloat16


def parse_shapes(text):
    """'32x16/4x512x128c,...' -> [(batch, heads, kv_heads, seqlen, head_dim, causal), ...]"""
    shapes = []
    for cell in filter(None, (c.strip() for c in text.split(","))):
        causal = cell.endswith("c")
        b, heads, s, d = cell.rstrip("c").split("x")
        h, _, hk = heads.partition("/")
        shapes.append((int(b), int(h), int(hk or h), int(s), int(d), causal))
    return shapes


def med(fn, reps=15):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts)


def cudnn_backward(q, k, v, dout, causal):
    """fn() running only SDPA cuDNN's backward (its forward's graph kept), and a note."""
    group = q.shape[1] // k.shape[1]
    for gqa in (True, False):
        try:
            kk, vv = (k, v) if gqa else (x.repeat_interleave(group, 1) for x in (k, v))
            leaves = [t.detach().clone().requires_grad_() for t in (q, kk, vv)]
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                out = F.scaled_dot_product_attention(*leaves, is_causal=causal, enable_gqa=gqa)

            def run(out=out, leaves=leaves):
                return torch.autograd.grad(out, leaves, dout, retain_graph=True)
            run()
            return run, "enable_gqa" if gqa else "K, V repeated (not timed: repeat, group sum)"
        except RuntimeError as exc:
            last = exc
    return None, f"cuDNN refused: {last}"


def main(out_path=None, shapes=SHAPES):
    rows = []
    for b, h, hk, s, d, causal in shapes:
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, dout = (torch.randn(b, h, s, d, generator=gen, device="cuda", dtype=DTYPE) for _ in range(2))
        k, v = (torch.randn(b, hk, s, d, generator=gen, device="cuda", dtype=DTYPE) for _ in range(2))
        bwd = attngen.load(ROOT / "specs" / f"h100_bwd_d{d}_wgmma_bf16.yaml")
        o, lse = attngen.attention(q, k, v, causal=causal, return_lse=True)
        group = h // hk
        flops = 2.5 * 4 * b * h * s * s * d / (2 if causal else 1)
        row = {"shape": f"{b}x{h}/{hk}x{s}x{d}", "causal": causal, "dtype": "bf16"}
        bwd(q, k, v, o, lse, dout, causal=causal)
        row["heuristic_splits"] = bwd.last_group_splits
        unsplit = bwd(q, k, v, o, lse, dout, causal=causal, group_splits=1)
        times = {}
        for splits in [x for x in range(1, group + 1) if group % x == 0]:
            times[splits] = med(lambda: bwd(q, k, v, o, lse, dout, causal=causal, group_splits=splits))
            if splits > 1:
                got = bwd(q, k, v, o, lse, dout, causal=causal, group_splits=splits)
                row.setdefault("max_diff_vs_unsplit", {})[splits] = [
                    (a.float() - u.float()).abs().max().item() for a, u in zip(got, unsplit)]
        times["heuristic"] = med(lambda: bwd(q, k, v, o, lse, dout, causal=causal))
        row["forward_us"] = {"attngen": round(med(lambda: attngen.attention(q, k, v, causal=causal)), 1)}
        try:
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                row["forward_us"]["cudnn"] = round(med(lambda: F.scaled_dot_product_attention(
                    q, k, v, is_causal=causal, enable_gqa=True)), 1)
        except RuntimeError as exc:
            row["forward_us"]["cudnn_refused"] = str(exc).splitlines()[0]
        cudnn, note = cudnn_backward(q, k, v, dout, causal)
        row["cudnn_note"] = note
        if cudnn is not None:
            times["cudnn"] = med(cudnn)
        row["us"] = {str(key): round(t, 1) for key, t in times.items()}
        row["tflops"] = {str(key): round(flops / t / 1e6, 1) for key, t in times.items()}
        if cudnn is not None:
            row["vs_cudnn"] = {str(key): round(times["cudnn"] / t, 3) for key, t in times.items() if key != "cudnn"}
        rows.append(row)
        best = min((t, key) for key, t in times.items() if key != "cudnn")
        print(f"{row['shape']:>18} {'causal' if causal else 'full':6} splits: heuristic {row['heuristic_splits']} "
              f"best {best[1]} | " + "  ".join(f"{key}: {t:.0f} us" for key, t in times.items())
              + (f" | heuristic/cudnn {times['cudnn'] / times['heuristic']:.2f}x, unsplit/cudnn "
                 f"{times['cudnn'] / times[1]:.2f}x" if cudnn else "") + f" ({note}) | forward "
              + ", ".join(f"{key}: {t}" for key, t in row["forward_us"].items()), flush=True)
        torch.cuda.empty_cache()
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    if out_path:
        Path(out_path).write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None, parse_shapes(sys.argv[2]) if len(sys.argv) > 2 else SHAPES)
