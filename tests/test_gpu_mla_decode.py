"""GPU tests of MLA decode through attngen.attention_with_kvcache: queries of 576 against one latent
cache of 576 per key whose first 512 columns are V (v_cache = k_cache[..., :512]), as DeepSeek V2/V3
decode with the up-projections absorbed. Contiguous and paged caches (pages of 1, 16, 64), 16 and 128
heads, speculative new tokens with causal, LSE, a CUDA graph replay with new lengths, and the refusal
of a V that is not the cache's own columns. Reference: fp32 attention; bound: FlashAttention's rule
(2 x torch's own bf16 error + a floor)."""
from __future__ import annotations

import math

import pytest

import attngen

pytestmark = pytest.mark.gpu

D, DV = 576, 512


@pytest.fixture
def torch():
    import torch
    return torch


def reference(torch, q, cache, lens, causal, scale, dtype):
    """Per sequence: softmax(q k^T scale) v over its keys, k = its cache rows, v = their first DV columns;
    q (B, Sq, H, D) bshd. Returns (out (B, Sq, H, DV) fp32, lse (B, H, Sq))."""
    outs, lses = [], []
    b, sq, h, _ = q.shape
    for i in range(b):
        n = int(lens[i])
        k = cache[i, :n, 0].to(dtype)
        x = q[i].to(dtype).reshape(sq * h, D)
        s = (x @ k.t()).float() * scale
        if causal:
            tok = torch.arange(sq, device=q.device).repeat_interleave(h)
            s = s.masked_fill(torch.arange(n, device=q.device)[None] > (n - sq + tok)[:, None], float("-inf"))
        p = torch.softmax(s, -1)
        outs.append((p.to(dtype) @ k[:, :DV]).float().reshape(sq, h, DV))
        lses.append(torch.logsumexp(s, -1).reshape(sq, h).t())
    return torch.stack(outs), torch.stack(lses)


def assert_matches_fp32(torch, out, lse, q, cache, lens, causal, scale, dtype):
    """out within FlashAttention's rule of fp32 attention (2 x the error of the same attention in `dtype`, plus
    a floor), finite, and LSE within 1e-3."""
    ref, ref_lse = reference(torch, q, cache, lens, causal, scale, torch.float32)
    low, _ = reference(torch, q, cache, lens, causal, scale, dtype)
    err = (out.float() - ref).abs().max().item()
    bound = 2 * (low - ref).abs().max().item() + 1e-5
    assert torch.isfinite(out).all() and err <= bound, f"max error {err:.3g} over the bound {bound:.3g}"
    assert (lse - ref_lse).abs().max().item() < 1e-3


def pages(torch, cache, page, gen):
    """The contiguous cache (B, cap, 1, D) as a shuffled pool of pages (num_pages, page, 1, D) and its table."""
    b, cap = cache.shape[:2]
    cols = -(-cap // page)
    ids = torch.randperm(b * cols + 3, generator=gen, device=cache.device)[:b * cols].int()
    pool = torch.randn((b * cols + 3, page, 1, D), generator=gen, device=cache.device).to(cache.dtype)
    padded = torch.cat([cache, cache.new_zeros(b, cols * page - cap, 1, D)], 1) if cols * page > cap else cache
    table = ids.view(b, cols).contiguous()
    for i in range(b):
        pool[table[i].long()] = padded[i].view(cols, page, 1, D)
    return pool, table


CASES = [   # (batch, heads, new tokens, capacity, page size or 0, causal, dtype)
    (2, 16, 1, 5000, 0, False, "bfloat16"),
    (64, 16, 1, 1024, 0, False, "bfloat16"),     # enough blocks that the heuristic takes one split
    (2, 16, 1, 1000, 0, False, "float16"),
    (3, 128, 1, 1500, 0, False, "bfloat16"),
    (2, 16, 2, 3001, 0, True, "bfloat16"),
    (4, 16, 1, 4096, 64, False, "bfloat16"),
    (2, 16, 1, 777, 1, False, "bfloat16"),
    (2, 32, 2, 2000, 16, True, "bfloat16"),
    (2, 16, 1, 2500, 64, False, "float16"),
    (16, 128, 1, 900, 16, False, "bfloat16"),    # 2048 query rows of 128 per latent cache: the seesaw cell
    (8, 128, 2, 1300, 0, True, "float16"),
    (8, 128, 1, 2100, 64, False, "bfloat16"),    # 1024 query rows, pages of 64: the seesaw cell
]


@pytest.mark.parametrize("case", CASES, ids=[f"B{c[0]}H{c[1]}q{c[2]}cap{c[3]}pg{c[4]}{'c' if c[5] else ''}{c[6]}"
                                             for c in CASES])
def test_mla_decode_matches_fp32(torch, case):
    b, h, sq, cap, page, causal, dtype_name = case
    dtype = getattr(torch, dtype_name)
    gen = torch.Generator(device="cuda").manual_seed(sum(case[:5]))
    q = torch.randn((b, sq, h, D), generator=gen, device="cuda").to(dtype)
    cache = torch.randn((b, cap, 1, D), generator=gen, device="cuda").to(dtype)
    lens = torch.randint(max(sq, cap // 3), cap + 1, (b,), generator=gen, device="cuda").int()
    lens[0] = cap
    scale = 1 / math.sqrt(192)     # DeepSeek's: the unabsorbed head dim (128 + 64)
    if page:
        pool, table = pages(torch, cache, page, gen)
        kc, kwargs = pool, {"block_table": table}
    else:
        kc, kwargs = cache, {}
    def call():
        return attngen.attention_with_kvcache(q, kc, kc[..., :DV], cache_seqlens=lens, causal=causal, scale=scale,
                                              layout="bshd", return_lse=True, **kwargs)
    out, lse = call()
    torch.cuda.synchronize()
    assert out.shape == (b, sq, h, DV) and out.dtype == dtype
    assert_matches_fp32(torch, out, lse, q, cache, lens, causal, scale, dtype)
    # the second call of the shape takes the prepared path (its own output and workspace): the same answer
    again, again_lse = call()
    assert torch.equal(again, out) and torch.equal(again_lse, lse)


def test_mla_decode_refuses_a_v_of_its_own(torch):
    """The kernel reads V from the cache's rows: a separate v_cache would be ignored, so it is refused, on the
    first call of a shape and on a prepared one."""
    q = torch.randn(1, 1, 16, D, device="cuda", dtype=torch.bfloat16)
    cache = torch.randn(1, 300, 1, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, 300, 1, DV, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"k_cache\[\.\.\., :512\]"):
        attngen.attention_with_kvcache(q, cache, v, layout="bshd")
    # and on the prepared path: another cache's view has the same shape and strides (the call's key) as the
    # cache's own, so only its pointer tells them apart
    other = torch.randn_like(cache)
    attngen.attention_with_kvcache(q, cache, cache[..., :DV], layout="bshd")
    with pytest.raises(ValueError, match=r"k_cache\[\.\.\., :512\]"):
        attngen.attention_with_kvcache(q, cache, other[..., :DV], layout="bshd")
    # a view whose one-element dimensions have other strides is the same data: taken
    flat = torch.randn(1, 300, D, device="cuda", dtype=torch.bfloat16)
    out = attngen.attention_with_kvcache(q, flat.unsqueeze(2), flat[..., :DV].unsqueeze(2), layout="bshd")
    assert out.shape == (1, 1, 16, DV)


def test_mla_decode_graph_replays_new_lengths(torch):
    """A captured paged step replays with new lengths and gives what an eager call gives."""
    gen = torch.Generator(device="cuda").manual_seed(7)
    b, h, cap = 4, 16, 4096
    q = torch.randn((b, 1, h, D), generator=gen, device="cuda").bfloat16()
    cache = torch.randn((b, cap, 1, D), generator=gen, device="cuda").bfloat16()
    pool, table = pages(torch, cache, 64, gen)
    lens = torch.full((b,), cap, dtype=torch.int32, device="cuda")

    def step():
        return attngen.attention_with_kvcache(q, pool, pool[..., :DV], cache_seqlens=lens, block_table=table,
                                              layout="bshd")
    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    lens.copy_(torch.tensor([1, 100, 2049, 4000], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    ref, _ = reference(torch, q, cache, lens, False, D ** -0.5, torch.float32)
    low, _ = reference(torch, q, cache, lens, False, D ** -0.5, torch.bfloat16)
    assert (out.float() - ref).abs().max().item() <= 2 * (low - ref).abs().max().item() + 1e-5
    assert torch.equal(out, step())


def test_mla_decode_under_torch_compile(torch):
    """Under torch.compile (fullgraph) the call is one op whose V is the cache's own columns: the compiled step
    gives the eager one's output bit for bit."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    b, h, cap = 2, 16, 2048
    q = torch.randn((b, 1, h, D), generator=gen, device="cuda").bfloat16()
    cache = torch.randn((b, cap, 1, D), generator=gen, device="cuda").bfloat16()
    pool, table = pages(torch, cache, 64, gen)
    lens = torch.tensor([2000, 77], dtype=torch.int32, device="cuda")

    def step(q, pool, lens, table):
        return attngen.attention_with_kvcache(q, pool, pool[..., :DV], cache_seqlens=lens, block_table=table,
                                              layout="bshd", scale=1 / math.sqrt(192))
    compiled = torch.compile(step, fullgraph=True)
    assert torch.equal(compiled(q, pool, lens, table), step(q, pool, lens, table))


def test_mla_decode_records_a_bad_page(torch):
    """A page id outside the pool is clamped (nothing read past it) and recorded for check_errors()."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn((2, 1, 16, D), generator=gen, device="cuda").bfloat16()
    cache = torch.randn((2, 256, 1, D), generator=gen, device="cuda").bfloat16()
    pool, table = pages(torch, cache, 64, gen)
    lens = torch.tensor([256, 200], dtype=torch.int32, device="cuda")
    attngen.check_errors()
    table[1, 0] = pool.shape[0] + 5
    attngen.attention_with_kvcache(q, pool, pool[..., :DV], cache_seqlens=lens, block_table=table, layout="bshd")
    with pytest.raises(Exception, match="block_table"):
        attngen.check_errors()


@pytest.mark.parametrize("heads,sq,page,causal", [(128, 1, 0, False), (128, 2, 16, True), (32, 1, 64, False),
                                                  (16, 1, 0, False), (48, 1, 0, False)],
                         ids=["H128", "H128q2pg16c", "H32pg64", "H16", "H48"])
@pytest.mark.parametrize("splits", [1, 5])
def test_two_row_groups_give_the_one_group_cell_s_bits(torch, heads, sq, page, causal, splits):
    """The lab cell of 32-row blocks (two 16-row groups of 4 warps sharing each cache tile) computes each row
    as the 16-row cell does (the same keys per warp, the same chains and merge): at one split count the
    outputs and LSE are bit for bit the same, with 16 heads (its second group empty), 48 (a partial
    block), 128, pages and several causal new tokens."""
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    one = attngen.load(root / "specs" / "h200_decode_d576_mla_bf16.yaml")
    two = attngen.load(root / "specs" / "h200_decode_d576_mla_m32_bf16.yaml")
    assert (one.plan.block_m, two.plan.block_m) == (16, 32)
    gen = torch.Generator(device="cuda").manual_seed(heads + sq + page + splits)
    b, cap = 3, 1500
    q = torch.randn((b, sq, heads, D), generator=gen, device="cuda").bfloat16()
    cache = torch.randn((b, cap, 1, D), generator=gen, device="cuda").bfloat16()
    lens = torch.randint(cap // 3, cap + 1, (b,), generator=gen, device="cuda").int()
    kc, kwargs = cache, {}
    if page:
        pool, table = pages(torch, cache, page, gen)
        kc, kwargs = pool, {"block_table": table}
    outs = [k(q, kc, kc[..., :DV], cache_seqlens=lens, causal=causal, scale=1 / math.sqrt(192), layout="bshd",
              return_lse=True, num_splits=splits, **kwargs) for k in (one, two)]
    torch.cuda.synchronize()
    (o1, l1), (o2, l2) = outs
    assert torch.isfinite(o2).all()
    assert torch.equal(o1, o2) and torch.equal(l1, l2)


WGMMA_CASES = [   # (batch, heads, new tokens, capacity, page size or 0, causal, dtype, splits)
    (3, 128, 1, 1500, 0, False, "bfloat16", 1),
    (3, 128, 1, 1500, 0, False, "bfloat16", 5),
    (2, 128, 2, 2000, 16, True, "bfloat16", 3),
    (2, 48, 1, 999, 64, False, "float16", 1),        # a partial block: 48 of 64 rows
    (2, 16, 1, 777, 1, False, "bfloat16", 2),
    (1, 64, 3, 4100, 0, True, "float16", 7),
]


@pytest.mark.parametrize("cell", ["wgmma", "seesaw"])
@pytest.mark.parametrize("case", WGMMA_CASES, ids=[f"B{c[0]}H{c[1]}q{c[2]}cap{c[3]}pg{c[4]}{'c' if c[5] else ''}"
                                                   f"{c[6]}s{c[7]}" for c in WGMMA_CASES])
def test_the_wgmma_cells_match_fp32(torch, case, cell):
    """The wgmma cells (blocks of 64 group rows over two warpgroups, tiles in swizzled panels; the tile's
    keys split between them, or alternate tiles each: the seesaw) against fp32 attention by FlashAttention's
    rule, at fixed split counts: 128 heads, a partial block (48 heads), fewer heads than a block (16), pages
    of 1, 16 and 64, several causal new tokens, odd tile counts per split."""
    from pathlib import Path
    b, h, sq, cap, page, causal, dtype_name, splits = case
    dtype = getattr(torch, dtype_name)
    root = Path(__file__).resolve().parent.parent
    name = f"h200_decode_d576_mla_{cell}" + ("_bf16" if dtype == torch.bfloat16 else "")
    kernel = attngen.load(root / "specs" / f"{name}.yaml")
    assert kernel.plan.block_m == 64 and kernel.plan.threads == 256
    gen = torch.Generator(device="cuda").manual_seed(sum(case[:5]) + splits)
    q = torch.randn((b, sq, h, D), generator=gen, device="cuda").to(dtype)
    cache = torch.randn((b, cap, 1, D), generator=gen, device="cuda").to(dtype)
    lens = torch.randint(max(sq, cap // 3), cap + 1, (b,), generator=gen, device="cuda").int()
    lens[0] = cap
    scale = 1 / math.sqrt(192)
    kc, kwargs = cache, {}
    if page:
        pool, table = pages(torch, cache, page, gen)
        kc, kwargs = pool, {"block_table": table}
    out = torch.full((b, sq, h, DV), float("nan"), device="cuda", dtype=dtype)      # poisoned: every row written
    o, lse = kernel(q, kc, kc[..., :DV], cache_seqlens=lens, causal=causal, scale=scale, layout="bshd",
                    return_lse=True, num_splits=splits, out=out, **kwargs)
    torch.cuda.synchronize()
    assert o.data_ptr() == out.data_ptr() and kernel.last_splits == splits
    assert_matches_fp32(torch, out, lse, q, cache, lens, causal, scale, dtype)
