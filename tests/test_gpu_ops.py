"""GPU tests of the library entry points and their torch ops: attngen.attention,
attention_varlen and attention_with_kvcache pick a kernel from the dispatch table and pass the
error rule; the ops pass torch.library.opcheck; a transformer block compiled with
torch.compile(fullgraph=True) runs through the ops (also under CUDA graphs) and matches eager."""
from __future__ import annotations

from pathlib import Path

import pytest

import attngen
from attngen.eval.verify import attention_torch, error_bound, exact_fp32_matmul

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def torch():
    import torch
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the committed dispatch table measures sm_90 (H100/H200) for every call")
    return torch


def randn(torch, *shape, dtype=None):
    return torch.randn(*shape, device="cuda", dtype=dtype or torch.float16)


def check(torch, out, q, k, v, causal=False, alignment=None):
    with exact_fp32_matmul(torch):
        ref, _ = attention_torch(q.float(), k.float(), v.float(), scale=q.shape[-1] ** -0.5,
                                 mask="causal" if causal else "none", alignment=alignment)
    low, _ = attention_torch(q, k, v, scale=q.shape[-1] ** -0.5, mask="causal" if causal else "none",
                             alignment=alignment)
    err = (out.float() - ref).abs().max().item()
    assert err <= error_bound((low.float() - ref).abs().max().item()), err


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("seqlen", [300, 3000, 9000])
def test_attention_picks_a_kernel_that_passes(torch, dtype, d, seqlen):
    dt = getattr(torch, dtype)
    q, k, v = randn(torch, 1, 4, seqlen, d, dtype=dt), randn(torch, 1, 2, seqlen, d, dtype=dt), \
        randn(torch, 1, 2, seqlen, d, dtype=dt)
    for causal in (False, True):
        check(torch, attngen.attention(q, k, v, causal=causal), q, k, v, causal)
    o, lse = attngen.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), layout="bshd",
                               return_lse=True)
    check(torch, o.transpose(1, 2), q, k, v)
    assert lse.shape == (1, 4, seqlen) and lse.dtype == torch.float32


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_attention_with_its_own_v_head_dim(torch, dtype):
    """DeepSeek MLA's prefill shape: Q and K of head dim 192, V of 128. The table's head_dim_v entry
    serves it (both layouts, both masks, the prepared path of a repeated call), the output has V's
    head dim, and the op's fake gives the same shape (opcheck)."""
    dt = getattr(torch, dtype)
    q, k, v = randn(torch, 2, 4, 700, 192, dtype=dt), randn(torch, 2, 2, 900, 192, dtype=dt), \
        randn(torch, 2, 2, 900, 128, dtype=dt)
    for causal in (False, True, False):   # the third call takes the prepared path
        out = attngen.attention(q, k, v, causal=causal)
        assert out.shape == (2, 4, 700, 128)
        check(torch, out, q, k, v, causal)
    o, lse = attngen.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), layout="bshd",
                               return_lse=True)
    assert o.shape == (2, 700, 4, 128) and lse.shape == (2, 4, 700)
    check(torch, o.transpose(1, 2), q, k, v)
    torch.library.opcheck(torch.ops.attngen.attention.default, (q, k, v, True, None, None, "bhsd"))
    kernel = attngen.load(ROOT / "specs" / f"h100_wgmma_d192_v128{'_bf16' if dtype == 'bfloat16' else ''}.yaml")
    with pytest.raises(ValueError, match="v has head_dim 192 but .* is generated for head_dim_v 128"):
        kernel(q, k, k)
    with pytest.raises(ValueError, match="out has head_dim 192 but .* head_dim_v 128"):
        kernel(q, k, v, out=torch.empty_like(q))


def test_repeated_calls_take_the_prepared_path_and_still_check_pointers(torch):
    """The second call of a shape goes straight to the kernel's prepared call: new inputs give their
    own output (not the first call's), and an input that is not 16-byte aligned takes the full
    path, which refuses it."""
    q, k, v = randn(torch, 1, 4, 700, 64), randn(torch, 1, 4, 700, 64), randn(torch, 1, 4, 700, 64)
    first = attngen.attention(q, k, v, causal=True)
    q2 = randn(torch, 1, 4, 700, 64)
    second = attngen.attention(q2, k, v, causal=True)
    check(torch, first, q, k, v, causal=True)
    check(torch, second, q2, k, v, causal=True)
    assert second.data_ptr() != first.data_ptr()
    base = randn(torch, 1 * 4 * 700 * 64 + 4)
    odd = base[4:].view(1, 4, 700, 64)      # 8 bytes past an aligned start: same shape, strides and dtype
    with pytest.raises(ValueError, match="16-byte aligned"):
        attngen.attention(odd, k, v, causal=True)


def test_calls_into_a_caller_s_out_take_the_prepared_path(torch):
    """A call with out= is prepared under out's layout (its strides are in the Params), so a repeated call
    into another out of that layout is a prepared launch writing there; an out of another layout is
    checked and prepared anew; a misaligned out takes the full path, which refuses it."""
    kernel = attngen.load(ROOT / "specs" / "h100_wgmma_d128.yaml")
    q, k, v = (randn(torch, 1, 4, 700, 128) for _ in range(3))
    outs = [torch.full_like(q, float("nan")) for _ in range(2)]
    kernel(q, k, v, causal=True, out=outs[0])
    before = len(kernel._prepared)
    q2 = randn(torch, 1, 4, 700, 128)
    assert kernel(q2, k, v, causal=True, out=outs[1]) is outs[1]
    assert len(kernel._prepared) == before          # the same prepared call
    check(torch, outs[0], q, k, v, causal=True)
    check(torch, outs[1], q2, k, v, causal=True)
    bshd = torch.full((1, 700, 4, 128), float("nan"), device="cuda", dtype=q.dtype).transpose(1, 2)   # other strides
    kernel(q, k, v, causal=True, out=bshd)
    assert len(kernel._prepared) == before + 1
    check(torch, bshd, q, k, v, causal=True)
    base = torch.empty(q.numel() + 4, device="cuda", dtype=q.dtype)
    with pytest.raises(ValueError, match="16-byte aligned"):
        kernel(q, k, v, causal=True, out=base[4:].view(q.shape))


def test_varlen_and_kvcache_entry_points(torch):
    from attngen.runtime.calls.varlen import cu_seqlens
    lens = [100, 1, 513]
    cu = cu_seqlens(torch, lens, "cuda")
    q, k, v = randn(torch, 614, 8, 128), randn(torch, 614, 8, 128), randn(torch, 614, 8, 128)
    o = attngen.attention_varlen(q, k, v, cu, cu, 513, 513, causal=True)
    at = 0
    for n in lens:
        t = lambda x: x[at:at + n].transpose(0, 1)[None]   # noqa: E731
        check(torch, t(o), t(q), t(k), t(v), causal=True)
        at += n
    qd, kd, vd = randn(torch, 2, 32, 1, 128), randn(torch, 2, 8, 3000, 128), randn(torch, 2, 8, 3000, 128)
    seqlens = torch.tensor([3000, 7], dtype=torch.int32, device="cuda")
    od = attngen.attention_with_kvcache(qd, kd, vd, cache_seqlens=seqlens)
    for b, n in enumerate((3000, 7)):
        check(torch, od[b:b + 1], qd[b:b + 1], kd[b:b + 1, :, :n], vd[b:b + 1, :, :n])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_one_query_row_runs_the_decode_call(torch, dtype):
    """attention() of one query row that sees every key (no mask, or causal aligned bottom-right, as transformers
    and torch SDPA make a decode step) runs the decode call on the full cache, in both layouts, with its LSE, GQA
    and MHA, at the head dims the decode table serves; top-left causal (the row sees
    key 0 only) and more rows than the route takes keep the forward's kernels. Each against fp32 attention by the error rule."""
    from attngen.ops import library
    dt = getattr(torch, dtype)
    for b, h, hkv, sk, d in ((2, 32, 8, 3000, 128), (1, 8, 8, 700, 64), (3, 16, 2, 5000, 96), (1, 4, 1, 1, 128)):
        q, k, v = randn(torch, b, h, 1, d, dtype=dt), randn(torch, b, hkv, sk, d, dtype=dt), \
            randn(torch, b, hkv, sk, d, dtype=dt)
        library._FORWARD.clear()
        check(torch, attngen.attention(q, k, v), q, k, v)
        check(torch, attngen.attention(q, k, v, causal=True, alignment="bottom_right"), q, k, v)
        o, lse = attngen.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), layout="bshd",
                                   causal=True, alignment="bottom_right", return_lse=True)
        check(torch, o.transpose(1, 2), q, k, v)
        with exact_fp32_matmul(torch):
            ref_lse = torch.logsumexp((q.float() @ k.float().repeat_interleave(h // hkv, 1).transpose(-1, -2))
                                      * d ** -0.5, -1)
        assert lse.shape == (b, h, 1) and (lse - ref_lse).abs().max().item() < 1e-3
        kernels = [kernel for key, kernel in library._FORWARD.items() if key[2] == d]
        assert kernels and all(kernel is library.ONE_ROW_DECODE for kernel in kernels), kernels
        # a cache sliced out of a longer one (a static cache's first sk keys: strided heads and batch)
        k_long, v_long = randn(torch, b, hkv, sk + 100, d, dtype=dt), randn(torch, b, hkv, sk + 100, d, dtype=dt)
        ks, vs = k_long[:, :, :sk], v_long[:, :, :sk]
        check(torch, attngen.attention(q, ks, vs), q, ks, vs)
        # a shape seen before takes forward()'s prepared call of the route (the decode kernel's own) on new tensors
        q_new = randn(torch, b, h, 1, d, dtype=dt)
        check(torch, attngen.attention(q_new, k, v), q_new, k, v)
        assert any(hit[0] is library.ONE_ROW_DECODE for hit in library._PREPARED.values())
        library._FORWARD.clear()
        check(torch, attngen.attention(q, k, v, causal=True), q, k, v, causal=True)   # top-left: key 0 only
        with pytest.raises(ValueError, match="applies to causal=True or a window only"):   # refused as before
            attngen.attention(q, k, v, alignment="bottom_right")
        if sk > library.ROUTE_MAX_SEQLEN_Q:   # more rows than the route takes
            q9 = randn(torch, b, h, library.ROUTE_MAX_SEQLEN_Q + 1, d, dtype=dt)
            check(torch, attngen.attention(q9, k, v), q9, k, v)
        assert all(kernel is not library.ONE_ROW_DECODE for kernel in library._FORWARD.values())


@pytest.mark.parametrize("rows", [2, 4, 8])
def test_a_few_query_rows_through_the_route_are_causal_bottom_right(torch, rows):
    """A few query rows per head (speculative decoding's drafts, up to ROUTE_MAX_SEQLEN_Q), causal bottom-right, run
    the decode call's causal: row t sees the keys up to Sk - Sq + t, against fp32 attention by the error rule, first
    call and prepared call; no mask sees every key."""
    from attngen.ops import library
    assert rows <= library.ROUTE_MAX_SEQLEN_Q
    library._FORWARD.clear()
    for b, h, hkv, sk, d in ((2, 32, 8, 1000, 128), (3, 16, 2, 700, 64)):
        q, k, v = randn(torch, b, h, rows, d), randn(torch, b, hkv, sk, d), randn(torch, b, hkv, sk, d)
        for _ in range(2):      # the second call: forward()'s prepared call
            q = randn(torch, b, h, rows, d)
            check(torch, attngen.attention(q, k, v, causal=True, alignment="bottom_right"), q, k, v, causal=True,
                  alignment="bottom_right")
            check(torch, attngen.attention(q, k, v), q, k, v)
    assert any(kernel is library.ONE_ROW_DECODE for kernel in library._FORWARD.values())
    library._FORWARD.clear()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_one_query_row_with_variants_runs_the_decode_call(torch, monkeypatch, dtype):
    """forward_variant's one-row route: softcap (Gemma 2), a sliding window as transformers passes it ((W - 1, W - 1)
    with causal, bottom-right), ALiBi and learned sinks (gpt-oss) at one query row run the decode call, each against
    fp32 attention of the same variant definitions by the error rule; top-left alignment keeps the forward's kernels.
    By default the route takes a call from ROUTE_VARIANT_MIN_WORK (batch x query heads x keys seen) on; with it 0,
    every call, also gpt-oss's d64 sinks in a window, Gemma 2's d256 softcap in one, and the four at d64 and d96; at
    d96, where the variant's forward pads, whatever the work. A call seen before replays the decode kernel's prepared
    call (forward_variant's _PREPARED_VARIANT), on new values."""
    from attngen.core.variants import SCORES
    from attngen.ops import library
    dt = getattr(torch, dtype)
    bottom = {"causal": True, "alignment": "bottom_right"}

    def clear():
        library._VARIANT.clear()
        library._PREPARED_VARIANT.clear()

    def routed():   # per kernel forward_variant took since clear(), in call order: whether it is the route
        return [kernel is library.ONE_ROW_DECODE_VARIANT for kernel in library._VARIANT.values()]

    def run(b, h, hkv, sk, d, calls, rounds=1):
        """Each call (its arguments, the reference's mask and modifiers) against fp32 attention; `rounds` > 1 replays
        them on new values in the same tensors."""
        q, k, v = randn(torch, b, h, 1, d, dtype=dt), randn(torch, b, hkv, sk, d, dtype=dt), \
            randn(torch, b, hkv, sk, d, dtype=dt)
        slopes, sinks = torch.rand(h, device="cuda") * 0.3, torch.randn(h, device="cuda")
        for _ in range(rounds):
            for kw, mask, ref_kw in calls(slopes, sinks):
                out = attngen.attention(q, k, v, **kw)
                align = None if mask == "none" else "bottom_right"   # a full mask takes no alignment
                with exact_fp32_matmul(torch):
                    ref, _ = attention_torch(q.float(), k.float(), v.float(), scale=d ** -0.5, mask=mask,
                                             alignment=align, **ref_kw)
                low, _ = attention_torch(q, k, v, scale=d ** -0.5, mask=mask, alignment=align, **ref_kw)
                err = (out.float() - ref).abs().max().item()
                assert err <= error_bound((low.float() - ref).abs().max().item()), (kw, err)
            for t in (q, k, v, sinks):
                t.copy_(torch.randn_like(t))
            slopes.copy_(torch.rand_like(slopes) * 0.3)
        return q, k, v

    def four(slopes, sinks):   # softcap, a window of 1024 keys, ALiBi, sinks
        return [(dict(bottom, softcap=30.0), "causal", {"modifiers": ((SCORES["softcap"], 30.0),)}),
                (dict(bottom, window=(1023, 1023)), "window", {"window": (1023, 0)}),
                ({"alibi_slopes": slopes}, "none", {"modifiers": ((SCORES["alibi"], slopes),)}),
                (dict(bottom, sinks=sinks), "causal", {"modifiers": ((SCORES["sink"], sinks),)})]

    clear()   # 2 x 16 query rows: with a threshold between, 3000 keys reach it and the window's 1024 do not
    monkeypatch.setattr(library, "ROUTE_VARIANT_MIN_WORK", 65536)
    run(2, 16, 4, 3000, 128, four)
    assert routed() == [True, False, True, True]
    monkeypatch.setattr(library, "ROUTE_VARIANT_MIN_WORK", 0)
    clear()
    full = []   # the route's full calls (a replay of its prepared call makes none)
    whole = library.kvcache_variant
    monkeypatch.setattr(library, "kvcache_variant", lambda *args: full.append(1) or whole(*args))
    q, k, v = run(2, 16, 4, 3000, 128, four, rounds=2)   # the second round replays the prepared calls
    assert routed() == [True] * 4 and len(full) == 4 and len(library._PREPARED_VARIANT) == 4 and all(
        hit[0] is library.ONE_ROW_DECODE_VARIANT for hit in library._PREPARED_VARIANT.values())
    q_grad = q.detach().clone().requires_grad_()   # a call of the same shape on a tensor that needs a gradient
    with torch.no_grad():
        attngen.attention(q_grad, k, v, causal=True, alignment="bottom_right", softcap=30.0)
    assert routed()[-1] is False and len(full) == 4   # not the route's prepared call: the forward's kernel
    clear()
    attngen.attention(q, k, v, causal=True, window=(1023, 0))    # top-left: the row sees key 0 only
    assert routed() == [False]
    clear()   # gpt-oss (d64, sinks in a 128-key window) and Gemma 2's local layers (d256, softcap in a 4096-key window)
    run(2, 64, 8, 700, 64, lambda slopes, sinks: [(dict(bottom, window=(127, 127), sinks=sinks), "window",
                                                   {"window": (127, 0), "modifiers": ((SCORES["sink"], sinks),)})])
    run(1, 16, 8, 5000, 256, lambda slopes, sinks: [(dict(bottom, window=(4095, 4095), softcap=50.0), "window",
                                                     {"window": (4095, 0), "modifiers": ((SCORES["softcap"], 50.0),)})])
    assert routed() == [True, True]
    clear()   # d64 and d96 (Phi-3) hold every variant's decode cell too: all four routed at each
    run(2, 16, 4, 3000, 64, four)
    run(2, 32, 8, 2000, 96, four)
    assert routed() == [True] * 8
    monkeypatch.setattr(library, "ROUTE_VARIANT_MIN_WORK", 1 << 40)   # no call's work reaches it
    clear()   # d96's softcap, ALiBi and sinks forward runs padded to d128 (q, k and v copied): routed whatever the
    run(1, 32, 8, 1000, 96, four)   # work; its window has a d96 forward kernel, and d64 has all four: the threshold holds
    run(1, 32, 8, 1000, 64, four)
    assert routed() == [True, False, True, True] + [False] * 4
    clear()   # nothing routed under the test's threshold outlives it


def test_one_query_row_through_sdpa_compile_and_graphs(torch):
    """The decode step as torch SDPA makes it (attngen.enable()), under torch.compile and in a CUDA graph: the same
    output as the eager call's decode, bit for bit."""
    import torch.nn.functional as F
    q, k, v = randn(torch, 4, 32, 1, 128, dtype=torch.bfloat16), randn(torch, 4, 8, 4000, 128, dtype=torch.bfloat16), \
        randn(torch, 4, 8, 4000, 128, dtype=torch.bfloat16)
    eager = attngen.attention(q, k, v)
    check(torch, eager, q, k, v)
    attngen.enable()
    try:
        through = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    finally:
        attngen.disable()
    assert torch.equal(through, eager)
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(lambda q, k, v: attngen.attention(q, k, v), fullgraph=True)(q, k, v)
        assert torch.equal(compiled, eager)
        static = q.clone()
        attngen.attention(static, k, v)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            replayed = attngen.attention(static, k, v)
        static.copy_(q)
        graph.replay()
        torch.cuda.synchronize()
    assert torch.equal(replayed, eager)


def test_refuses_tensors_that_need_gradients_where_no_backward_exists(torch, monkeypatch):
    """attention() and attention_varlen() differentiate (tests/test_gpu_backward.py); decode does
    not, nor a head dim the table has a forward but no backward spec for, at it or above it (a head
    dim below a served one pads to it: tests/test_gpu_head_dim_padding.py). The table without its
    d256 backward and varlen backward entries."""
    from table_patch import without_backward
    without_backward(monkeypatch, 256)
    without_backward(monkeypatch, 256, calls=("varlen_backward",))
    q = randn(torch, 1, 2, 64, 64).requires_grad_()
    q256 = randn(torch, 1, 2, 64, 256).requires_grad_()
    with pytest.raises(NotImplementedError, match="no backward for this call"):
        attngen.attention(q256, q256, q256)
    qv = randn(torch, 64, 2, 256).requires_grad_()
    cu = torch.tensor([0, 64], dtype=torch.int32, device="cuda")
    with pytest.raises(NotImplementedError, match="no varlen backward for this call"):
        attngen.attention_varlen(qv, qv, qv, cu, cu, 64, 64)
    cache = randn(torch, 1, 2, 128, 64)
    with pytest.raises(NotImplementedError, match="no backward for decode"):
        attngen.attention_with_kvcache(q[:, :, :1], cache, cache)
    with torch.no_grad():
        attngen.attention(q, q, q, softcap=30.0)


def test_attention_variants_through_the_table(torch):
    """window, softcap and ALiBi through attngen.attention: the table's variant specs serve them, each
    output passes the error rule against the reference of the same variant definitions, and a plain
    call still takes the plain kernel."""
    from attngen.core.variants import SCORES
    q, k, v = randn(torch, 2, 4, 700, 128), randn(torch, 2, 4, 700, 128), randn(torch, 2, 4, 700, 128)
    slopes = torch.rand(2, 4, device="cuda") * 0.3

    def ref_check(out, **kw):
        with exact_fp32_matmul(torch):
            ref, _ = attention_torch(q.float(), k.float(), v.float(), scale=128 ** -0.5, **kw)
        low, _ = attention_torch(q, k, v, scale=128 ** -0.5, **kw)
        err = (out.float() - ref).abs().max().item()
        assert err <= error_bound((low.float() - ref).abs().max().item()), err

    ref_check(attngen.attention(q, k, v, causal=True, window=(100, 0)), mask="window", alignment="top_left",
              window=(100, 0))
    ref_check(attngen.attention(q, k, v, causal=True, softcap=20.0), mask="causal",
              modifiers=((SCORES["softcap"], 20.0),))
    ref_check(attngen.attention(q, k, v, alibi_slopes=slopes), mask="none", modifiers=((SCORES["alibi"], slopes),))
    ref_check(attngen.attention(q, k, v, causal=True, window=(-1, -1)), mask="causal")
    torch.library.opcheck(torch.ops.attngen.attention_variant.default,
                          (q, k, v, True, None, None, "bhsd", [64, 0], None, None))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_kvcache_variants_at_d256(torch, dtype):
    """Gemma's decode steps at d256 (16 query heads on 8 KV heads, scale 1/16): softcap (Gemma 2's
    global layers), a window (Gemma 3's local layers) and both (Gemma 2's local layers), contiguous and
    paged by 16 keys, through the table's d256 decode variant specs, each within the error rule."""
    from attngen.core.variants import SCORES
    from attngen.eval.verify.decode import DecodeCase, paged_cache, reference
    dt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(6)
    q = torch.randn(3, 16, 1, 256, device="cuda", generator=g).to(dt)
    k, v = (torch.randn(3, 8, 1100, 256, device="cuda", generator=g).to(dt) for _ in range(2))
    lengths = (1100, 333, 1)
    lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    kp, vp, table = paged_cache(torch, k, v, lengths, 16, "bhsd")
    softcap = ((SCORES["softcap"], 50.0),)
    calls = (({"softcap": 50.0}, DecodeCase(3, 16, 8, 1, 1100, lengths, causal=True), softcap),
             ({"window": (300, 0)}, DecodeCase(3, 16, 8, 1, 1100, lengths, causal=True, window=(300, 0)), ()),
             ({"window": (300, 0), "softcap": 50.0},
              DecodeCase(3, 16, 8, 1, 1100, lengths, causal=True, window=(300, 0)), softcap))
    for keywords, case, modifiers in calls:
        ref, _, low = reference(torch, q, k, v, lengths, case, 1 / 16, modifiers)
        bound = error_bound((low.float() - ref).abs().max().item())
        for kc, vc, tb in ((k, v, None), (kp, vp, table)):
            out = attngen.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=tb, causal=True,
                                                 scale=1 / 16, **keywords)
            err = (out.float() - ref).abs().max().item()
            assert err <= bound, f"{keywords} paged={tb is not None}: {err:.3g} > {bound:.3g}"


def test_kvcache_variants_through_the_table(torch):
    """window, softcap and ALiBi through attngen.attention_with_kvcache: the table's decode variant
    specs serve them (contiguous and paged), each output passes the error rule against the decode
    reference of the same variant definitions, the op passes opcheck, and a compiled decode step
    with a window runs through the op with no graph break."""
    from attngen.core.variants import SCORES
    from attngen.eval.verify.decode import DecodeCase, paged_cache, reference
    q, k, v = randn(torch, 2, 32, 1, 128), randn(torch, 2, 8, 2000, 128), randn(torch, 2, 8, 2000, 128)
    lengths = (2000, 777)
    lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    slopes = torch.rand(2, 32, device="cuda") * 0.3
    kp, vp, table = paged_cache(torch, k, v, lengths, 16, "bhsd")

    def ref_check(out, case, modifiers=()):
        ref, _, low = reference(torch, q, k, v, lengths, case, 128 ** -0.5, modifiers)
        err = (out.float() - ref).abs().max().item()
        assert err <= error_bound((low.float() - ref).abs().max().item()), err

    window = DecodeCase(2, 32, 8, 1, 2000, lengths, causal=True, window=(300, 0))
    plain = DecodeCase(2, 32, 8, 1, 2000, lengths)
    for paged in (False, True):
        kc, vc, tb = (kp, vp, table) if paged else (k, v, None)
        call = dict(cache_seqlens=lens, block_table=tb)
        ref_check(attngen.attention_with_kvcache(q, kc, vc, causal=True, window=(300, 0), **call), window)
        ref_check(attngen.attention_with_kvcache(q, kc, vc, softcap=20.0, **call), plain,
                  ((SCORES["softcap"], 20.0),))
        ref_check(attngen.attention_with_kvcache(q, kc, vc, alibi_slopes=slopes, **call), plain,
                  ((SCORES["alibi"], slopes),))
    torch.library.opcheck(torch.ops.attngen.attention_with_kvcache_variant.default,
                          (q, k, v, lens, None, True, None, None, "bhsd", [300, 0], None, None))

    torch._dynamo.reset()

    def step(q, k, v, lens):
        return attngen.attention_with_kvcache(q, k, v, cache_seqlens=lens, causal=True, window=(300, 0)) * 2

    with torch.no_grad():
        out = torch.compile(step, fullgraph=True)(q, k, v, lens)
        assert (out.float() - step(q, k, v, lens).float()).abs().max().item() == 0


def test_compiled_window_call_has_no_graph_break(torch):
    torch._dynamo.reset()
    q, k, v = randn(torch, 1, 4, 500, 64), randn(torch, 1, 4, 500, 64), randn(torch, 1, 4, 500, 64)

    def f(q, k, v):
        return attngen.attention(q, k, v, causal=True, window=(128, 0)) * 2

    with torch.no_grad():
        out = torch.compile(f, fullgraph=True)(q, k, v)
        assert (out.float() - f(q, k, v).float()).abs().max().item() == 0


def test_opcheck(torch):
    from attngen.runtime.calls.varlen import cu_seqlens
    q, k, v = randn(torch, 2, 4, 200, 64), randn(torch, 2, 2, 300, 64), randn(torch, 2, 2, 300, 64)
    torch.library.opcheck(torch.ops.attngen.attention.default, (q, k, v, True, "bottom_right", None, "bhsd"))
    torch.library.opcheck(torch.ops.attngen.attention.default,
                          (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), False, None, 0.1, "bshd"))
    cu = cu_seqlens(torch, [50, 150], "cuda")
    qp = randn(torch, 200, 4, 64)
    torch.library.opcheck(torch.ops.attngen.attention_varlen.default, (qp, qp, qp, cu, cu, 150, 150, True, None, None))
    qd, kd = randn(torch, 2, 32, 1, 128), randn(torch, 2, 8, 1000, 128)
    lens = torch.tensor([1000, 3], dtype=torch.int32, device="cuda")
    torch.library.opcheck(torch.ops.attngen.attention_with_kvcache.default,
                          (qd, kd, kd, lens, None, False, None, None, "bhsd"))


def _block(torch):
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(512, 3 * 512, device="cuda", dtype=torch.float16)
            self.proj = torch.nn.Linear(512, 512, device="cuda", dtype=torch.float16)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(512, 2048, device="cuda", dtype=torch.float16),
                                           torch.nn.GELU(),
                                           torch.nn.Linear(2048, 512, device="cuda", dtype=torch.float16))

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, 8, 64).unbind(2)
            a = attngen.attention(q, k, v, causal=True, layout="bshd").reshape(b, s, 512)
            x = x + self.proj(a)
            return x + self.mlp(x)

    return Block()


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_compiled_block_runs_through_the_ops(torch, mode):
    torch._dynamo.reset()
    block = _block(torch)
    x = randn(torch, 2, 256, 512)
    with torch.no_grad():
        eager = block(x)
        compiled = torch.compile(block, fullgraph=True, mode=mode)
        for _ in range(3):   # reduce-overhead records a CUDA graph after warm-up runs
            out = compiled(x)
        torch.cuda.synchronize()
    assert (out.float() - eager.float()).abs().max().item() < 2e-2


@pytest.mark.parametrize("case", ["decode", "paged_mixed_sinks", "varlen"])
def test_reduce_overhead_as_a_process_first_call(case):
    """torch.compile(mode="reduce-overhead") as the first GPU work of a fresh process (tests/reduce_overhead_step.py):
    the buffers attngen keeps between calls are made during the CUDA graph's warm-up, yet outside its pool
    (which must hold nothing but outputs after a call), and the replays equal the eager call bit for bit."""
    import subprocess
    import sys
    run = subprocess.run([sys.executable, str(ROOT / "tests" / "reduce_overhead_step.py"), case], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
