"""Head dims the dispatch table serves no kernel of (59, 72, 111, 224: FlashAttention's tests use 59,
111 and 224) run at the smallest served head dim above them, q, k and v zero-padded: forward (both
layouts, GQA, causal, LSE), backward, a variant (window, softcap), varlen forward and backward, and
decode (contiguous and paged), each against the fp32 reference under the error rule; the output has
the call's head dim and the strides the unpadded call would give it. So do served head dims whose
kernels lack the call's variant (a window backward at d80, softcap at d32, a windowed decode at d32):
they run at the smallest head dim that has it."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture
def torch():
    import torch
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the committed dispatch table's head dims are those of sm_90 (H100/H200)")
    return torch


def reference(torch, q, k, v, *, causal, window=None, softcap=None):
    """(fp32 out, lowprec out, fp32 lse) of attention_torch for (B, H, S, D) tensors."""
    from attngen.core.variants import SOFTCAP, call_mask
    from attngen.eval.verify.cases import attention_torch, exact_fp32_matmul
    mask = call_mask(causal, window)
    args = dict(scale=q.shape[-1] ** -0.5, mask=mask, alignment="top_left" if mask != "none" else None,
                window=None if window is None else (window[0], 0 if causal else window[1]),
                modifiers=((SOFTCAP, softcap),) if softcap is not None else ())
    with exact_fp32_matmul(torch):
        ref, ref_lse = attention_torch(q.float(), k.float(), v.float(), **args)
    low, _ = attention_torch(q, k, v, **args)
    return ref, low, ref_lse


def within_rule(got, ref, low, label):
    from attngen.eval.verify.cases import error_bound
    err, low_err = (got.float() - ref.float()).abs().max().item(), (low.float() - ref.float()).abs().max().item()
    assert err <= error_bound(low_err), f"{label}: {err:.3g} > {error_bound(low_err):.3g} (torch {low_err:.3g})"


def inputs(torch, dtype, head_dim, *, batch=2, heads=8, kv_heads=2, sq=301, sk=301, seed=0, grad=False):
    g = torch.Generator(device="cuda").manual_seed(seed + head_dim)
    dt = getattr(torch, dtype)
    q = torch.randn(batch, heads, sq, head_dim, device="cuda", generator=g).to(dt)
    k, v = (torch.randn(batch, kv_heads, sk, head_dim, device="cuda", generator=g).to(dt) for _ in range(2))
    return tuple(t.requires_grad_(grad) for t in (q, k, v))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("head_dim", [59, 72, 111, 224])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_at_an_unserved_head_dim(torch, dtype, head_dim, causal):
    import attngen
    q, k, v = inputs(torch, dtype, head_dim)
    out, lse = attngen.attention(q, k, v, causal=causal, return_lse=True)
    assert out.shape == q.shape and out.is_contiguous()
    ref, low, ref_lse = reference(torch, q, k, v, causal=causal)
    within_rule(out, ref, low, f"d{head_dim}")
    assert (lse - ref_lse).abs().max().item() < 1e-2
    t = lambda x: x.transpose(1, 2).contiguous()   # noqa: E731
    out_s = attngen.attention(t(q), t(k), t(v), causal=causal, layout="bshd")
    assert out_s.shape == t(q).shape and out_s.is_contiguous()
    within_rule(out_s.transpose(1, 2), ref, low, f"d{head_dim} bshd")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("head_dim", [59, 111, 224])
@pytest.mark.parametrize("causal", [False, True])
def test_backward_at_an_unserved_head_dim(torch, dtype, head_dim, causal):
    import attngen
    q, k, v = inputs(torch, dtype, head_dim, sq=257, sk=257, grad=True)
    dout = torch.randn_like(q)
    out = attngen.attention(q, k, v, causal=causal)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref, low, _ = reference(torch, q, k, v, causal=causal)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    from attngen.eval.verify.cases import attention_torch, exact_fp32_matmul
    with exact_fp32_matmul(torch):
        ref32, _ = attention_torch(q32, k32, v32, scale=head_dim ** -0.5, mask="causal" if causal else "none",
                                   alignment="top_left" if causal else None)
        ref_grads = torch.autograd.grad(ref32, (q32, k32, v32), dout.float())
    low_grads = torch.autograd.grad(low, (q, k, v), dout)
    within_rule(out, ref, low, f"d{head_dim} out")
    for name, got, r, lo in zip("qkv", grads, ref_grads, low_grads):
        assert got.shape == r.shape
        within_rule(got, r, lo, f"d{head_dim} d{name}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_variants_at_an_unserved_head_dim(torch, dtype):
    """A window at d59 (served at 64) and softcap at d224 (served at 256, Gemma 2's cap)."""
    import attngen
    q, k, v = inputs(torch, dtype, 59)
    out = attngen.attention(q, k, v, causal=True, window=(70, 0))
    ref, low, _ = reference(torch, q, k, v, causal=True, window=(70, 0))
    within_rule(out, ref, low, "d59 window")
    q, k, v = inputs(torch, dtype, 224)
    out = attngen.attention(q, k, v, causal=True, softcap=50.0)
    ref, low, _ = reference(torch, q, k, v, causal=True, softcap=50.0)
    within_rule(out, ref, low, "d224 softcap")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("head_dim,window,softcap", [(80, (70, 0), None), (32, None, 30.0), (80, (40, 0), 20.0),
                                                     (160, None, 50.0)])
def test_training_with_a_variant_its_head_dim_lacks(torch, dtype, head_dim, window, softcap):
    """A head dim whose backward (or forward) kernels have no such variant trains padded at the smallest
    head dim that has it (ops.table.padded_head_dim with the call's mask and score modifiers): out and
    every gradient against the fp32 reference of the same variant, under the error rule."""
    import attngen
    from attngen.core.variants import SOFTCAP, call_mask
    from attngen.eval.verify.cases import attention_torch, exact_fp32_matmul
    q, k, v = inputs(torch, dtype, head_dim, sq=257, sk=257, grad=True)
    dout = torch.randn_like(q)
    out = attngen.attention(q, k, v, causal=True, window=window, softcap=softcap)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    mask = call_mask(True, window)
    args = dict(scale=head_dim ** -0.5, mask=mask, alignment="top_left",
                window=None if window is None else (window[0], 0),
                modifiers=((SOFTCAP, softcap),) if softcap is not None else ())
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    with exact_fp32_matmul(torch):
        ref, _ = attention_torch(q32, k32, v32, **args)
        ref_grads = torch.autograd.grad(ref, (q32, k32, v32), dout.float())
    low, _ = attention_torch(q, k, v, **args)
    low_grads = torch.autograd.grad(low, (q, k, v), dout)
    label = f"d{head_dim} window={window} softcap={softcap}"
    within_rule(out, ref, low, f"{label} out")
    for name, got, r, lo in zip("qkv", grads, ref_grads, low_grads):
        assert got.shape == r.shape
        within_rule(got, r, lo, f"{label} d{name}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_decode_with_a_window_its_head_dim_lacks(torch, dtype):
    """A windowed decode step at d32 (decode serves d32 without a window) runs padded where a window is."""
    import attngen
    dt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(5)
    d, batch, heads, kv_heads, capacity = 32, 3, 8, 2, 512
    lens = torch.tensor([1, 200, 512], device="cuda", dtype=torch.int32)
    q = torch.randn(batch, heads, 1, d, device="cuda", generator=g).to(dt)
    k, v = (torch.randn(batch, kv_heads, capacity, d, device="cuda", generator=g).to(dt) for _ in range(2))
    out = attngen.attention_with_kvcache(q, k, v, cache_seqlens=lens, window=(64, 0))
    assert out.shape == q.shape
    for b in range(batch):
        n = int(lens[b])
        lo = max(0, n - 1 - 64)   # the new token is key n - 1; it sees the 64 keys before it and itself
        ref, low, _ = reference(torch, q[b:b + 1], k[b:b + 1, :, lo:n], v[b:b + 1, :, lo:n], causal=False)
        within_rule(out[b:b + 1], ref, low, f"sequence {b}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("head_dim", [59, 111])
def test_varlen_at_an_unserved_head_dim(torch, dtype, head_dim):
    """attention_varlen forward and backward: each sequence against its own keys."""
    import attngen
    dt = getattr(torch, dtype)
    lens = [1, 77, 300, 5]
    g = torch.Generator(device="cuda").manual_seed(head_dim)
    total = sum(lens)
    q = torch.randn(total, 4, head_dim, device="cuda", generator=g).to(dt).requires_grad_()
    k, v = (torch.randn(total, 2, head_dim, device="cuda", generator=g).to(dt).requires_grad_() for _ in range(2))
    cu = torch.tensor([0] + list(__import__("itertools").accumulate(lens)), device="cuda", dtype=torch.int32)
    out = attngen.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    assert out.shape == q.shape
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    for i, n in enumerate(lens):
        s = slice(int(cu[i]), int(cu[i + 1]))
        qs, ks, vs = (t[s].detach().transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        ref, low, _ = reference(torch, qs, ks, vs, causal=True)
        within_rule(out[s].detach().transpose(0, 1).unsqueeze(0), ref, low, f"d{head_dim} sequence {i}")
    assert all(gr.shape == t.shape and torch.isfinite(gr).all() for gr, t in zip(grads, (q, k, v)))
    # the gradients against the padded call made by hand: zero columns past head_dim change nothing
    to = 64 if head_dim <= 64 else 128
    pad = lambda t: torch.nn.functional.pad(t.detach(), (0, to - head_dim)).requires_grad_()   # noqa: E731
    qp, kp, vp = pad(q), pad(k), pad(v)
    outp = attngen.attention_varlen(qp, kp, vp, cu, cu, max(lens), max(lens), causal=True, scale=head_dim ** -0.5)
    gp = torch.autograd.grad(outp, (qp, kp, vp), torch.nn.functional.pad(dout, (0, to - head_dim)))
    assert torch.equal(outp[..., :head_dim], out.detach())
    for got, padded in zip(grads, gp):
        assert (got.float() - padded[..., :head_dim].float()).abs().max().item() < 5e-2


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("paged", [False, True])
def test_decode_at_an_unserved_head_dim(torch, dtype, paged):
    import attngen
    dt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(3)
    d, batch, heads, kv_heads, capacity = 111, 3, 8, 2, 512
    lens = torch.tensor([1, 200, 512], device="cuda", dtype=torch.int32)
    q = torch.randn(batch, heads, 1, d, device="cuda", generator=g).to(dt)
    k, v = (torch.randn(batch, kv_heads, capacity, d, device="cuda", generator=g).to(dt) for _ in range(2))
    if paged:
        page = 16
        pages = capacity // page
        order = torch.randperm(batch * pages, device="cuda", generator=g)
        table = order.view(batch, pages).to(torch.int32)
        pool = lambda t: torch.empty(batch * pages, kv_heads, page, d, device="cuda", dtype=dt).index_copy_(   # noqa: E731
            0, order, t.view(batch, kv_heads, pages, page, d).transpose(1, 2).reshape(batch * pages, kv_heads, page, d))
        out = attngen.attention_with_kvcache(q, pool(k), pool(v), cache_seqlens=lens, block_table=table)
    else:
        out = attngen.attention_with_kvcache(q, k, v, cache_seqlens=lens)
    assert out.shape == q.shape
    for b in range(batch):
        n = int(lens[b])
        ref, low, _ = reference(torch, q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], causal=False)
        within_rule(out[b:b + 1], ref, low, f"sequence {b}")


def _varlen_pairs(torch, dtype, d, dv, lens, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = getattr(torch, dtype)
    total = sum(lens)
    q, k = (torch.randn(total, h, d, device="cuda", generator=g).to(dt).requires_grad_() for h in (4, 2))
    v = torch.randn(total, 2, dv, device="cuda", generator=g).to(dt).requires_grad_()
    cu = torch.tensor([0] + list(__import__("itertools").accumulate(lens)), device="cuda", dtype=torch.int32)
    return q, k, v, cu


def within_gradient_rule(got, ref, low, label):
    """The backward's rule (attngen verify's): within twice torch's low-precision error plus the
    rounding floor of the reference in the gradient's dtype."""
    from attngen.eval.verify.backward import rounding_floor
    from attngen.eval.verify.cases import error_bound
    err, low_err = (got.float() - ref.float()).abs().max().item(), (low.float() - ref.float()).abs().max().item()
    bound = error_bound(low_err) + rounding_floor(__import__("torch"), ref.float(), got.dtype)
    assert err <= bound, f"{label}: {err:.3g} > {bound:.3g} (torch {low_err:.3g})"


def _gradients_against_fp32(torch, q, k, v, dout, causal, label):
    """(out, grads) of attngen.attention against the fp32 reference and torch's own low precision."""
    import attngen
    from attngen.eval.verify.cases import attention_torch, exact_fp32_matmul
    out = attngen.attention(q, k, v, causal=causal)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    args = dict(scale=q.shape[-1] ** -0.5, mask="causal" if causal else "none",
                alignment="top_left" if causal else None)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    with exact_fp32_matmul(torch):
        ref, _ = attention_torch(q32, k32, v32, **args)
        ref_grads = torch.autograd.grad(ref, (q32, k32, v32), dout.float())
    low, _ = attention_torch(q, k, v, **args)
    low_grads = torch.autograd.grad(low, (q, k, v), dout)
    assert out.shape == q.shape[:-1] + (v.shape[-1],)
    within_rule(out, ref, low, f"{label} out")
    for name, got, r, lo in zip("qkv", grads, ref_grads, low_grads):
        assert got.shape == r.shape
        within_gradient_rule(got, r, lo, f"{label} d{name}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d,dv", [(96, 64), (256, 128), (64, 128)])
@pytest.mark.parametrize("causal", [False, True])
def test_training_with_a_v_head_dim_of_its_own(torch, dtype, d, dv, causal):
    """A V head dim the table has no pair for runs padded to a served pair (ops.table.padded_dims: 96/64
    at 96/96, 256/128 at 256/256, 64/128 at 128/128): out (V's head dim) and every gradient against
    the fp32 reference under the error rule."""
    g = torch.Generator(device="cuda").manual_seed(d + dv)
    dt = getattr(torch, dtype)
    q, k = (torch.randn(2, h, 193, d, device="cuda", generator=g).to(dt).requires_grad_() for h in (8, 2))
    v = torch.randn(2, 2, 193, dv, device="cuda", generator=g).to(dt).requires_grad_()
    dout = torch.randn(2, 8, 193, dv, device="cuda", generator=g).to(dt)
    _gradients_against_fp32(torch, q, k, v, dout, causal, f"{d}/{dv}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d,dv", [(96, 64), (128, 64), (192, 128), (256, 128)])
def test_varlen_training_with_a_v_head_dim_of_its_own(torch, dtype, d, dv):
    """attention_varlen at a (head_dim, head_dim_v) pair its varlen backward has no kernel of (every
    pair but d == dv): forward and gradients, sequence by sequence, against the padded call's own
    figures and the fp32 reference."""
    import attngen
    from attngen.eval.verify.cases import attention_torch, exact_fp32_matmul
    lens = [1, 77, 300, 5]
    q, k, v, cu = _varlen_pairs(torch, dtype, d, dv, lens, d * 3 + dv)
    out = attngen.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    assert out.shape == q.shape[:-1] + (dv,)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    for i in range(len(lens)):
        s = slice(int(cu[i]), int(cu[i + 1]))
        qs, ks, vs, ds = (t[s].detach().transpose(0, 1).unsqueeze(0) for t in (q, k, v, dout))
        ks, vs = ks.repeat_interleave(2, dim=1), vs.repeat_interleave(2, dim=1)
        args = dict(scale=d ** -0.5, mask="causal", alignment="bottom_right")
        q32, k32, v32 = (t.float().requires_grad_() for t in (qs, ks, vs))
        with exact_fp32_matmul(torch):
            ref, _ = attention_torch(q32, k32, v32, **args)
            rq, rk, rv = torch.autograd.grad(ref, (q32, k32, v32), ds.float())
        ql, kl, vl = (t.clone().requires_grad_() for t in (qs, ks, vs))
        low, _ = attention_torch(ql, kl, vl, **args)
        lq, lk, lv = torch.autograd.grad(low, (ql, kl, vl), ds)
        fold = lambda t: t.view(1, 2, 2, *t.shape[2:]).sum(2)   # noqa: E731  (GQA: the group's sum)
        within_rule(out[s].detach().transpose(0, 1).unsqueeze(0), ref, low, f"{d}/{dv} sequence {i} out")
        for name, got, r, lo in (("dq", grads[0], rq, lq), ("dk", grads[1], fold(rk), fold(lk.float())),
                                 ("dv", grads[2], fold(rv), fold(lv.float()))):
            within_gradient_rule(got[s].transpose(0, 1).unsqueeze(0), r, lo, f"{d}/{dv} sequence {i} {name}")
