"""GPU tests of appending new tokens in the decode call (FlashAttention's flash_attn_with_kvcache
k=, v=, rotary_cos=, rotary_sin=, cache_batch_idx=, cache_leftpad=): every append spec passes its
verify cases (output and LSE against an fp32 reference that rotates, appends and attends, and the
cache after the call), the public call through the dispatch table in FlashAttention's bshd layout,
a CUDA graph replayed after the lengths change, and the argument checks that need the GPU."""
from __future__ import annotations

import functools
from pathlib import Path

import pytest

import attngen
from attngen.eval import verify
from attngen.eval.verify.decode import DecodeCase, append_cases, check_append_case, reference, rotate

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "specs"
APPEND_SPECS = [SPECS / f"{name}.yaml" for name in ("h200_decode_d128_append", "h200_decode_d128_append_bf16",
                                                      "h200_decode_d64_append", "h200_decode_d64_append_bf16",
                                                      "h200_decode_d96_append", "h200_decode_d96_append_bf16",
                                                      "h200_decode_d256_append", "h200_decode_d256_append_bf16",
                                                      "h200_decode_d64_append_alibi", "h200_decode_d64_append_alibi_bf16", "h200_decode_d96_append_alibi",
                                                      "h200_decode_d96_append_alibi_bf16",
                                                      "h200_decode_d128_append_alibi", "h200_decode_d128_append_alibi_bf16",
                                                      "h200_decode_d256_append_alibi", "h200_decode_d256_append_alibi_bf16")]


@functools.lru_cache(maxsize=None)
def load_once(path: Path):
    return attngen.load(path, synchronize=True)


@pytest.fixture
def torch():
    import torch
    return torch


@pytest.mark.parametrize("spec", APPEND_SPECS, ids=[p.stem for p in APPEND_SPECS])
def test_append_spec_passes_every_case(spec):
    kernel = load_once(spec)
    results = verify.verify_kernel(kernel, verify.FULL_SUITE, spec_label=kernel.name)
    appended = [r for r in results if r.shape.appends]
    plan = kernel.plan
    assert len(appended) == len(append_cases(plan.block_n, plan.paged, "window" in plan.masks))
    assert all(r.passed for r in results), "\n".join(
        f"{r.variant} {r.shape.label}: {'; '.join(r.problems)}" for r in results if not r.passed)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("case", [
    DecodeCase(4, 32, 8, 1, 777, (0, 100, 511, 776), causal=True, layout="bshd", seqlen_new=1, rotary_dim=-1),
    DecodeCase(2, 32, 8, 3, 900, (126, 300), causal=True, layout="bshd", seqlen_new=3, rotary_dim=64,
               interleaved=False, batch_idx=True),
    DecodeCase(3, 16, 2, 2, 600, (40, 260, 598), layout="bshd", seqlen_new=2, rotary_dim=-1, leftpad=(0, 255, 17)),
    DecodeCase(3, 32, 8, 2, 1024, (15, 250, 1000), causal=True, layout="bshd", seqlen_new=2, rotary_dim=-1,
               page_size=16),
], ids=["contiguous", "batch_idx", "leftpad", "paged16"])
def test_random_inputs_against_the_reference(case, seed):
    """Random inputs, NaN-poisoned output: check_append_case compares the output, the LSE and the
    cache after the call with the torch reference."""
    result = check_append_case(load_once(APPEND_SPECS[0]), case, seed)
    assert result.passed, "; ".join(result.problems)


def _inputs(torch, b=2, h=32, kvh=8, sq=1, cap=512, new=1, d=128, rd=128, dtype=None, seed=0):
    dtype = dtype or torch.float16
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s: torch.randn(s, generator=g, device="cuda").to(dtype)   # noqa: E731
    angle = torch.rand((cap, rd // 2), generator=g, device="cuda") * 6.283185307179586
    return (r(b, sq, h, d), r(b, cap, kvh, d), r(b, cap, kvh, d), r(b, new, kvh, d), r(b, new, kvh, d),
            angle.cos().to(dtype), angle.sin().to(dtype))


def _expected(torch, q, kc, vc, kn, vn, cos, sin, lens, causal, interleaved=True):
    """(O, cache k, cache v) the call should give, bshd, from the verify room's reference."""
    b, new = q.shape[0], kn.shape[1]
    L = lens.tolist()
    k_pos = torch.tensor([[x + t for t in range(new)] for x in L], device="cuda")
    q_pos = torch.tensor([[x + (t if causal else 0) for t in range(q.shape[1])] for x in L], device="cuda")
    k_after, v_after = kc.clone(), vc.clone()
    k_rot = rotate(torch, kn.transpose(1, 2), cos, sin, k_pos, interleaved).transpose(1, 2)
    for i in range(b):
        k_after[i, L[i]:L[i] + new] = k_rot[i]
        v_after[i, L[i]:L[i] + new] = vn[i]
    qr = rotate(torch, q.transpose(1, 2), cos, sin, q_pos, interleaved)
    case = DecodeCase(b, q.shape[2], kc.shape[2], q.shape[1], kc.shape[1], tuple(x + new for x in L), causal=causal)
    ref, _, _ = reference(torch, qr, k_after.transpose(1, 2), v_after.transpose(1, 2), case.lengths, case,
                          q.shape[-1] ** -0.5)
    return ref.transpose(1, 2), k_after, v_after


@pytest.mark.parametrize("interleaved", (True, False))
def test_public_call_appends_in_place_like_flash_attention(torch, interleaved):
    """attngen.attention_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, ...) in
    FlashAttention's layout writes the rotated new tokens into the caller's cache tensors and attends them."""
    q, kc, vc, kn, vn, cos, sin = _inputs(torch)
    lens = torch.tensor([5, 300], dtype=torch.int32, device="cuda")
    ref, k_after, v_after = _expected(torch, q, kc, vc, kn, vn, cos, sin, lens, True, interleaved)
    with torch.no_grad():
        o = attngen.attention_with_kvcache(q, kc, vc, kn, vn, cos, sin, cache_seqlens=lens, causal=True,
                                           rotary_interleaved=interleaved, layout="bshd")
    torch.cuda.synchronize()
    assert torch.equal(vc, v_after)
    assert (kc.float() - k_after.float()).abs().max().item() < 2e-3 * 8
    assert (o.float() - ref).abs().max().item() < 2e-2


def test_a_repeated_append_call_writes_and_attends_its_own_tensors(torch, monkeypatch):
    """The second append call of a layout is a prepared launch (it takes no full path): on new tensors of other
    values (queries, caches, new tokens, rotary tables, lengths) it gives their result, not the first call's."""
    kernel = load_once(APPEND_SPECS[0])
    full_paths = []
    first_call = kernel._first_call
    monkeypatch.setattr(kernel, "_first_call", lambda *a, **kw: full_paths.append(1) or first_call(*a, **kw))
    calls = []
    for seed in (1, 2):
        q, kc, vc, kn, vn, cos, sin = _inputs(torch, seed=seed)
        lens = torch.tensor([5 + 40 * seed, 300 - 7 * seed], dtype=torch.int32, device="cuda")
        calls.append((q, kc, vc, kn, vn, cos, sin, lens))
    for i, (q, kc, vc, kn, vn, cos, sin, lens) in enumerate(calls):
        ref, k_after, v_after = _expected(torch, q, kc.clone(), vc.clone(), kn, vn, cos, sin, lens, True)
        with torch.no_grad():
            o = kernel(q, kc, vc, cache_seqlens=lens, k=kn, v=vn, rotary_cos=cos, rotary_sin=sin, causal=True,
                       layout="bshd")
        torch.cuda.synchronize()
        assert torch.equal(vc, v_after) and (kc.float() - k_after.float()).abs().max().item() < 2e-3 * 8
        assert (o.float() - ref).abs().max().item() < 2e-2
        if i == 0:
            taken = len(full_paths)      # 1, or 0 where an earlier test prepared this layout
    assert len(full_paths) == taken      # the second call: prepared


def test_a_captured_step_replays_after_the_lengths_change(torch):
    """No host sync and no allocation that depends on values: one append step captured in a CUDA graph
    replays with new lengths, writing the new tokens where those lengths put them."""
    q, kc, vc, kn, vn, cos, sin = _inputs(torch)
    lens = torch.tensor([10, 20], dtype=torch.int32, device="cuda")
    kernel = load_once(APPEND_SPECS[0])
    call = dict(cache_seqlens=lens, k=kn, v=vn, rotary_cos=cos, rotary_sin=sin, causal=True, layout="bshd")
    kernel(q, kc, vc, **call)   # compiled and set up before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernel(q, kc, vc, **call)
    kc0, vc0 = kc.clone(), vc.clone()
    lens.copy_(torch.tensor([100, 400], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    ref, k_after, v_after = _expected(torch, q, kc0, vc0, kn, vn, cos, sin, lens, True)
    assert torch.equal(vc, v_after)
    assert (kc.float() - k_after.float()).abs().max().item() < 2e-3 * 8
    assert (out.float() - ref).abs().max().item() < 2e-2


def test_validate_refuses_no_room_for_the_new_tokens(torch):
    q, kc, vc, kn, vn, cos, sin = _inputs(torch, new=1, sq=1, cap=512)
    lens = torch.tensor([5, 512], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="needs room"):
        load_once(APPEND_SPECS[0])(q, kc, vc, cache_seqlens=lens, k=kn, v=vn, layout="bshd", validate=True)


def test_a_bad_length_is_clamped_and_recorded(torch):
    """Without validate, a length with no room is clamped in the kernel (no write past the cache) and
    recorded for attngen.check_errors()."""
    q, kc, vc, kn, vn, cos, sin = _inputs(torch, cap=512)
    lens = torch.tensor([5, 512], dtype=torch.int32, device="cuda")
    kc0 = kc.clone()
    load_once(APPEND_SPECS[0])(q, kc, vc, cache_seqlens=lens, k=kn, v=vn, layout="bshd")
    torch.cuda.synchronize()
    assert torch.equal(kc[1], kc0[1])   # nothing of sequence 1 fits: its row is untouched
    with pytest.raises(Exception, match="cache_seqlens"):
        attngen.check_errors()


def _paged(torch, kc, vc, page, gen_seed=7):
    """(k pool, v pool, table) holding the contiguous bshd caches kc, vc in shuffled pages of `page` keys,
    two spare pages of noise; and a function gathering a pool back into a contiguous cache."""
    b, cap = kc.shape[0], kc.shape[1]
    per = cap // page
    g = torch.Generator(device="cuda").manual_seed(gen_seed)
    order = torch.randperm(b * per + 2, generator=g, device="cuda")
    table = order[:b * per].view(b, per).int().contiguous()

    def pool_of(c):
        pool = torch.randn((b * per + 2, page) + tuple(c.shape[2:]), generator=g, device="cuda").to(c.dtype)
        pool[table.view(-1).long()] = c.reshape(b * per, page, *c.shape[2:])
        return pool

    def gather(pool):
        return pool[table.view(-1).long()].reshape(kc.shape)
    return pool_of(kc), pool_of(vc), table, gather


def test_a_paged_append_writes_what_the_contiguous_one_writes_and_records_nothing(torch):
    """Through a block table the new rows land in the sequences' own pages: the pool gathered back equals
    the contiguous call's cache bit for bit, the outputs agree, and check_errors() stays silent."""
    q, kc, vc, kn, vn, cos, sin = _inputs(torch, cap=64, rd=128)
    lens = torch.tensor([5, 20], dtype=torch.int32, device="cuda")
    kp, vp, table, gather = _paged(torch, kc, vc, 16)
    kernel = load_once(APPEND_SPECS[0])
    call = dict(cache_seqlens=lens, k=kn, v=vn, rotary_cos=cos, rotary_sin=sin, causal=True, layout="bshd")
    attngen.check_errors()
    out_c = kernel(q, kc, vc, **call)
    out_p = kernel(q, kp, vp, block_table=table, **call)
    torch.cuda.synchronize()
    attngen.check_errors()              # raises if any length, row or page was flagged
    assert torch.equal(gather(kp), kc) and torch.equal(gather(vp), vc)
    assert (out_p.float() - out_c.float()).abs().max().item() < 1e-2


def test_a_new_row_on_a_page_the_table_does_not_give_is_not_stored(torch):
    """A new token whose table entry is -1 (an engine that did not allocate the next page) is recorded
    and stores nothing: clamped, its page would be another sequence's."""
    q, kc, vc, kn, vn, cos, sin = _inputs(torch, cap=64, rd=128)
    lens = torch.tensor([5, 16], dtype=torch.int32, device="cuda")   # sequence 1's new token opens page 1
    kp, vp, table, _ = _paged(torch, kc, vc, 16)
    table[1, 1:] = -1
    kp0, vp0 = kp.clone(), vp.clone()
    load_once(APPEND_SPECS[0])(q, kp, vp, block_table=table, cache_seqlens=lens, k=kn, v=vn, rotary_cos=cos,
                               rotary_sin=sin, causal=True, layout="bshd")
    torch.cuda.synchronize()
    changed = (kp != kp0).flatten(1).any(1).nonzero().flatten().tolist()
    assert changed == [int(table[0, 0])], changed       # sequence 0's page only
    assert torch.equal(vp[table[1, 0].long()], vp0[table[1, 0].long()])
    with pytest.raises(Exception, match="page"):
        attngen.check_errors()


@pytest.mark.parametrize("head_dim,rd,interleaved", [(80, 80, True), (59, 32, False), (111, 64, True),
                                                    (160, 160, False), (224, 64, True)],
                         ids=["d80-full-rotary", "d59-half", "d111-part", "d160-full-neox", "d224-part"])
def test_padded_head_dims_append_in_place(torch, head_dim, rd, interleaved):
    """A head dim with no append kernel (80, 59, 111, 160, 224) runs padded at the next that has one: the caller's
    cache tensors get the rotated new tokens (their own head dim, nothing else changed) and the output
    is the attention over them, as at a served head dim."""
    q, kc, vc, kn, vn, cos, sin = _inputs(torch, d=head_dim, rd=rd)
    lens = torch.tensor([5, 300], dtype=torch.int32, device="cuda")
    ref, k_after, v_after = _expected(torch, q, kc, vc, kn, vn, cos, sin, lens, True, interleaved)
    with torch.no_grad():
        o = attngen.attention_with_kvcache(q, kc, vc, kn, vn, cos, sin, cache_seqlens=lens, causal=True,
                                           rotary_interleaved=interleaved, layout="bshd")
    torch.cuda.synchronize()
    assert o.shape == q.shape and kc.shape[-1] == head_dim
    assert torch.equal(vc, v_after)
    assert (kc.float() - k_after.float()).abs().max().item() < 2e-3 * 8
    assert (o.float() - ref).abs().max().item() < 2e-2


def test_padded_append_takes_a_paged_cache(torch):
    """The same at d80 with a paged cache: the pools the block table names get the new tokens."""
    q, kc, vc, kn, vn, cos, sin = _inputs(torch, d=80, rd=80, cap=512)
    lens = torch.tensor([5, 300], dtype=torch.int32, device="cuda")
    ref, k_after, v_after = _expected(torch, q, kc, vc, kn, vn, cos, sin, lens, True)
    pg = 16
    pages = kc.shape[1] // pg
    perm = torch.randperm(2 * pages, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))
    table = perm.view(2, pages).to(torch.int32).contiguous()
    kp = torch.empty(2 * pages, pg, kc.shape[2], 80, device="cuda", dtype=kc.dtype)
    vp = torch.empty_like(kp)
    kp[table.long().flatten()] = kc.reshape(2 * pages, pg, kc.shape[2], 80)
    vp[table.long().flatten()] = vc.reshape(2 * pages, pg, vc.shape[2], 80)
    with torch.no_grad():
        o = attngen.attention_with_kvcache(q, kp, vp, kn, vn, cos, sin, cache_seqlens=lens, block_table=table,
                                           causal=True, layout="bshd")
    torch.cuda.synchronize()
    assert torch.equal(vp[table.long().flatten()].reshape(vc.shape), v_after)
    assert (kp[table.long().flatten()].reshape(kc.shape).float() - k_after.float()).abs().max().item() < 2e-3 * 8
    assert (o.float() - ref).abs().max().item() < 2e-2


@pytest.mark.parametrize("options", ["batch_idx", "leftpad", "window"])
def test_padded_append_equals_the_served_kernel_on_padded_inputs(torch, options):
    """The padded path at d80 is the d96 append kernel on zero-padded inputs, bit for bit: its output is the
    first 80 columns of that call's, its caches the first 80 columns of that call's caches, with
    cache_batch_idx (cache rows in another order, more rows than the batch), cache_leftpad or a window."""
    q, kc, vc, kn, vn, cos, sin = _inputs(torch, b=2, d=80, rd=80)
    lens = torch.tensor([7, 301], dtype=torch.int32, device="cuda")
    extra = {}
    if options == "batch_idx":
        kc, vc = (torch.cat([t, t.flip(0)]) for t in (kc, vc))       # 4 cache rows for 2 sequences
        extra["cache_batch_idx"] = torch.tensor([3, 0], dtype=torch.int32, device="cuda")
    elif options == "leftpad":
        extra["cache_leftpad"] = torch.tensor([2, 100], dtype=torch.int32, device="cuda")
    else:
        extra["window"] = (64, 0)
    pad = lambda t: torch.nn.functional.pad(t, (0, 16))     # noqa: E731
    kc96, vc96 = pad(kc), pad(vc)
    with torch.no_grad():
        o, lse = attngen.attention_with_kvcache(q, kc, vc, kn, vn, cos, sin, cache_seqlens=lens, causal=True,
                                                layout="bshd", return_lse=True, **extra)
        o96, lse96 = attngen.attention_with_kvcache(pad(q), kc96, vc96, pad(kn), pad(vn), cos, sin, cache_seqlens=lens,
                                                    causal=True, layout="bshd", return_lse=True,
                                                    scale=80 ** -0.5, **extra)
    torch.cuda.synchronize()
    assert torch.equal(o, o96[..., :80]) and torch.equal(lse, lse96)
    assert torch.equal(kc, kc96[..., :80]) and torch.equal(vc, vc96[..., :80])


def test_padded_append_returns_the_lse_and_refuses_mismatched_head_dims(torch):
    """return_lse through the padded path gives the LSE of the call (as the kernel at d96 computes it for
    the zero-padded q, the same scores); new tokens of another head dim than q's are refused before any
    copy, the caches untouched."""
    q, kc, vc, kn, vn, cos, sin = _inputs(torch, d=80, rd=80)
    lens = torch.tensor([5, 300], dtype=torch.int32, device="cuda")
    with torch.no_grad():
        o, lse = attngen.attention_with_kvcache(q, kc.clone(), vc.clone(), kn, vn, cos, sin, cache_seqlens=lens,
                                                causal=True, layout="bshd", return_lse=True)
    assert o.shape == q.shape and lse.shape == (q.shape[0], q.shape[2], q.shape[1]) and torch.isfinite(lse).all()
    before = kc.clone()
    with pytest.raises(ValueError, match="head dim"):
        attngen.attention_with_kvcache(q, kc, vc, kn[..., :64].contiguous(), vn[..., :64].contiguous(),
                                       cache_seqlens=lens, causal=True, layout="bshd")
    assert torch.equal(kc, before)


def test_append_with_alibi_and_a_window_from_pages_at_d256(torch):
    """Appending with ALiBi at d256 from a paged cache with a window (its cell makes the rows' slopes at
    every tile; held, they spilled): the call writes the new tokens into their pages, and its output is
    the plain decode call's (no append, the ALiBi window cell) on the cache as it leaves, the new tokens
    counted; the pages no sequence appends to are untouched."""
    g = torch.Generator(device="cuda").manual_seed(1)
    b, h, kvh, d, page, pages = 2, 8, 2, 256, 16, 24
    r = lambda *s: torch.randn(s, generator=g, device="cuda").half()   # noqa: E731
    q, kn, vn = r(b, 1, h, d), r(b, 1, kvh, d), r(b, 1, kvh, d)
    k_pool, v_pool = r(pages, page, kvh, d), r(pages, page, kvh, d)
    table = torch.randperm(pages, generator=g, device="cuda").to(torch.int32)[:b * 10].view(b, 10)
    lens = torch.tensor([37, 150], dtype=torch.int32, device="cuda")
    slopes = torch.rand(h, generator=g, device="cuda")
    k_after, v_after = k_pool.clone(), v_pool.clone()
    for i, n in enumerate(lens.tolist()):
        k_after[table[i, n // page], n % page] = kn[i, 0]
        v_after[table[i, n // page], n % page] = vn[i, 0]
    call = dict(block_table=table, alibi_slopes=slopes, window=(40, 0), layout="bshd")
    with torch.no_grad():
        o = attngen.attention_with_kvcache(q, k_pool, v_pool, kn, vn, cache_seqlens=lens, **call)
        plain = attngen.attention_with_kvcache(q, k_after, v_after, cache_seqlens=lens + 1, **call)
    torch.cuda.synchronize()
    assert torch.equal(k_pool, k_after) and torch.equal(v_pool, v_after)
    assert torch.isfinite(o).all() and (o.float() - plain.float()).abs().max().item() < 2e-3