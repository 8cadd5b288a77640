"""attention_varlen with the variants (window, softcap, ALiBi, learned sinks): each sequence against
its own keys, checked sequence by sequence against the fp32 reference under the error rule, in both
dtypes and at the head dims the table serves them; with gradients the call is refused clearly."""
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
    "alibi": ((64, 128), {"alibi_slopes": "slopes"}),
    "sinks": ((64,), {"causal": True, "sinks": "sinks"}),
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
        if kwargs.get("alibi_slopes") == "slopes":
            kwargs["alibi_slopes"] = torch.rand(heads, device="cuda") * 0.3
        if kwargs.get("sinks") == "sinks":
            kwargs["sinks"] = torch.randn(heads, device="cuda") * 2
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


def test_varlen_variants_refuse_gradients(torch):
    import attngen
    q, k, v, cu = sequences(torch, torch.float16, 64)
    with pytest.raises(NotImplementedError, match="no backward for attention_varlen with window"):
        attngen.attention_varlen(q.requires_grad_(), k, v, cu, cu, max(LENS), max(LENS), causal=True, window=(8, 0))


def test_varlen_variants_compile_without_a_graph_break(torch):
    import attngen
    q, k, v, cu = sequences(torch, torch.float16, 64)
    slopes = torch.rand(q.shape[1], device="cuda") * 0.3

    def call(q, k, v, cu):
        return attngen.attention_varlen(q, k, v, cu, cu, max(LENS), max(LENS), alibi_slopes=slopes)

    eager = call(q, k, v, cu)
    compiled = torch.compile(call, fullgraph=True)(q, k, v, cu)
    assert torch.equal(eager, compiled)
