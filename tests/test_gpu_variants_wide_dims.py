"""Variants beyond d64 and d128 and in combination, through the entry points: learned sinks at d128
and d256 and ALiBi at d256, each with or without a window; ALiBi under a window at d64 and d128;
softcap with ALiBi at d64-d256, with or without a window (FlashAttention's tests combine all
three), in training and in decode; learned sinks beside softcap or ALiBi (joined after the kernel of the
others). In a training step through attngen.attention (out, dq, dk, dv and the sinks' gradient
against autograd through the fp32 reference, under the backward's rule) and in a decode step
through attngen.attention_with_kvcache (contiguous and paged caches), fp16 and bf16. Head dims 96,
160 and 192 take the next served kernels padded (attngen dispatch says so)."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture
def torch():
    import torch
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the committed dispatch table measures sm_90 (H100/H200) for every call")
    return torch


TRAIN = {   # name -> (head dims, attention() keywords but the tensors)
    "sinks": ((128, 256), {"causal": True, "sinks": "sinks"}),
    "sinks_window": ((128, 192), {"causal": True, "window": (100, 0), "sinks": "sinks"}),
    "alibi": ((160, 256), {"alibi_slopes": "slopes"}),
    "alibi_causal": ((256,), {"causal": True, "alibi_slopes": "slopes"}),
    "alibi_window": ((64, 128, 256), {"causal": True, "window": (100, 0), "alibi_slopes": "slopes"}),
    "alibi_two_sided_window": ((96, 256), {"window": (60, 20), "alibi_slopes": "slopes"}),
    "softcap_alibi": ((256,), {"softcap": 30.0, "alibi_slopes": "slopes"}),
    "softcap_alibi_window": ((64, 128, 256), {"causal": True, "window": (100, 0), "softcap": 30.0,
                                              "alibi_slopes": "slopes"}),
    # sinks beside softcap, ALiBi or both: the *_sink members, the sinks trained; frozen sinks as well
    # (sinks that need no gradient, beside gradients in q, k and v)
    "softcap_sinks": ((64, 128), {"causal": True, "softcap": 30.0, "sinks": "sinks"}),
    "alibi_sinks_window": ((64, 256), {"causal": True, "window": (100, 0), "alibi_slopes": "slopes",
                                       "sinks": "sinks"}),
    "softcap_alibi_sinks": ((96,), {"softcap": 30.0, "alibi_slopes": "slopes", "sinks": "sinks"}),
    "softcap_alibi_sinks_frozen": ((160,), {"causal": True, "softcap": 30.0, "alibi_slopes": "slopes",
                                            "sinks": "frozen"}),
}


def _fill(torch, call, heads, grad, generator):
    call = dict(call)
    if call.get("alibi_slopes") == "slopes":
        call["alibi_slopes"] = torch.rand(heads, device="cuda", generator=generator) * 0.3
    if call.get("sinks") in ("sinks", "frozen"):
        sinks = torch.randn(heads, device="cuda", generator=generator) * 2
        call["sinks"] = sinks.requires_grad_(grad and call["sinks"] == "sinks")
    return call


def _modifiers(call, sinks):
    from attngen.core.variants import ALIBI, SINK, SOFTCAP
    return tuple((variant, sinks if variant is SINK else call[variant.argument])
                 for variant in (SOFTCAP, ALIBI, SINK) if call.get(variant.argument) is not None)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", list(TRAIN))
def test_training_step_with_wide_variants(torch, dtype, case):
    import attngen
    from attngen.core.variants import call_mask
    from attngen.eval.verify.backward import rounding_floor, sink_output_error
    from attngen.eval.verify.cases import attention_torch, error_bound, exact_fp32_matmul
    dims, kwargs = TRAIN[case]
    dt = getattr(torch, dtype)
    for d in dims:
        g = torch.Generator(device="cuda").manual_seed(d)
        q = torch.randn(2, 4, 333, d, device="cuda", generator=g).to(dt).requires_grad_()
        k, v = (torch.randn(2, 2, 333, d, device="cuda", generator=g).to(dt).requires_grad_() for _ in range(2))
        call = _fill(torch, kwargs, 4, True, g)
        o = attngen.attention(q, k, v, **call)
        dout = torch.randn(o.shape, device="cuda", generator=g).to(o.dtype)
        leaves = (q, k, v) + ((call["sinks"],) if "sinks" in call and call["sinks"].requires_grad else ())
        grads = torch.autograd.grad(o, leaves, dout)
        window = call.get("window")
        mask = call_mask(call.get("causal", False), window)
        results = []
        for precise in (True, False):
            xs = [(x.detach().float() if precise else x.detach()).requires_grad_() for x in (q, k, v)]
            sinks = call["sinks"].detach().float().requires_grad_() if "sinks" in call else None
            with exact_fp32_matmul(torch):
                out, lse = attention_torch(*xs, scale=d ** -0.5, mask=mask, window=window,
                                         alignment="top_left" if mask != "none" else None,
                                         modifiers=_modifiers(call, sinks))
                got = torch.autograd.grad(out, xs + ([sinks] if sinks is not None else []), dout.to(out.dtype))
            results.append((out, got, lse, sinks))
        (ref, ref_grads, ref_lse, ref_sinks), (low, low_grads, _, _) = results
        label = f"{case} d{d} {dtype}"
        err, low_err = (o.float() - ref).abs().max().item(), (low.float() - ref).abs().max().item()
        assert err <= error_bound(low_err), f"{label} out: {err:.3g} > {error_bound(low_err):.3g}"
        for name, got, r, lo in zip(("dq", "dk", "dv", "dsinks"), grads, ref_grads, low_grads):
            err, low_err = (got.float() - r).abs().max().item(), (lo.float() - r).abs().max().item()
            if name == "dsinks":   # torch's error by its autograd or by its output, the larger (verify's rule)
                by_output = sink_output_error(torch, dout, low.detach(), ref.detach(), ref_lse.detach(), ref_sinks.detach())
                low_err = max(low_err, by_output.abs().max().item())
            bound = error_bound(low_err) + rounding_floor(torch, r, dt) + (1e-3 if name == "dsinks" else 0)
            assert err <= bound, f"{label} {name}: {err:.3g} > {bound:.3g} (torch {low_err:.3g})"


DECODE = {   # name -> (head dims, attention_with_kvcache() keywords but the tensors)
    "sinks": ((128, 256), {"sinks": "sinks"}),
    "sinks_window": ((128, 256), {"window": (300, 0), "sinks": "sinks"}),
    "alibi": ((256,), {"alibi_slopes": "slopes"}),
    "alibi_window": ((128, 192), {"window": (300, 0), "alibi_slopes": "slopes"}),
    "softcap_window": ((96, 128), {"window": (300, 0), "softcap": 30.0}),
    "softcap_alibi": ((64, 128, 256), {"softcap": 30.0, "alibi_slopes": "slopes"}),
    "softcap_alibi_window": ((128, 160), {"window": (300, 0), "softcap": 30.0, "alibi_slopes": "slopes"}),
    "softcap_sinks": ((128, 256), {"softcap": 30.0, "sinks": "sinks"}),
    "softcap_alibi_sinks_window": ((64, 128), {"window": (300, 0), "softcap": 30.0, "alibi_slopes": "slopes",
                                               "sinks": "sinks"}),
}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", list(DECODE))
def test_decode_step_with_wide_variants(torch, dtype, case):
    import attngen
    from attngen.eval.verify.cases import error_bound
    from attngen.eval.verify.decode import DecodeCase, paged_cache, reference
    dims, kwargs = DECODE[case]
    dt = getattr(torch, dtype)
    lengths = (1100, 333, 1)
    lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    for d in dims:
        g = torch.Generator(device="cuda").manual_seed(d)
        q = torch.randn(3, 16, 1, d, device="cuda", generator=g).to(dt)
        k, v = (torch.randn(3, 8, 1100, d, device="cuda", generator=g).to(dt) for _ in range(2))
        call = _fill(torch, kwargs, 16, False, g)
        window = call.get("window")
        case_ = DecodeCase(3, 16, 8, 1, 1100, lengths, causal=True, window=window)
        ref, _, low = reference(torch, q, k, v, lengths, case_, d ** -0.5, _modifiers(call, call.get("sinks")))
        bound = error_bound((low.float() - ref).abs().max().item())
        kp, vp, table = paged_cache(torch, k, v, lengths, 16, "bhsd")
        for kc, vc, tb in ((k, v, None), (kp, vp, table)):
            out = attngen.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=tb, causal=True, **call)
            err = (out.float() - ref).abs().max().item()
            assert err <= bound, f"{case} d{d} {dtype} paged={tb is not None}: {err:.3g} > {bound:.3g}"


def test_joined_sinks_refuse_their_gradient(torch, monkeypatch):
    """Learned sinks beside modifiers whose kernels lack them are joined after the kernel of those (the
    committed table has *_sink members for every forward combination, so a table without them is
    stood in for: DISPATCH.sinks_apart says so); their own gradient is refused by name
    (ops.library.refuse_joined_sinks_gradient), q, k and v train."""
    import attngen
    from attngen.ops import library
    monkeypatch.setattr(library.DISPATCH, "sinks_apart", lambda *args, **kw: True)
    q = torch.randn(1, 4, 61, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(1, 2, 61, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    sinks = torch.randn(4, device="cuda", requires_grad=True)
    slopes = torch.rand(4, device="cuda") * 0.3
    monkeypatch.setattr(library, "_TRAIN", {})
    for _ in range(2):   # the second call finds the key marked joined (library._JOINED) and refuses again
        with pytest.raises(NotImplementedError, match="learned sinks and alibi"):
            attngen.attention(q, k, v, causal=True, alibi_slopes=slopes, sinks=sinks)
    assert list(library._TRAIN.values()) == [library._JOINED]
    for _ in range(2):
        o = attngen.attention(q, k, v, causal=True, alibi_slopes=slopes, sinks=sinks.detach())
        assert all(g is not None for g in torch.autograd.grad(o.sum(), (q, k, v)))
