"""GPU tests of paged decode at any page size: one kernel per cell (paged: true) reads pools of pages of
1 to 512 keys, the page size a kernel parameter. Against the fp32 reference under FlashAttention's
error rule (the verifier's decode check, on shuffled page tables), bit for bit against the same kernel
on the contiguous cache, close to the contiguous-only spec, and through attngen.attention_with_kvcache,
which refuses a page size that is not a power of two from 1 to 512."""
from __future__ import annotations

import functools
from pathlib import Path

import pytest

import attngen
from attngen.eval.verify.decode import DecodeCase, check_decode_case, paged_cache

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
PAGE_SIZES = (1, 2, 4, 16, 64, 128, 256, 512)
HEAD_DIMS = (64, 96, 128, 256)          # every head dim the paged table serves on sm_90
DTYPES = ("fp16", "bf16")


def spec_path(head_dim: int, dtype: str, member: str = "") -> Path:
    """The spec cell of h200_decode_d<head_dim> (a member such as contiguous) in `dtype`."""
    name = f"h200_decode_d{head_dim}" + (f"_{member}" if member else "") + ("_bf16" if dtype == "bf16" else "")
    return ROOT / "specs" / f"{name}.yaml"


@functools.lru_cache(maxsize=None)
def load_once(path: Path):
    return attngen.load(path, synchronize=True)


@pytest.fixture
def torch():
    import torch
    return torch


def cases(block_n: int, pg: int) -> tuple[DecodeCase, ...]:
    """GQA 32/8 and 16/2, one and four new tokens (causal), odd lengths around pages and tiles, a
    length of 1, the capacity; the heuristic's splits, many splits and one; both layouts."""
    n = block_n
    cap = max(3 * pg, 5 * n) + 7          # not a multiple of the page: the last page is partly used
    return (
        DecodeCase(3, 32, 8, 1, cap, (1, n + pg + 1, cap), page_size=pg),
        DecodeCase(3, 32, 8, 4, cap, (2 * n - 1, pg + 3, cap - 2), causal=True, page_size=pg),
        DecodeCase(2, 16, 2, 1, cap, (cap, 3 * pg - 1 if pg > 1 else 7), layout="bshd", num_splits=7, page_size=pg),
        DecodeCase(2, 32, 8, 2, cap, (4 * n + 5, 37), causal=True, num_splits=1, page_size=pg),
    )


@pytest.mark.parametrize("pg", PAGE_SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_paged_decode_at_every_page_size(head_dim, dtype, pg):
    """Every page size against the fp32 reference (shuffled pages, odd lengths, GQA, splits)."""
    kernel = load_once(spec_path(head_dim, dtype))
    assert kernel.plan.paged
    results = [check_decode_case(kernel, case, seed=pg) for case in cases(kernel.plan.block_n, pg)]
    assert all(r.passed for r in results), "\n".join(
        f"page {pg} {r.variant} {r.shape.label}: {'; '.join(r.problems)}" for r in results if not r.passed)


def paged_inputs(torch, dtype, head_dim: int, pg: int, *, batch=3, heads=32, kv_heads=8, seqlen_q=1, capacity=1000,
                 lengths=(999, 1, 517), layout="bhsd", seed=0):
    """q, contiguous caches (a capacity of whole pages), their pools of shuffled pages with the table,
    and the lengths: the same keys both ways."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    capacity = -(-capacity // pg) * pg
    shape_q = (batch, heads, seqlen_q, head_dim) if layout == "bhsd" else (batch, seqlen_q, heads, head_dim)
    shape_k = (batch, kv_heads, capacity, head_dim) if layout == "bhsd" else (batch, capacity, kv_heads, head_dim)
    q, k, v = (torch.randn(s, generator=g, device="cuda").to(dtype) for s in (shape_q, shape_k, shape_k))
    kp, vp, table = paged_cache(torch, k, v, None, pg, layout, g)   # every page of the capacity, shuffled
    lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    return q, k, v, kp, vp, table, lens


@pytest.mark.parametrize("pg", PAGE_SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_equals_contiguous(torch, dtype, pg):
    """The same kernel on the same keys, through shuffled pages and contiguously, with the same splits:
    bit for bit (the tiles land in shared memory the same either way); and within rounding of the
    contiguous-only spec (no page arithmetic at all)."""
    dt = torch.float16 if dtype == "fp16" else torch.bfloat16
    kernel = load_once(spec_path(128, dtype))
    contiguous = load_once(spec_path(128, dtype, "contiguous"))
    for layout, seqlen_q, causal in (("bhsd", 1, False), ("bshd", 4, True)):
        q, k, v, kp, vp, table, lens = paged_inputs(torch, dt, 128, pg, seqlen_q=seqlen_q, layout=layout, seed=pg)
        for splits in (1, 3):
            a = kernel(q, k, v, cache_seqlens=lens, causal=causal, num_splits=splits, layout=layout)
            b = kernel(q, kp, vp, cache_seqlens=lens, block_table=table, causal=causal, num_splits=splits,
                       layout=layout)
            c = contiguous(q, k, v, cache_seqlens=lens, causal=causal, num_splits=splits, layout=layout)
            attngen.check_errors()
            assert torch.isfinite(b).all()
            assert torch.equal(a, b), f"page {pg} {layout} splits {splits}: paged != contiguous"
            assert (b.float() - c.float()).abs().max().item() < 2e-2


@pytest.mark.parametrize("pg", (1, 16, 256, 512))
def test_the_entry_point_serves_every_page_size(torch, pg):
    """attngen.attention_with_kvcache routes a paged call of any page size to a paged cell (4 group rows
    of GQA 32/8: the fused-combine cell; 8 with two new tokens: the plain one) and gives what the
    contiguous cache gives, within rounding."""
    for heads, seqlen_q in ((32, 1), (64, 2)):
        q, k, v, kp, vp, table, lens = paged_inputs(torch, torch.float16, 128, pg, heads=heads, seqlen_q=seqlen_q,
                                                    seed=pg)
        out = attngen.attention_with_kvcache(q, kp, vp, cache_seqlens=lens, block_table=table, causal=True)
        flat = attngen.attention_with_kvcache(q, k, v, cache_seqlens=lens, causal=True)
        attngen.check_errors()
        assert torch.isfinite(out).all()
        assert (out.float() - flat.float()).abs().max().item() < 2e-2


@pytest.mark.parametrize("pg, fragment", [(12, "power of two"), (48, "power of two"), (1024, "from 1 to 512")])
def test_a_page_size_outside_the_range_is_refused(torch, pg, fragment):
    q = torch.randn(2, 32, 1, 128, device="cuda", dtype=torch.float16)
    kp, vp = (torch.randn(6, 8, pg, 128, device="cuda", dtype=torch.float16) for _ in range(2))
    table = torch.arange(6, dtype=torch.int32, device="cuda").view(2, 3)
    lens = torch.tensor([pg, 2 * pg], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match=fragment):
        attngen.attention_with_kvcache(q, kp, vp, cache_seqlens=lens, block_table=table)
    with pytest.raises(ValueError, match=fragment):
        load_once(spec_path(128, "fp16"))(q, kp, vp, cache_seqlens=lens, block_table=table)


@pytest.mark.parametrize("pg", (1, 4, 256))
def test_bad_page_ids_are_clamped_and_recorded(torch, pg):
    """A page id outside the pool, at any page size, is clamped (never read past) and recorded; ids
    past a sequence's pages are never read."""
    q, k, v, kp, vp, table, lens = paged_inputs(torch, torch.float16, 128, pg, lengths=(999, 1, 517))
    table = table.clone()
    last = -(-517 // pg)
    table[2, last:] = -1                                    # past the sequence: fine
    kernel = load_once(spec_path(128, "fp16"))
    kernel(q, kp, vp, cache_seqlens=lens, block_table=table)
    attngen.check_errors()
    table[1, 0] = kp.shape[0] + 5                           # the one page sequence 1 reads
    out = kernel(q, kp, vp, cache_seqlens=lens, block_table=table)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
    with pytest.raises(Exception, match="page"):
        attngen.check_errors()


@pytest.mark.parametrize("pg", (16, 256))
def test_pages_past_4_gib_of_the_pool(torch, pg):
    """Pools of 4.5 GiB each (k and v), NaN but for the pages the table names, all from the pool's upper
    half: every row's byte offset passes 2**31 and most pass 2**32, so a 32-bit offset would read a NaN
    page or another sequence's. Bit for bit what the same kernel gives on the contiguous cache."""
    kernel = load_once(spec_path(128, "fp16"))
    batch, kv_heads, d, capacity = 2, 8, 128, 1024
    g = torch.Generator(device="cuda").manual_seed(pg)
    q = torch.randn((batch, 32, 1, d), generator=g, device="cuda").half()
    k, v = (torch.randn((batch, kv_heads, capacity, d), generator=g, device="cuda").half() for _ in range(2))
    num_pages = (9 << 29) // (pg * kv_heads * d * 2)          # 4.5 GiB of pages
    per_seq = capacity // pg
    ids = num_pages // 2 + torch.randperm(num_pages - num_pages // 2, generator=g, device="cuda")[:batch * per_seq]
    table = ids.int().view(batch, per_seq)
    kp = torch.full((num_pages, kv_heads, pg, d), float("nan"), dtype=torch.float16, device="cuda")
    vp = torch.full_like(kp, float("nan"))
    for src, pool in ((k, kp), (v, vp)):
        pool[ids] = src.view(batch, kv_heads, per_seq, pg, d).transpose(1, 2).reshape(batch * per_seq, kv_heads, pg, d)
    lens = torch.tensor([capacity - 3, 517], dtype=torch.int32, device="cuda")
    for splits in (1, 3):
        a = kernel(q, k, v, cache_seqlens=lens, num_splits=splits)
        b = kernel(q, kp, vp, cache_seqlens=lens, block_table=table, num_splits=splits)
        attngen.check_errors()
        assert torch.isfinite(b).all()
        assert torch.equal(a, b), f"page {pg} splits {splits}: pages past 4 GiB differ from the contiguous cache"
    del kp, vp
    torch.cuda.empty_cache()
