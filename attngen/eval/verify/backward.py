"""Backward verification: dq, dk and dv of a backward kernel against the fp32 gradients, under
FlashAttention's rule for gradients: each max|g - g_ref| <= 2 x max|g_low - g_ref| + a floor, where
g_ref comes from fp32 attention on the upcast inputs and g_low from the same formulas evaluated by
torch in the inputs' dtype (its low-precision backward), and the floor is FlashAttention's rounding
floor, twice the rounding error of g_ref + 0.3 in the dtype (rounding_floor), plus verify's 1e-5. Gradients are poisoned with NaN first, so an
element the kernel never writes fails the case. Shapes whose keys span two key blocks also run in
deterministic mode: the same rule, and a second call must give the same bits.

The gradients are written out (not autograd): a row that sees no key has P = 0 and zero gradients,
where autograd through a softmax of -inf would give NaN."""
from __future__ import annotations

from .pycuda_launch import bits_differ, pycuda_agreement
from .varlen import QUICK_CASES, SEED_OFFSET, VarlenCase, varlen_case_inputs, varlen_suite
from .cases import (ERR_FACTOR, ERR_FLOOR, FULL_SUITE, ROW_ALIGN, CaseResult, Shape, Variant, error_bound,
                     exact_fp32_matmul, kernel_shapes, make_inputs, max_abs, read_back, score_arguments,
                     score_modifiers, variants)
from ...core.variants import MASKS, reference_scores
from ...core.launch_rules import group_split_key
from ...core.varlen_plan import varlen_key

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
    """Every (mask, alignment) of the kernel's padded functions over the forward suite's shapes (both
    layouts, strided qkv, GQA/MQA, tails, Sq != Sk), and in deterministic mode where key blocks take
    turns; a spec with varlen functions adds the varlen suite (empty sequences, GQA/MQA, strided qkv,
    lengths around a block), each case also in deterministic mode."""
    out = []
    block_n = kernel.plan.block_n
    padded = [m for m in masks if m in kernel.entry]      # none in a `varlen: only` spec
    for variant in variants(padded, block_n):
        for i, shape in enumerate(kernel_shapes(kernel.plan, shapes)):   # long keys for a mask expression
            for deterministic in (False, True) if takes_turns(shape, block_n) else (False,):
                out.append((variant.label + (DETERMINISTIC if deterministic else ""), kernel.entry[variant.mask],
                            shape, i, lambda seed, label, variant=variant, shape=shape, deterministic=deterministic:
                            check_backward_case(kernel, variant, shape, seed, label, deterministic)))
    cases = varlen_suite(kernel.plan.block_m)
    if len(tuple(shapes)) < len(FULL_SUITE):
        cases = cases[:QUICK_CASES]
    for variant in variants([m for m in masks if m in kernel.varlen_masks], block_n):
        for i, case in enumerate(cases):
            for deterministic in (False, True):
                out.append((variant.label + " varlen" + (DETERMINISTIC if deterministic else ""),
                            kernel.entry[varlen_key(variant.mask)], case, SEED_OFFSET + i,
                            lambda seed, label, variant=variant, case=case, deterministic=deterministic:
                            check_varlen_backward_case(kernel, variant, case, seed, label, deterministic)))
    return out


def in_layout(t, layout: str):
    """A (B, H, S, D) tensor as a new contiguous tensor of `layout`."""
    return t.contiguous() if layout == "bhsd" else t.transpose(1, 2).contiguous()


def check_backward_case(kernel, variant: Variant, shape: Shape, seed: int, label: str,
                        deterministic: bool = False) -> CaseResult:
    import torch
    from ...runtime import default_scale, to_bhsd
    plan = kernel.plan
    result = CaseResult(label, plan.entry_functions[variant.mask],
                        variant.label + (DETERMINISTIC if deterministic else ""), shape, passed=False)
    device, dtype, d = kernel.device, kernel.dtype, plan.head_dim
    # Not the default 1/sqrt(d): a kernel that ignored the call's scale would fail (autograd calls
    # take the default; tests/test_gpu_backward.py covers them).
    scale = SCALE_FACTOR * default_scale(d)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    q, k, v = make_inputs(shape, d, dtype, device, gen, v_dim=plan.v_dim)
    qb, kb, vb = (to_bhsd(t, shape.layout) for t in (q, k, v))
    dout_b = torch.randn(vb.shape[:1] + qb.shape[1:3] + vb.shape[3:], generator=gen, device=device,
                         dtype=torch.float32).to(dtype)   # like o: q's shape with V's head dim
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
    if (getattr(kernel, "last_group_splits", 1) or 1) > 1:   # a GQA call through the group-split function
        result.function = plan.entry_functions[group_split_key(variant.mask)]
    if deterministic:
        check_repeats(torch, result, (dq, dk, dv), run())
    if device.type == "cuda":    # (verify's kernels synchronize after each call)
        through_pycuda(result, kernel, lambda *_: run(), (dq, dk, dv), ref, low, deterministic)
    judge_gradients(torch, result, [to_bhsd(g, shape.layout) for g in (dq, dk, dv)], ref[2:], low[2:], plan.spec.dtype)
    return result


def through_pycuda(result: CaseResult, kernel, launch, grads, ref, low, deterministic: bool) -> None:
    """The same call through PyCUDA: dk and dv bit for bit; dq too in deterministic mode, else
    (accumulated with atomics in the order blocks finish) within the error rule's bound of dq. A
    group-split call (GQA, the kernel's last_group_splits > 1) adds dk and dv with atomics too: each
    within its own bound."""
    names = ("dq", "dk", "dv")
    bounds = {name: error_bound(max_abs(lo.float() - r)) for name, lo, r in zip(names, low[2:5], ref[2:5])}
    atomic = (() if deterministic else ("dq",)) + (("dk", "dv") if (getattr(kernel, "last_group_splits", 1) or 1) > 1
                                                   else ())
    pycuda_agreement(result, kernel, launch, names, tuple(grads), atomic=atomic, tolerance=bounds)


def check_repeats(torch, result: CaseResult, first, second) -> None:
    """Deterministic mode: a second call's gradients must have the first's bits."""
    names = ("dq", "dk", "dv")
    values = read_back(torch, {name: bits_differ(torch, a, b) for name, a, b in zip(names, first, second)})
    for name in names:
        if values[name]:
            result.problems.append(f"{name}: a second deterministic call gave other bits")


def rounding_floor_value(torch, ref, dtype):
    """FlashAttention's floor for gradients: twice the largest rounding error of ref + 0.3 - 0.3 in
    the gradients' dtype, about an ulp at the reference's magnitude (a 0-d tensor, not yet read). A
    kernel that rounds its output once can be that far off where torch's own error happens to be
    small (a few rows)."""
    r = ref.to(dtype)
    return 2 * max_abs(r + 0.3 - 0.3 - r)


def rounding_floor(torch, ref, dtype) -> float:
    """rounding_floor_value read."""
    return read_back(torch, {"floor": rounding_floor_value(torch, ref, dtype)})["floor"]


def sink_output_error(torch, dout, out, out_ref, lse_ref, sinks):
    """What an output's error moves the learned sinks' gradient by when the gradient is taken from the
    output, per head (fp32 (H,), signed; sum it over a varlen call's sequences). A backward takes d
    sink from the saved output, -sum_i exp(sink - lse_i) dO_i . O_i (the row term FlashAttention-style
    backwards take for dS), so an output within the rule moves it this much; torch's low-precision
    attention sums P . dP instead, and that error can be far smaller by chance. With torch's own
    low-precision output as `out`, this is torch's error by the saved-output route: the rule's
    yardstick for d sink is the larger of the two. dout, out and out_ref (B, H, S, Dv), lse_ref (B,
    H, S): the fp32 reference with the sinks."""
    rows = (dout.float() * (out.float() - out_ref.float())).sum(-1)
    return -(torch.exp(sinks.float().reshape(1, -1, 1) - lse_ref.float()) * rows).sum(dim=(0, 2))


def judge_gradients(torch, result: CaseResult, got_all, ref_all, low_all, dtype: str,
                    extra: dict | None = None) -> dict:
    """FlashAttention's rule for gradients on each of dq, dk, dv: max|g - ref| <= 2 x torch's
    low-precision error + the rounding floor (NaN or inf: unwritten or overflowed); sets the
    result's worst error and passed. Reads the device once, `extra` (0-d tensors) with it; returns
    `extra` read."""
    problems = result.problems
    names = ("dq", "dk", "dv")
    pending = {}
    for name, got, want, base in zip(names, got_all, ref_all, low_all):
        pending[f"{name} floor"] = rounding_floor_value(torch, want, got.dtype)
        got = got.float()
        pending[f"{name} bad"] = (~torch.isfinite(got)).sum()
        pending[f"{name} err"] = max_abs(got - want)
        pending[f"{name} low"] = max_abs(base.float() - want)
    extra = {f"extra {key}": value for key, value in (extra or {}).items()}
    flat = read_back(torch, {**pending, **extra})
    worst = 0.0
    for name, got in zip(names, got_all):
        bad = int(flat[f"{name} bad"])
        if bad:
            problems.append(f"{bad} of {got.numel()} {name} elements are NaN/inf (unwritten or overflowed)")
            continue
        floor, err, low_err = flat[f"{name} floor"], flat[f"{name} err"], flat[f"{name} low"]
        bound = error_bound(low_err) + floor
        if not err <= bound:
            problems.append(f"{name}: max error {err:.3g} exceeds {bound:.3g} ({ERR_FACTOR:g} x torch "
                            f"{dtype} error {low_err:.3g} + {ERR_FLOOR:g} + rounding floor {floor:.3g})")
        if err / bound >= worst:
            worst = err / bound
            result.max_err, result.lowprec_err, result.bound = err, low_err, bound
    result.passed = not problems
    return {key[len("extra "):]: flat[key] for key in extra}


def varlen_gradients(torch, q, k, v, dout, case: VarlenCase, variant: Variant, scale: float, plan=None,
                     scores: dict | None = None):
    """(reference, low-precision) of attention_gradients for varlen tensors, sequence by sequence:
    each a tuple (out, lse (heads, total_q), dq, dk, dv) in varlen (total, heads, d) form; `scores`
    are the call's score-modifier arguments of `plan` (ALiBi slopes per sequence)."""
    refs, lows = [], []
    q0 = k0 = 0
    for b, (lq, lk) in enumerate(zip(case.lens_q, case.keys)):
        call = dict(scale=scale, mask=variant.mask, alignment=variant.alignment, window=variant.visible_window,
                    modifiers=score_modifiers(plan, scores, slice(b, b + 1)) if plan is not None else ())
        qs, ks, vs, ds = (t.transpose(0, 1)[None] for t in (q[q0:q0 + lq], k[k0:k0 + lk], v[k0:k0 + lk],
                                                            dout[q0:q0 + lq]))
        with exact_fp32_matmul(torch):
            refs.append(attention_gradients(qs.float(), ks.float(), vs.float(), ds.float(), **call))
        lows.append(attention_gradients(qs, ks, vs, ds, **call))
        q0, k0 = q0 + lq, k0 + lk

    def joined(parts):
        def rows(i):   # (1, H, S, D) -> (S, H, D), sequences back to back
            return torch.cat([p[i][0].transpose(0, 1) for p in parts])
        return (rows(0), torch.cat([p[1][0] for p in parts], dim=1), rows(2), rows(3), rows(4))
    return joined(refs), joined(lows)


def check_varlen_backward_case(kernel, variant: Variant, case: VarlenCase, seed: int, label: str,
                               deterministic: bool = False) -> CaseResult:
    """The varlen call's gradients against each sequence's reference, written into poisoned
    buffers with guard rows past the last sequence (which must stay untouched)."""
    import torch
    from ...runtime import default_scale
    from ...runtime.calls.varlen import cu_seqlens
    plan = kernel.plan
    result = CaseResult(label, kernel.entry[varlen_key(variant.mask)],
                        variant.label + " varlen" + (DETERMINISTIC if deterministic else ""), case, passed=False)
    d, dtype, dev = plan.head_dim, kernel.dtype, kernel.device
    tq, tk = sum(case.lens_q), sum(case.keys)
    gen, randn, q, k, v = varlen_case_inputs(torch, kernel, case, seed)
    dout = randn(tq, case.heads, d)
    scale = SCALE_FACTOR * default_scale(d)
    scores = score_arguments(plan, len(case.lens_q), case.heads, gen, dev)
    ref, low = varlen_gradients(torch, q, k, v, dout, case, variant, scale, plan, scores)
    out, lse = ref[0].to(dtype), ref[1].contiguous()
    guard = -(-max(plan.block_m, plan.block_n) // ROW_ALIGN) * ROW_ALIGN
    cu_q, cu_k = cu_seqlens(torch, case.lens_q, dev), cu_seqlens(torch, case.keys, dev)

    def run():
        bufs = [torch.full((n + guard,) + tuple(t.shape[1:]), float("nan"), dtype=dtype, device=dev)
                for n, t in ((tq, q), (tk, k), (tk, v))]
        grads = kernel.varlen(q, k, v, out, lse, dout, cu_q, cu_k, **variant.call_arguments(), **scores,
                              scale=scale, dq=bufs[0][:tq], dk=bufs[1][:tk], dv=bufs[2][:tk],
                              deterministic=deterministic, max_seqlen_k=max(case.keys) if case.give_max else None)
        return grads, bufs
    (dq, dk, dv), bufs = run()
    if deterministic:
        check_repeats(torch, result, (dq, dk, dv), run()[0])
    through_pycuda(result, kernel, lambda *_: run()[0], (dq, dk, dv), ref, low, deterministic)
    names = ("dq", "dk", "dv")
    past = judge_gradients(torch, result, (dq, dk, dv), ref[2:], low[2:], plan.spec.dtype,
                           extra={name: (~torch.isnan(buf[n:])).any()
                                  for name, buf, n in zip(names, bufs, (tq, tk, tk))})
    for name in names:
        if past[name]:
            result.problems.append(f"{name} written past the last sequence's rows")
    result.passed = not result.problems
    return result


__all__ = ["attention_gradients", "check_backward_case", "check_varlen_backward_case", "varlen_gradients",
           "verify_cases"]
