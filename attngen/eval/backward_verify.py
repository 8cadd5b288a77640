"""Backward verification: dq, dk and dv of a backward kernel against the fp32 gradients, under
FlashAttention's rule for gradients: each max|g - g_ref| <= 2 x max|g_low - g_ref| + a floor, where
g_ref comes from fp32 attention on the upcast inputs and g_low from the same formulas evaluated by
torch in the inputs' dtype (its low-precision backward). Gradients are poisoned with NaN first, so an
element the kernel never writes fails the case. Shapes whose keys span two key blocks also run in
deterministic mode: the same rule, and a second call must give the same bits.

The gradients are written out (not autograd): a row that sees no key has P = 0 and zero gradients,
where autograd through a softmax of -inf would give NaN."""
from __future__ import annotations

from .verify import (ERR_FACTOR, ERR_FLOOR, CaseResult, Shape, Variant, error_bound, exact_fp32_matmul, make_inputs,
                     score_arguments, score_modifiers, variants)
from ..core.variants import MASKS, reference_scores

SCALE_FACTOR = 0.8   # verify's softmax scale, times 1/sqrt(head_dim)


def attention_gradients(q, k, v, dout, *, scale: float, mask: str, alignment: str | None, window=None,
                        modifiers: tuple = ()):
    """(out, lse, dq, dk, dv) of softmax(m(scale q k^T)) v for (B, H, S, D) tensors, m the score
    `modifiers` ((ScoreVariant, value) pairs, as verify's forward reference takes them) and the mask
    (`window`: a window mask's (left, right)); GQA by repeating kv heads (dk and dv summed back over
    each group). Every product is rounded to the inputs' dtype: fp32 inputs give the reference,
    fp16/bf16 ones torch's low-precision backward. The modifiers' derivative comes from autograd
    through their own reference."""
    import torch
    dtype = q.dtype
    heads, kv_heads = q.shape[1], k.shape[1]
    group = heads // kv_heads
    kr, vr = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scaled = torch.matmul(q, kr.transpose(-1, -2)) * scale
    with torch.enable_grad():
        leaf = scaled.detach().requires_grad_(bool(modifiers))
        logits = reference_scores(torch, leaf, modifiers, q.shape[2], k.shape[2])
    s = logits.detach()
    visible = MASKS[mask].visible(torch, q.shape[2], k.shape[2], alignment, q.device, window)
    if visible is not None:
        s = s.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(s.float(), dim=-1)
    no_key = torch.isneginf(lse)[..., None]
    p = torch.exp(s.float() - lse.masked_fill(torch.isneginf(lse), 0.0)[..., None]).masked_fill(no_key, 0.0).to(dtype)
    out = torch.matmul(p, vr)
    dv = torch.matmul(p.transpose(-1, -2), dout)
    dp = torch.matmul(dout, vr.transpose(-1, -2))
    delta = (dout.float() * out.float()).sum(dim=-1, keepdim=True).to(dtype)
    ds = p * (dp - delta)
    if modifiers:   # the chain rule through the modifiers: d logit / d scaled score
        ds = torch.autograd.grad(logits, leaf, ds)[0]
    dq = torch.matmul(ds, kr) * scale
    dk = torch.matmul(ds.transpose(-1, -2), q) * scale

    def group_sum(g):
        b, _, sk, d = g.shape
        return g.float().view(b, kv_heads, group, sk, d).sum(dim=2).to(dtype)
    return out, lse, dq, group_sum(dk), group_sum(dv)


DETERMINISTIC = " deterministic"   # the variant label's suffix of a deterministic-mode case


def takes_turns(shape: Shape, block_n: int) -> bool:
    """Whether deterministic mode orders anything in this shape: two key blocks add into dQ rows."""
    return shape.seqlen_k > block_n and shape.seqlen_q > 1


def verify_cases(kernel, shapes, masks) -> list[tuple]:
    """Every (mask, alignment) of the kernel over the forward suite's shapes (both layouts, strided
    qkv, GQA/MQA, tails, Sq != Sk), and in deterministic mode where key blocks take turns."""
    out = []
    block_n = kernel.plan.block_n
    for variant in variants(masks, block_n):
        for i, shape in enumerate(shapes):
            for deterministic in (False, True) if takes_turns(shape, block_n) else (False,):
                out.append((variant.label + (DETERMINISTIC if deterministic else ""), kernel.entry[variant.mask],
                            shape, i, lambda seed, label, variant=variant, shape=shape, deterministic=deterministic:
                            check_backward_case(kernel, variant, shape, seed, label, deterministic)))
    return out


def in_layout(t, layout: str):
    """A (B, H, S, D) tensor as a new contiguous tensor of `layout`."""
    return t.contiguous() if layout == "bhsd" else t.transpose(1, 2).contiguous()


def check_backward_case(kernel, variant: Variant, shape: Shape, seed: int, label: str,
                        deterministic: bool = False) -> CaseResult:
    import torch
    from ..runtime import default_scale, to_bhsd
    plan = kernel.plan
    result = CaseResult(label, plan.entry_functions[variant.mask],
                        variant.label + (DETERMINISTIC if deterministic else ""), shape, passed=False)
    device, dtype, d = kernel.device, kernel.dtype, plan.head_dim
    # Not the default 1/sqrt(d): a kernel that ignored the call's scale would fail (autograd calls
    # take the default; tests/test_gpu_backward.py covers them).
    scale = SCALE_FACTOR * default_scale(d)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    q, k, v = make_inputs(shape, d, dtype, device, gen)
    qb, kb, vb = (to_bhsd(t, shape.layout) for t in (q, k, v))
    dout_b = torch.randn(qb.shape, generator=gen, device=device, dtype=torch.float32).to(dtype)
    scores = score_arguments(plan, shape.batch, shape.heads, gen, device)
    call = dict(scale=scale, mask=variant.mask, alignment=variant.alignment, window=variant.visible_window,
                modifiers=score_modifiers(plan, scores))
    with exact_fp32_matmul(torch):
        ref = attention_gradients(qb.float(), kb.float(), vb.float(), dout_b.float(), **call)
    low = attention_gradients(qb, kb, vb, dout_b, **call)
    out = in_layout(ref[0].to(dtype), shape.layout)
    lse = ref[1].contiguous()
    dout = in_layout(dout_b, shape.layout)
    def run():
        poisoned = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
        return kernel(q, k, v, out, lse, dout, **variant.call_arguments(), **scores, scale=scale,
                      layout=shape.layout, dq=poisoned[0], dk=poisoned[1], dv=poisoned[2],
                      **({"deterministic": True} if deterministic else {}))
    dq, dk, dv = run()
    problems = result.problems
    if deterministic:
        again = run()
        for name, first, second in zip(("dq", "dk", "dv"), (dq, dk, dv), again):
            if not torch.equal(first.view(torch.int16), second.view(torch.int16)):
                problems.append(f"{name}: a second deterministic call gave other bits")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    worst = 0.0
    for name, got, want, base in zip(("dq", "dk", "dv"), (dq, dk, dv), ref[2:], low[2:]):
        got = to_bhsd(got, shape.layout).float()
        bad = int((~torch.isfinite(got)).sum())
        if bad:
            problems.append(f"{bad} of {got.numel()} {name} elements are NaN/inf (unwritten or overflowed)")
            continue
        err = (got - want).abs().max().item() if got.numel() else 0.0
        low_err = (base.float() - want).abs().max().item() if got.numel() else 0.0
        bound = error_bound(low_err)
        if not err <= bound:
            problems.append(f"{name}: max error {err:.3g} exceeds {bound:.3g} ({ERR_FACTOR:g} x torch "
                            f"{plan.spec.dtype} error {low_err:.3g} + {ERR_FLOOR:g})")
        if err / bound >= worst:
            worst = err / bound
            result.max_err, result.lowprec_err, result.bound = err, low_err, bound
    result.passed = not problems
    return result


def check_options(paths, plans, opts) -> list[str]:
    """`attngen bench` has no backward cells yet: say so before any GPU work."""
    names = ", ".join(p.spec.name for p in plans)
    return [f"{names}: `attngen bench` does not time backward specs yet; `attngen verify` checks them"]


def bench_specs(paths, plans, opts, progress, on_compile):
    """Never reached: check_options refuses every backward spec."""
    return None


__all__ = ["attention_gradients", "bench_specs", "check_backward_case", "check_options", "verify_cases"]
