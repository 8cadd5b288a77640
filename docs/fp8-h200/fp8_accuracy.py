"""Accuracy of the e4m3 forward against fp32 attention on the unquantized inputs, beside torch's
fp16 attention on the same inputs, and what outlier channels cost under each scaling.

Usage: python3 docs/fp8-h200/fp8_accuracy.py OUT.json [SPEC]      (default specs/l4_mma_d128_fp8.yaml)

Inputs: B 2, H 8, S 2048, the spec's head dim, non-causal and causal, standard normal; "outliers":
q and k with 4 of their channels 20x larger (FlashAttention-3's setting: a few large-magnitude
features). Each row gives RMSE and max |out - ref| of:
- torch fp16: SDPA (flash) on the inputs rounded to fp16;
- attngen e4m3, per (batch, kv head) scales (quantize_fp8);
- attngen e4m3, one scale for the whole tensor (the same kernel, every descale equal);
- attngen e4m3 after a random-sign Hadamard rotation of q and k (q H and k H: q k^T is unchanged,
  the outlier channels are spread over all of them), per (batch, kv head) scales;
- per-block scales (one per 128 rows of each head), which the kernel's descales cannot express:
  torch on the dequantized inputs with the kernel's own P rounding (eval.forward_fp8_verify's peer),
  so the row says what the inputs' quantization alone costs under that scaling.
"""
import json
import math
import sys

import torch

import attngen
from attngen.eval.verify.forward_fp8 import peer_attention
from attngen.eval.verify import attention_torch, exact_fp32_matmul
from attngen.runtime.calls.forward_fp8 import E4M3_MAX, quantize_fp8

B, H, S = 2, 8, 2048
OUTLIER_CHANNELS, OUTLIER_FACTOR = 4, 20.0
BLOCK_ROWS = 128


def errors(out, ref):
    d = out.float() - ref
    return {"rmse": d.pow(2).mean().sqrt().item(), "max": d.abs().max().item()}


def hadamard(d, device, gen):
    """An orthogonal d x d matrix: Sylvester's Hadamard (d a power of two) / sqrt(d) with random row signs."""
    h = torch.ones(1, 1, device=device)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    signs = torch.randint(0, 2, (d,), generator=gen, device=device).float() * 2 - 1
    return signs[:, None] * h / math.sqrt(d)


def per_block(t):
    """t (B, H, S, D) through e4m3 with one scale per BLOCK_ROWS rows of each head, dequantized."""
    b, h, s, d = t.shape
    pad = -s % BLOCK_ROWS
    x = torch.nn.functional.pad(t, (0, 0, 0, pad)).reshape(b, h, -1, BLOCK_ROWS, d)
    amax = x.abs().amax(dim=(-2, -1), keepdim=True).clamp_min(1e-12)
    q = (x * (E4M3_MAX / amax)).to(torch.float8_e4m3fn).float() * (amax / E4M3_MAX)
    return q.reshape(b, h, -1, d)[:, :, :s]


def main():
    out_path = sys.argv[1]
    spec = sys.argv[2] if len(sys.argv) > 2 else "specs/l4_mma_d128_fp8.yaml"
    kernel = attngen.load(spec)
    d = kernel.plan.head_dim
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for inputs in ("gaussian", "outliers"):
        q, k, v = (torch.randn(B, H, S, d, generator=gen, device=dev) for _ in range(3))
        if inputs == "outliers":
            ch = torch.randperm(d, generator=gen, device=dev)[:OUTLIER_CHANNELS]
            q[..., ch] *= OUTLIER_FACTOR
            k[..., ch] *= OUTLIER_FACTOR
        rot = hadamard(d, dev, gen)
        for causal in (False, True):
            mask = "causal" if causal else "none"
            align = "top_left" if causal else None
            scale = d ** -0.5
            with exact_fp32_matmul(torch):
                ref, _ = attention_torch(q, k, v, scale=scale, mask=mask, alignment=align)
            row = {"inputs": inputs, "causal": causal}
            row["torch fp16"] = errors(torch.nn.functional.scaled_dot_product_attention(
                q.half(), k.half(), v.half(), is_causal=causal), ref)
            q8, k8, vt, qd, kd, vd = quantize_fp8(q, k, v)
            row["attngen e4m3, per (batch, kv head)"] = errors(
                kernel(q8, k8, vt, q_descale=qd, k_descale=kd, v_descale=vd, causal=causal), ref)
            one = {n: torch.full_like(t, t.max().item()) for n, t in (("q", qd), ("k", kd), ("v", vd))}
            q8t = (q / one["q"][0, 0]).to(torch.float8_e4m3fn)
            k8t = (k / one["k"][0, 0]).to(torch.float8_e4m3fn)
            vtt = torch.zeros_like(vt)
            vtt.copy_((v / one["v"][0, 0]).to(torch.float8_e4m3fn).transpose(2, 3))
            row["attngen e4m3, per tensor"] = errors(
                kernel(q8t, k8t, vtt, q_descale=one["q"], k_descale=one["k"], v_descale=one["v"], causal=causal), ref)
            qr8, kr8, vtr, qdr, kdr, vdr = quantize_fp8(q @ rot, k @ rot, v)
            row["attngen e4m3, Hadamard + per (batch, kv head)"] = errors(
                kernel(qr8, kr8, vtr, q_descale=qdr, k_descale=kdr, v_descale=vdr, causal=causal), ref)
            with exact_fp32_matmul(torch):
                row["torch e4m3-P, per block of 128 rows (emulated)"] = errors(peer_attention(
                    torch, per_block(q), per_block(k), per_block(v), scale=scale, mask=mask, alignment=align,
                    out_dtype=kernel.out_dtype), ref)
            rows.append(row)
    lines = [f"{kernel.name}, B{B} H{H} S{S} d{d}, {torch.cuda.get_device_name()}; RMSE / max |out - fp32 ref|"]
    for row in rows:
        lines.append(f"{row['inputs']}{' causal' if row['causal'] else ''}:")
        for name, e in row.items():
            if isinstance(e, dict):
                lines.append(f"  {name:<48} {e['rmse']:.2e} / {e['max']:.2e}")
    print("\n".join(lines))
    with open(out_path, "w") as f:
        json.dump({"spec": kernel.name, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "shape": [B, H, S, d], "outlier_channels": OUTLIER_CHANNELS, "outlier_factor": OUTLIER_FACTOR,
                   "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
