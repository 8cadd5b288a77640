"""attention_varlen with the variants (window, softcap, ALiBi, learned sinks): each sequence against
its own keys, checked sequence by sequence against the fp32 reference under the error rule, in both
dtypes and at the head dims the table serves them; with gradients, the gradients too."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

LENS = [100, 1, 513, 37]     # sequences of different lengths, one of a single row


@pytest.fixture
def torch():
    import torch
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the committed dispatch table measures sm_90 (H100/H200) for every call")
    return torch


def sequences(torch, dtype, d, heads=8, kv_heads=2):
    from attngen.runtime.calls.varlen import cu_seqlens
    total = sum(LENS)
    g = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn(total, heads, d, device="cuda", generator=g).to(dtype)
    k, v = (torch.randn(total, kv_heads, d, device="cuda", generator=g).to(dtype) for _ in range(2))
    return q, k, v, cu_seqlens(torch, LENS, "cuda")


CASES = {   # name -> (head dims, attention_varlen keywords but the tensors, the reference's mask and modifiers)
    "window": ((64, 128, 256), {"causal": True, "window": (32, 0)}),
    "window_two_sided": ((64, 128, 256), {"window": (40, 17)}),
    "softcap": ((64, 128, 256), {"causal": True, "softcap": 30.0}),
    "softcap_non_causal": ((256,), {"softcap": 30.0}),
    "alibi": ((64, 128, 256), {"alibi_slopes": "slopes"}),
    "alibi_window": ((64, 128, 256), {"causal": True, "window": (40, 0), "alibi_slopes": "slopes"}),
    "sinks": ((64, 128, 256), {"causal": True, "sinks": "sinks"}),
    "sinks_window": ((128, 256), {"causal": True, "window": (40, 0), "sinks": "sinks"}),
    "softcap_alibi": ((64, 128, 256), {"softcap": 30.0, "alibi_slopes": "slopes"}),
    "softcap_alibi_window": ((64, 128, 256), {"causal": True, "window": (40, 0), "softcap": 30.0,
                                              "alibi_slopes": "slopes"}),
    # sinks beside modifiers no sink kernel has: the kernel of the others, the sinks joined after it
    "softcap_sinks": ((64, 256), {"causal": True, "softcap": 30.0, "sinks": "sinks"}),
    "softcap_alibi_sinks_window": ((128,), {"causal": True, "window": (40, 0), "softcap": 30.0,
                                            "alibi_slopes": "slopes", "sinks": "sinks"}),
}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", list(CASES))
def test_varlen_variants_match_the_reference(torch, dtype, case):
    import attngen
    from attngen.core.variants import ALIBI, SINK, SOFTCAP, call_mask
    from attngen.eval.verify.cases import error_bound, exact_fp32_matmul, attention_torch
    dims, kwargs = CASES[case]
    for d in dims:
        q, k, v, cu = sequences(torch, getattr(torch, dtype), d)
        heads = q.shape[1]
        kwargs = dict(kwargs)
        g = torch.Generator(device="cuda").manual_seed(7 + d)
        if kwargs.get("alibi_slopes") == "slopes":
            kwargs["alibi_slopes"] = torch.rand(heads, device="cuda", generator=g) * 0.3
        if kwargs.get("sinks") == "sinks":
            kwargs["sinks"] = torch.randn(heads, device="cuda", generator=g) * 2
        o, lse = attngen.attention_varlen(q, k, v, cu, cu, max(LENS), max(LENS), return_lse=True, **kwargs)
        window = kwargs.get("window")
        mask = call_mask(kwargs.get("causal", False), window)
        modifiers = tuple((variant, kwargs[variant.argument]) for variant in (SOFTCAP, ALIBI, SINK)
                          if kwargs.get(variant.argument) is not None)
        at = 0
        for n in LENS:
            t = lambda x: x[at:at + n].transpose(0, 1)[None]   # noqa: E731  (1, H, n, d)
            args = dict(scale=d ** -0.5, mask=mask, alignment="top_left" if mask != "none" else None,
                        window=window, modifiers=modifiers)
            with exact_fp32_matmul(torch):
                ref, ref_lse = attention_torch(t(q).float(), t(k).float(), t(v).float(), **args)
            low, _ = attention_torch(t(q), t(k), t(v), **args)
            err, low_err = (t(o).float() - ref).abs().max().item(), (low.float() - ref).abs().max().item()
            assert err <= error_bound(low_err), f"{case} d{d} sequence of {n}: {err:.3g} > {error_bound(low_err):.3g}"
            got_lse = lse[:, at:at + n][None]
            seen = torch.isfinite(ref_lse)
            assert torch.equal(seen, torch.isfinite(got_lse))
            assert (got_lse[seen] - ref_lse[seen]).abs().max().item() < 1e-2
            at += n


TRAIN = {   # name -> (head dims (96: padded to 128), attention_varlen keywords but the tensors)
    "window": ((64, 96, 128, 256), {"causal": True, "window": (32, 0)}),
    "window_two_sided": ((64, 256), {"window": (40, 17)}),
    "softcap": ((64, 128, 256), {"causal": True, "softcap": 30.0}),
    "window_softcap": ((96, 256), {"causal": True, "window": (48, 0), "softcap": 50.0}),
    "alibi": ((64, 128, 256), {"causal": True, "alibi_slopes": "slopes"}),
    "alibi_window": ((64, 128, 256), {"causal": True, "window": (48, 0), "alibi_slopes": "slopes"}),
    "softcap_alibi": ((64, 128, 256), {"causal": True, "softcap": 30.0, "alibi_slopes": "slopes"}),
    "softcap_alibi_window": ((64, 128, 256), {"causal": True, "window": (48, 0), "softcap": 30.0,
                                              "alibi_slopes": "slopes"}),
    # non-causal ALiBi at d160-d256: the varlen backward's window function, with a window wider than
    # every sequence (ops.library.varlen_backward_mask), since mask none's would spill
    "alibi_non_causal": ((160, 256), {"alibi_slopes": "slopes"}),
    "softcap_alibi_non_causal": ((256,), {"softcap": 30.0, "alibi_slopes": "slopes"}),
    "sinks": ((64, 128, 256), {"causal": True, "sinks": "sinks"}),
    # sinks beside softcap or ALiBi: the *_sink members' varlen functions, the sinks trained; frozen too
    "alibi_sinks": ((64, 128), {"causal": True, "alibi_slopes": "slopes", "sinks": "sinks"}),
    "window_softcap_sinks": ((96,), {"causal": True, "window": (48, 0), "softcap": 30.0, "sinks": "sinks"}),
    "softcap_alibi_sinks_frozen": ((256,), {"causal": True, "softcap": 30.0, "alibi_slopes": "slopes",
                                            "sinks": "frozen"}),
}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", list(TRAIN))
def test_varlen_variants_train(torch, dtype, case):
    """attention_varlen with a variant on tensors that need gradients: out sequence by sequence, and dq,
    dk, dv (and learned sinks' gradient) over the batch, against autograd through the fp32 reference
    under the backward's rule (twice torch's low-precision error plus the reference's rounding floor).
    Gradients are judged over the batch, as FlashAttention's varlen tests judge them: with sinks, a
    one-row sequence's dq and dk are not zero, and torch's own error on that one row can be near zero
    by chance (measured on the H200 over 8 seeds: up to 0.8 of the bound per sequence, at most 0.37
    over the batch; once 1.27 per sequence)."""
    import attngen
    from attngen.core.variants import ALIBI, SINK, SOFTCAP, call_mask
    from attngen.eval.verify.backward import rounding_floor, sink_output_error
    from attngen.eval.verify.cases import attention_torch, error_bound, exact_fp32_matmul
    dims, kwargs = TRAIN[case]
    dt = getattr(torch, dtype)
    for d in dims:
        q, k, v, cu = sequences(torch, dt, d)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        heads = q.shape[1]
        call = dict(kwargs)
        g = torch.Generator(device="cuda").manual_seed(7 + d)
        if call.get("alibi_slopes") == "slopes":
            call["alibi_slopes"] = torch.rand(heads, device="cuda", generator=g) * 0.3
        if call.get("sinks") in ("sinks", "frozen"):
            sinks = torch.randn(heads, device="cuda", generator=g) * 2
            call["sinks"] = sinks.requires_grad_(call["sinks"] == "sinks")
        o = attngen.attention_varlen(q, k, v, cu, cu, max(LENS), max(LENS), **call)
        dout = torch.randn(o.shape, device="cuda", generator=g).to(o.dtype)
        trains_sinks = "sinks" in call and call["sinks"].requires_grad
        leaves = (q, k, v) + ((call["sinks"],) if trains_sinks else ())
        grads = torch.autograd.grad(o, leaves, dout)
        window = call.get("window")
        mask = call_mask(call.get("causal", False), window)
        sink_ref = sink_low = sink_by_output = 0.0
        batch = {name: [0.0, 0.0, 0.0] for name in ("dq", "dk", "dv")}   # max error, torch's, floor
        at = 0
        for n in LENS:
            def t(x):
                return x.detach()[at:at + n].transpose(0, 1)[None]    # (1, H, n, d)
            refs, lows = [], []
            for precise in (True, False):
                xs = [(t(x).float() if precise else t(x)).requires_grad_() for x in (q, k, v)]
                sinks = call.get("sinks")
                sinks = None if sinks is None else sinks.detach().float().requires_grad_()
                modifiers = tuple((variant, sinks if variant is SINK else call[variant.argument])
                                  for variant in (SOFTCAP, ALIBI, SINK) if call.get(variant.argument) is not None)
                args = dict(scale=d ** -0.5, mask=mask, alignment="top_left" if mask != "none" else None,
                            window=window, modifiers=modifiers)
                with exact_fp32_matmul(torch):
                    out, lse = attention_torch(*xs, **args)
                    got = torch.autograd.grad(out, xs + ([sinks] if sinks is not None else []), t(dout).to(out.dtype))
                (refs if precise else lows).append((out, got, lse, sinks))
            (ref, ref_grads, ref_lse, ref_sinks), (low, low_grads, _, _) = refs[0], lows[0]
            label = f"{case} d{d} sequence of {n}"
            err, low_err = (t(o).float() - ref).abs().max().item(), (low.float() - ref).abs().max().item()
            assert err <= error_bound(low_err), f"{label} out: {err:.3g} > {error_bound(low_err):.3g}"
            for name, got, r, lo in zip(("dq", "dk", "dv"), grads[:3], ref_grads[:3], low_grads[:3]):
                g = t(got).float()
                worst = batch[name]
                worst[0] = max(worst[0], (g - r).abs().max().item())
                worst[1] = max(worst[1], (lo.float() - r).abs().max().item())
                worst[2] = max(worst[2], rounding_floor(torch, r, dt))
            if trains_sinks:
                sink_ref, sink_low = sink_ref + ref_grads[3], sink_low + low_grads[3]
                sink_by_output = sink_by_output + sink_output_error(torch, t(dout), low.detach(), ref.detach(),
                                                                    ref_lse.detach(), ref_sinks.detach())
            at += n
        if trains_sinks:
            err = (grads[3].float() - sink_ref).abs().max().item()
            # torch's error by its autograd or by its output, the larger (verify's rule for d sink)
            low_err = max((sink_low.float() - sink_ref).abs().max().item(), sink_by_output.abs().max().item())
            assert err <= error_bound(low_err) + 1e-3, f"{case} d{d} dsinks: {err:.3g} (torch {low_err:.3g})"
        for name, (err, low_err, floor) in batch.items():
            bound = error_bound(low_err) + floor
            assert err <= bound, f"{case} d{d} {name}: {err:.3g} > {bound:.3g} (torch {low_err:.3g})"


def test_varlen_variants_compile_without_a_graph_break(torch):
    import attngen
    q, k, v, cu = sequences(torch, torch.float16, 64)
    slopes = torch.rand(q.shape[1], device="cuda") * 0.3

    def call(q, k, v, cu):
        return attngen.attention_varlen(q, k, v, cu, cu, max(LENS), max(LENS), alibi_slopes=slopes)

    eager = call(q, k, v, cu)
    compiled = torch.compile(call, fullgraph=True)(q, k, v, cu)
    assert torch.equal(eager, compiled)
