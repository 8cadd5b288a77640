"""Verification of e4m3 forward kernels.

Inputs: standard normal fp32 q, k, v, quantized per (batch, kv head) to e4m3 (quantize_fp8). The
reference is fp32 attention on the dequantized inputs (q8 x q_descale, ...), so quantizing the inputs
costs nothing here: what is judged is the kernel's own arithmetic. Its low-precision peer, the bound's
base, is torch's attention with the kernel's one rounding step: P = exp(s - rowmax) x 2^8 rounded to
e4m3 before P.V (row sums from the unrounded P), the output rounded to the kernel's output type.

    max|out - ref| <= 2 x max|peer - ref| + 1e-5        (FlashAttention's rule, with that peer)

LSE, guard rows and NaN checks as `attngen verify` does for fp16/bf16. A failure's message also gives
the error of torch's fp16 attention on the same dequantized inputs, the cost of fp8 beside it.
"""
from __future__ import annotations

from dataclasses import replace

from .pycuda_launch import pycuda_agreement
from .cases import (ERR_FACTOR, ERR_FLOOR, FULL_SUITE, ROW_ALIGN, CaseResult, Shape, attention_torch, error_bound,
                     exact_fp32_matmul, judge_lse, poisoned_lse, poisoned_output, variants)

P_SCALE = 256.0      # the kernel keeps P 2^8 larger inside the e4m3 range (attngen/kinds/fwd_mma/e4m3.py)


def dequantized(torch, t8, descale, layout: str, group: int = 1):
    """(B, H, S, D) fp32 values of an e4m3 tensor and its (B, Hkv) descales."""
    t = t8.float() if layout == "bhsd" else t8.float().transpose(1, 2)
    return t * descale.repeat_interleave(group, dim=1)[:, :, None, None]


def peer_attention(torch, q, k, v, *, scale: float, mask: str, alignment, out_dtype):
    """torch's attention with the kernel's rounding of P to e4m3 (fp32 otherwise), rounded to out_dtype."""
    from ...core.variants import MASKS
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads != kv_heads:
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    visible = MASKS[mask].visible(torch, q.shape[2], k.shape[2], alignment, q.device, None)
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    row_max = scores.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isneginf(row_max), torch.zeros_like(row_max), row_max)
    p = torch.exp(scores - row_max) * P_SCALE
    total = p.sum(dim=-1, keepdim=True)
    p8 = p.to(torch.float8_e4m3fn).float()
    out = torch.matmul(p8, v) / torch.where(total > 0, total, torch.ones_like(total))
    return out.to(out_dtype).float()


def check_fp8_case(kernel, variant, shape: Shape, seed: int, label: str) -> CaseResult:
    import torch
    from ...runtime import default_scale
    from ...runtime.calls.forward_fp8 import quantize_fp8
    plan = kernel.plan
    function = plan.entry_functions[variant.mask]
    result = CaseResult(label, function, variant.label, shape, passed=False)
    device, d, layout = kernel.device, plan.head_dim, shape.layout
    scale = default_scale(d)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    b, h, kvh, sq, sk = shape.batch, shape.heads, shape.kv_heads, shape.seqlen_q, shape.seqlen_k

    def randn(*size):
        return torch.randn(size, generator=gen, device=device, dtype=torch.float32)

    if layout == "bshd":
        q, k, v = randn(b, sq, h, d), randn(b, sk, kvh, d), randn(b, sk, kvh, d)
    else:
        q, k, v = randn(b, h, sq, d), randn(b, kvh, sk, d), randn(b, kvh, sk, d)
    q8, k8, v_t, qd, kd, vd = quantize_fp8(q, k, v, layout=layout)
    guard_rows = -(-plan.block_m // ROW_ALIGN) * ROW_ALIGN
    o, o_guard = poisoned_output(shape, d, guard_rows, kernel.out_dtype, device)
    lse, lse_guard = poisoned_lse(shape, guard_rows, device)

    def launch(out, lse_out):
        kernel(q8, k8, v_t, q_descale=qd, k_descale=kd, v_descale=vd, **variant.call_arguments(), scale=scale,
               layout=layout, out=out, lse_out=lse_out)
    launch(o, lse)
    pycuda_agreement(result, kernel, launch, ("o", "lse"), (o, lse))

    qf = dequantized(torch, q8, qd, layout, h // kvh)
    kf = dequantized(torch, k8, kd, layout)
    vf = v_t.float().transpose(2, 3) * vd[:, :, None, None]
    ob = (o if layout == "bhsd" else o.transpose(1, 2)).float()
    with exact_fp32_matmul(torch):
        ref, ref_lse = attention_torch(qf, kf, vf, scale=scale, mask=variant.mask, alignment=variant.alignment)
        peer = peer_attention(torch, qf, kf, vf, scale=scale, mask=variant.mask, alignment=variant.alignment,
                              out_dtype=kernel.out_dtype)
    fp16, _ = attention_torch(qf.half(), kf.half(), vf.half(), scale=scale, mask=variant.mask,
                              alignment=variant.alignment)
    problems = result.problems
    bad = int((~torch.isfinite(ob)).sum())
    if bad:
        problems.append(f"{bad} of {ob.numel()} output elements are NaN/inf (unwritten or overflowed)")
    if (~torch.isnan(o_guard)).any().item():
        problems.append("output written past seqlen_q")
    result.max_err = (ob - ref).abs().max().item()
    result.lowprec_err = (peer - ref).abs().max().item()
    result.bound = error_bound(result.lowprec_err)
    fp16_err = (fp16.float() - ref).abs().max().item()
    if not bad and not result.max_err <= result.bound:
        problems.append(f"max error {result.max_err:.3g} exceeds {result.bound:.3g} ({ERR_FACTOR:g} x the e4m3-P torch "
                        f"error {result.lowprec_err:.3g} + {ERR_FLOOR:g}; torch fp16: {fp16_err:.3g})")
    judge_lse(result, torch, lse, ref_lse, lse_guard)
    result.passed = not problems
    return result


def verify_cases(kernel, shapes, masks) -> list[tuple]:
    """The e4m3 cases of `attngen verify`: every mask variant over the forward suite's shapes."""
    shapes = tuple(shapes) or FULL_SUITE
    out = []
    for variant in variants(masks, kernel.plan.block_n):
        function = kernel.entry[variant.mask]
        for i, shape in enumerate(shapes):
            shape = replace(shape, qkv=False)   # quantizing makes tensors of their own of a qkv shape's slices
            out.append((variant.label, function, shape, i,
                        lambda seed, label, variant=variant, shape=shape: check_fp8_case(kernel, variant, shape, seed,
                                                                                         label)))
    return out


__all__ = ["check_fp8_case", "peer_attention", "verify_cases"]
