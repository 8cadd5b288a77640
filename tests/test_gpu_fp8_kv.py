"""Decode on an e4m3 KV cache on the GPU: every e4m3 cell against fp32 attention over the dequantised
cache, contiguous and paged (pages of 1, 16, 256), GQA, per-tensor and per-KV-head scales, outputs
poisoned with NaN beforehand; the error bound is the project's rule: twice torch's fp16/bf16 attention
over the same dequantised cache."""
from __future__ import annotations

import functools
from pathlib import Path

import pytest

import attngen

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
CELLS = ("h200_decode_d64_kv_e4m3", "h200_decode_d96_kv_e4m3", "h200_decode_d128_kv_e4m3", "h200_decode_d256_kv_e4m3",
         "h200_decode_d64_kv_e4m3_contiguous", "h200_decode_d128_kv_e4m3_contiguous")
SPECS = [c + s for c in CELLS for s in ("", "_bf16")]


@functools.cache
def load(name: str):
    return attngen.load(str(ROOT / "specs" / f"{name}.yaml"))


@pytest.fixture(scope="module")
def torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    return torch


def quantize(torch, x, per_head: bool):
    """(e4m3 cache, fp32 scale) of x (..., Hkv, S, D) as vLLM stores it: scale = amax / 448."""
    dims = tuple(d for d in range(x.dim()) if d != 1) if per_head else tuple(range(x.dim()))
    amax = x.float().abs().amax(dim=dims).clamp(min=1e-6)
    scale = (amax / 448.0).float()
    shaped = scale.view(1, -1, 1, 1) if per_head else scale
    q8 = (x.float() / shaped).clamp(-448, 448).to(torch.float8_e4m3fn)
    return q8, scale.reshape(-1) if per_head else scale.reshape(1)


def dequant(q8, scale, per_head: bool):
    return q8.float() * (scale.view(1, -1, 1, 1) if per_head else scale)


def reference(torch, q, k, v, lens, causal, dtype):
    """(fp32 attention, attention in dtype) over the dequantised caches k, v (B, Hkv, S, D), per sequence."""
    B, H, Sq, D = q.shape
    group = H // k.shape[1]
    outs = {torch.float32: [], dtype: []}
    for b in range(B):
        n = int(lens[b])
        for t in outs:
            qq = q[b:b + 1].to(t)
            kk = k[b:b + 1, :, :n].repeat_interleave(group, dim=1).to(t)
            vv = v[b:b + 1, :, :n].repeat_interleave(group, dim=1).to(t)
            s = qq @ kk.transpose(-1, -2) / D ** 0.5
            if causal:
                pos = torch.arange(n, device=q.device)[None, :]
                own = (n - Sq + torch.arange(Sq, device=q.device))[:, None]
                s = s.masked_fill(pos > own, float("-inf"))
            outs[t].append(torch.softmax(s.float(), dim=-1).to(t) @ vv)
    return torch.cat(outs[torch.float32]), torch.cat(outs[dtype]).float()


def check(torch, o, ref32, ref_low):
    assert not torch.isnan(o).any(), "NaN in the output (a row was not written)"
    err = (o.float() - ref32).abs().max().item()
    bound = 2 * (ref_low - ref32).abs().max().item() + 1e-5
    assert err <= bound, f"max error {err:.3g} over the bound {bound:.3g}"


def pages_of(torch, k8, v8, page, seed):
    """(k pool, v pool, block table) holding caches (B, Hkv, S, D) in shuffled pages of `page` keys."""
    B, Hkv, S, D = k8.shape
    per = S // page
    g = torch.Generator(device="cpu").manual_seed(seed)
    order = torch.randperm(B * per, generator=g).to(k8.device)
    def pool(x):
        # built on uint8 views: an index write of float8 is not in every torch (verify does the same)
        bytes_ = x.view(torch.uint8)
        out = torch.empty((B * per, Hkv, page, D), dtype=torch.uint8, device=x.device)
        out[order] = bytes_.view(B, Hkv, per, page, D).permute(0, 2, 1, 3, 4).reshape(B * per, Hkv, page, D)
        return out.view(x.dtype)
    table = order.view(B, per).int()
    return pool(k8), pool(v8), table


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("heads, kv_heads, seqlen_q", [(32, 8, 1), (8, 8, 1), (16, 2, 2), (64, 8, 4)])
@pytest.mark.parametrize("causal", [False, True])
def test_contiguous_against_fp32(torch, spec, heads, kv_heads, seqlen_q, causal):
    kernel = load(spec)
    dtype = torch.float16 if not spec.endswith("_bf16") else torch.bfloat16
    D = kernel.plan.head_dim
    torch.manual_seed(heads * 7 + seqlen_q)
    B, S = 3, 1000
    q = torch.randn(B, heads, seqlen_q, D, device="cuda", dtype=dtype)
    k = torch.randn(B, kv_heads, S, D, device="cuda") * 3
    v = torch.randn(B, kv_heads, S, D, device="cuda")
    per_head = heads == 32
    k8, ks = quantize(torch, k, per_head)
    v8, vs = quantize(torch, v, per_head)
    lens = torch.tensor([S, 517, seqlen_q + 3], dtype=torch.int32, device="cuda")[:B]
    out = torch.full_like(q, float("nan"))
    o = kernel(q, k8, v8, cache_seqlens=lens, causal=causal, k_scale=ks, v_scale=vs, out=out)
    ref32, ref_low = reference(torch, q.float(), dequant(k8, ks, per_head), dequant(v8, vs, per_head), lens, causal,
                               dtype)
    check(torch, o, ref32, ref_low)
    for splits in (1, 5):   # unsplit (the block writes O) and split (partials merged)
        o = kernel(q, k8, v8, cache_seqlens=lens, causal=causal, k_scale=ks, v_scale=vs, num_splits=splits)
        check(torch, o, ref32, ref_low)


@pytest.mark.parametrize("spec", [s for s in SPECS if "contiguous" not in s])
@pytest.mark.parametrize("page", [1, 16, 256])
def test_paged_against_fp32(torch, spec, page):
    kernel = load(spec)
    dtype = torch.float16 if not spec.endswith("_bf16") else torch.bfloat16
    D = kernel.plan.head_dim
    torch.manual_seed(page)
    B, H, Hkv, S = 2, 32, 8, 1024
    q = torch.randn(B, H, 1, D, device="cuda", dtype=dtype)
    k8, ks = quantize(torch, torch.randn(B, Hkv, S, D, device="cuda") * 2, False)
    v8, vs = quantize(torch, torch.randn(B, Hkv, S, D, device="cuda"), False)
    lens = torch.tensor([S, 700], dtype=torch.int32, device="cuda")
    kp, vp, table = pages_of(torch, k8, v8, page, seed=page)
    ref32, ref_low = reference(torch, q.float(), dequant(k8, ks, False), dequant(v8, vs, False), lens, True, dtype)
    for splits in (None, 1, 3):
        out = torch.full_like(q, float("nan"))
        o = kernel(q, kp, vp, cache_seqlens=lens, block_table=table, causal=True, k_scale=ks, v_scale=vs,
                   num_splits=splits, out=out)
        check(torch, o, ref32, ref_low)


@pytest.mark.parametrize("D", [128, 96])
def test_entry_point_routes_e4m3_caches(torch, D):
    """attngen.attention_with_kvcache on e4m3 caches (a number and tensors as scales, contiguous and paged)
    matches the kernel loaded directly; an fp16 cache still goes to the fp16 cells."""
    B, H, Hkv, S = 2, 32, 8, 512
    q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.float16)
    k8, ks = quantize(torch, torch.randn(B, Hkv, S, D, device="cuda"), False)
    v8, vs = quantize(torch, torch.randn(B, Hkv, S, D, device="cuda"), False)
    lens = torch.full((B,), S, dtype=torch.int32, device="cuda")
    ref32, ref_low = reference(torch, q.float(), dequant(k8, ks, False), dequant(v8, vs, False), lens, False,
                               torch.float16)
    check(torch, attngen.attention_with_kvcache(q, k8, v8, cache_seqlens=lens, k_scale=ks, v_scale=vs), ref32, ref_low)
    o = attngen.attention_with_kvcache(q, k8, v8, cache_seqlens=lens, k_scale=float(ks), v_scale=float(vs))
    check(torch, o, ref32, ref_low)
    kp, vp, table = pages_of(torch, k8, v8, 16, seed=1)
    check(torch, attngen.attention_with_kvcache(q, kp, vp, cache_seqlens=lens, block_table=table, k_scale=ks,
                                                v_scale=vs), ref32, ref_low)
    # repeated calls take the prepared path with new scale values read at launch
    o2 = attngen.attention_with_kvcache(q, k8, v8, cache_seqlens=lens, k_scale=ks * 1, v_scale=vs * 2)
    torch.testing.assert_close(o2.float(), 2 * o.float(), rtol=2e-3, atol=2e-3)
    # numbers as scales: the same numbers again (the prepared call, the tensors kept for them), then a number not
    # seen before (a new key: the full path makes its tensor), then a tensor and a number together, twice
    again = attngen.attention_with_kvcache(q, k8, v8, cache_seqlens=lens, k_scale=float(ks), v_scale=float(vs))
    assert torch.equal(again, o)
    doubled = attngen.attention_with_kvcache(q, k8, v8, cache_seqlens=lens, k_scale=float(ks), v_scale=2 * float(vs))
    torch.testing.assert_close(doubled.float(), 2 * o.float(), rtol=2e-3, atol=2e-3)
    for _ in range(2):
        mixed = attngen.attention_with_kvcache(q, k8, v8, cache_seqlens=lens, k_scale=ks, v_scale=2 * float(vs))
        torch.testing.assert_close(mixed.float(), 2 * o.float(), rtol=2e-3, atol=2e-3)
    # an fp16 cache of the same (dequantised) values, no scales: the fp16 cells, the same answer
    plain = attngen.attention_with_kvcache(q, dequant(k8, ks, False).half(), dequant(v8, vs, False).half(),
                                           cache_seqlens=lens)
    assert plain.dtype == torch.float16
    check(torch, plain, ref32, ref_low)


def test_argument_errors(torch):
    kernel = load("h200_decode_d128_kv_e4m3")
    B, H, Hkv, S, D = 1, 8, 8, 256, 128
    q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.float16)
    k8 = torch.randn(B, Hkv, S, D, device="cuda").to(torch.float8_e4m3fn)
    one = torch.ones(1, device="cuda")
    with pytest.raises(TypeError, match="e4m3 KV cache"):
        kernel(q, k8.half(), k8, k_scale=one, v_scale=one)
    with pytest.raises(TypeError, match="queries"):
        kernel(q.to(torch.float8_e4m3fn), k8, k8)
    with pytest.raises(TypeError, match="float32"):
        kernel(q, k8, k8, k_scale=one.half())
    with pytest.raises(ValueError, match="per KV head"):
        kernel(q, k8, k8, k_scale=torch.ones(3, device="cuda"))
    with pytest.raises(ValueError, match="positive"):
        kernel(q, k8, k8, k_scale=0.0)
    with pytest.raises(ValueError, match="e4m3 KV cache"):
        load("h200_decode_d128")(q, k8.half(), k8.half(), k_scale=one)
    with pytest.raises(ValueError, match="without window"):
        attngen.attention_with_kvcache(q, k8, k8, k_scale=one, window=(128, 0))
