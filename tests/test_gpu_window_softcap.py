"""A sliding window with a logit softcap (Gemma 2's local layers: cap * tanh(scale s / cap) under a
window of 4096 keys), through attngen.attention at d64, d128 and d256 and attention_varlen at d64,
d128 and d256, in fp16 and bf16: the dispatch table serves each call, and its output and LSE pass the
error rule against the fp32 reference of the same variant definitions. At d256 the softcap spec serves
Gemma 2's global (causal) layers too, and a window without softcap (Gemma 3's local layers) has a
spec of its own."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture
def torch():
    import torch
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the committed dispatch table serves window x softcap on sm_90 (H100/H200)")
    return torch


def check(torch, out, lse, q, k, v, *, causal, window, softcap, label):
    """out and lse (B, H, S, D) against the fp32 reference, within twice torch's own error in q's dtype."""
    from attngen.core.variants import SOFTCAP, call_mask
    from attngen.eval.verify.cases import attention_torch, error_bound, exact_fp32_matmul
    mask = call_mask(causal, window)
    args = dict(scale=q.shape[-1] ** -0.5, mask=mask, alignment="top_left" if mask != "none" else None,
                window=None if window is None else (window[0], 0 if causal else window[1]),
                modifiers=((SOFTCAP, softcap),) if softcap is not None else ())
    with exact_fp32_matmul(torch):
        ref, ref_lse = attention_torch(q.float(), k.float(), v.float(), **args)
    low, _ = attention_torch(q, k, v, **args)
    err, low_err = (out.float() - ref).abs().max().item(), (low.float() - ref).abs().max().item()
    assert err <= error_bound(low_err), f"{label}: {err:.3g} > {error_bound(low_err):.3g} (torch {low_err:.3g})"
    seen = torch.isfinite(ref_lse)
    assert torch.equal(seen, torch.isfinite(lse)), label
    assert (lse[seen] - ref_lse[seen]).abs().max().item() < 1e-2, label


CALLS = {   # name -> (causal, window): a causal window, a two-sided one, one wider than the sequence
    "causal_window": (True, (100, 0)),
    "two_sided": (False, (60, 33)),
    "left_open": (False, (-1, 20)),
    "wider": (True, (5000, 0)),
}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("call", list(CALLS))
def test_attention_with_window_and_softcap(torch, dtype, head_dim, call):
    import attngen
    causal, window = CALLS[call]
    g = torch.Generator(device="cuda").manual_seed(head_dim)
    dt = getattr(torch, dtype)
    q = torch.randn(2, 8, 333, head_dim, device="cuda", generator=g).to(dt)
    k, v = (torch.randn(2, 2, 333, head_dim, device="cuda", generator=g).to(dt) for _ in range(2))
    out, lse = attngen.attention(q, k, v, causal=causal, window=window, softcap=4.0, return_lse=True)
    check(torch, out, lse, q, k, v, causal=causal, window=window, softcap=4.0, label=f"d{head_dim} {call}")
    # bshd: the same call on (B, S, H, D) views
    t = lambda x: x.transpose(1, 2).contiguous()   # noqa: E731
    out_s, lse_s = attngen.attention(t(q), t(k), t(v), causal=causal, window=window, softcap=4.0, layout="bshd",
                                     return_lse=True)
    check(torch, out_s.transpose(1, 2), lse_s, q, k, v, causal=causal, window=window, softcap=4.0,
          label=f"d{head_dim} {call} bshd")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True])
def test_d256_softcap_without_a_window(torch, dtype, causal):
    import attngen
    g = torch.Generator(device="cuda").manual_seed(1)
    dt = getattr(torch, dtype)
    q, k, v = (torch.randn(1, 4, 517, 256, device="cuda", generator=g).to(dt) for _ in range(3))
    out, lse = attngen.attention(q, k, v, causal=causal, softcap=30.0, return_lse=True)
    check(torch, out, lse, q, k, v, causal=causal, window=None, softcap=30.0, label=f"causal={causal}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("call", ["causal_window", "two_sided"])
def test_d256_window_without_softcap(torch, dtype, call):
    """Gemma 3 12B's local layers (d256, 16 query heads on 8 KV heads, scale 1/16, a window and no
    softcap): the window spec at d256, in both layouts."""
    import attngen
    causal, window = CALLS[call]
    g = torch.Generator(device="cuda").manual_seed(3)
    dt = getattr(torch, dtype)
    q = torch.randn(1, 16, 517, 256, device="cuda", generator=g).to(dt)
    k, v = (torch.randn(1, 8, 517, 256, device="cuda", generator=g).to(dt) for _ in range(2))
    out, lse = attngen.attention(q, k, v, causal=causal, window=window, return_lse=True)
    check(torch, out, lse, q, k, v, causal=causal, window=window, softcap=None, label=call)
    t = lambda x: x.transpose(1, 2).contiguous()   # noqa: E731
    out_s, lse_s = attngen.attention(t(q), t(k), t(v), causal=causal, window=window, layout="bshd", return_lse=True)
    check(torch, out_s.transpose(1, 2), lse_s, q, k, v, causal=causal, window=window, softcap=None,
          label=f"{call} bshd")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gemma2_local_and_global_layers(torch, dtype):
    """Gemma 2 9B's attention shape (d256, 16 query heads on 8 KV heads, scale 1/16, softcap 50): a
    local layer (causal, 4096-key window) over 4500 tokens, so the window bounds it, and a global one."""
    import attngen
    g = torch.Generator(device="cuda").manual_seed(2)
    dt = getattr(torch, dtype)
    q = torch.randn(1, 16, 4500, 256, device="cuda", generator=g).to(dt)
    k, v = (torch.randn(1, 8, 4500, 256, device="cuda", generator=g).to(dt) for _ in range(2))
    for window in ((4096, 0), None):
        out, lse = attngen.attention(q, k, v, causal=True, window=window, softcap=50.0, scale=1 / 16,
                                     return_lse=True)
        check(torch, out, lse, q, k, v, causal=True, window=window, softcap=50.0, label=f"window={window}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_varlen_with_window_and_softcap(torch, dtype, head_dim):
    import attngen
    from attngen.runtime.calls.varlen import cu_seqlens
    lens = [100, 1, 513, 37]
    g = torch.Generator(device="cuda").manual_seed(5)
    dt = getattr(torch, dtype)
    q = torch.randn(sum(lens), 8, head_dim, device="cuda", generator=g).to(dt)
    k, v = (torch.randn(sum(lens), 2, head_dim, device="cuda", generator=g).to(dt) for _ in range(2))
    cu = cu_seqlens(torch, lens, "cuda")
    for causal, window in ((True, (32, 0)), (False, (40, 17))):
        o, lse = attngen.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=causal, window=window,
                                          softcap=30.0, return_lse=True)
        at = 0
        for n in lens:
            t = lambda x: x[at:at + n].transpose(0, 1)[None]   # noqa: E731  (1, H, n, d)
            check(torch, t(o), lse[:, at:at + n][None], t(q), t(k), t(v), causal=causal, window=window,
                  softcap=30.0, label=f"d{head_dim} window={window} sequence of {n}")
            at += n
