"""GPU tests of paged varlen prefill (FlashAttention's flash_attn_varlen_func(block_table=, seqused_k=)):
the paged cells (h100_mma_d{64,96,128,256}_paged[_bf16]) read K/V from pools of shuffled pages of 1 to 256 keys
(spare pages and the tails of last pages NaN), mixed batches of prefill chunks and single-token rows,
GQA, causal (bottom-right) and not, against the fp32 reference sequence by sequence under
FlashAttention's error rule, into NaN-filled outputs; bit for bit against the same kernel on the same
keys packed back to back; through attngen.attention_varlen, which routes block_table calls to the paged
entries and refuses bad pages, tables and gradients clearly."""
from __future__ import annotations

import functools
from pathlib import Path

import pytest

import attngen
from attngen.core.variants import ALIBI, SINK, SOFTCAP
from attngen.eval.verify.cases import error_bound, reference_errors
from attngen.runtime import InputError
from attngen.runtime.calls.varlen import cu_seqlens

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
PAGE_SIZES = (1, 16, 64, 256)
CELLS = [(64, "fp16"), (64, "bf16"), (96, "bf16"), (128, "fp16"), (128, "bf16"), (256, "bf16")]
# (queries, keys) per sequence: single decode tokens, prefill chunks at the end of their keys, a whole
# prompt (as many queries as keys), lengths around 64/128-key tiles and pages
MIXED = ((1, 1000), (37, 37), (1, 1), (200, 700), (1, 63), (129, 429), (1, 257), (64, 64))


@functools.lru_cache(maxsize=None)
def load_once(head_dim: int, dtype: str):
    name = f"h100_mma_d{head_dim}_paged" + ("_bf16" if dtype == "bf16" else "")
    return attngen.load(ROOT / "specs" / f"{name}.yaml", synchronize=True)


@pytest.fixture
def torch():
    import torch
    return torch


def torch_dtype(torch, dtype: str):
    return torch.float16 if dtype == "fp16" else torch.bfloat16


def packed(torch, seqs, heads, kv_heads, d, dtype, seed):
    """q (total_q, H, D), k and v (total_k, Hkv, D) and their offsets."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    tq, tk = sum(s[0] for s in seqs), sum(s[1] for s in seqs)
    q = torch.randn(tq, heads, d, generator=g, device="cuda").to(dtype)
    k = torch.randn(tk, kv_heads, d, generator=g, device="cuda").to(dtype)
    v = torch.randn(tk, kv_heads, d, generator=g, device="cuda").to(dtype)
    return q, k, v, cu_seqlens(torch, [s[0] for s in seqs], "cuda"), cu_seqlens(torch, [s[1] for s in seqs], "cuda"), g


def page_pools(torch, k, v, lens_k, pg, g, spare=3, extra_cols=1):
    """k and v (packed) as pools (num_pages, pg, Hkv, D) of shuffled pages: spare pages and the tail of
    each sequence's last page NaN, table entries past a sequence's pages -1."""
    need = [-(-n // pg) for n in lens_k]
    pages = sum(need) + spare
    order = torch.randperm(pages, generator=g, device="cuda")
    shape = (pages, pg) + tuple(k.shape[1:])
    kp = torch.full(shape, float("nan"), dtype=k.dtype, device="cuda")
    vp = torch.full(shape, float("nan"), dtype=v.dtype, device="cuda")
    table = torch.full((len(lens_k), max(need) + extra_cols), -1, dtype=torch.int32, device="cuda")
    at = start = 0
    for b, (n, keys) in enumerate(zip(need, lens_k)):
        ids = order[at:at + n]
        at += n
        table[b, :n] = ids.int()
        for src, pool in ((k, kp), (v, vp)):
            rows = torch.full((n * pg,) + tuple(src.shape[1:]), float("nan"), dtype=src.dtype, device="cuda")
            rows[:keys] = src[start:start + keys]
            pool[ids] = rows.reshape((n, pg) + tuple(src.shape[1:]))
        start += keys
    return kp, vp, table


def check_sequences(torch, q, k, v, out, seqs, causal, scale, label, window=None, modifiers=()):
    """Each sequence against the fp32 reference (bottom-right causal or window, the score modifiers) under
    the error rule."""
    problems = []
    assert torch.isfinite(out).all(), f"{label}: non-finite output (a row not written, or a NaN page read)"
    mask = "window" if window is not None else "causal" if causal else "none"
    q0 = k0 = 0
    for b, (sq, sk) in enumerate(seqs):
        if sq == 0:     # a sequence with no query row: nothing to check
            k0 += sk
            continue
        qb, kb, vb, ob = (t[a:a + n].transpose(0, 1).unsqueeze(0)
                          for t, a, n in ((q, q0, sq), (k, k0, sk), (v, k0, sk), (out, q0, sq)))
        err, low, _ = reference_errors(torch, qb, kb, vb, ob, scale=scale, mask=mask,
                                       alignment=None if mask == "none" else "bottom_right", window=window,
                                       modifiers=modifiers)
        if not err <= error_bound(low):
            problems.append(f"{label} sequence {b} ({sq} queries, {sk} keys): max err {err:.3g} > "
                            f"bound {error_bound(low):.3g} (torch low precision {low:.3g})")
        q0, k0 = q0 + sq, k0 + sk
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("pg", PAGE_SIZES)
@pytest.mark.parametrize("head_dim,dtype", CELLS, ids=[f"d{d}-{t}" for d, t in CELLS])
def test_paged_varlen_against_reference(torch, head_dim, dtype, pg, causal):
    """Mixed prefill chunks and single tokens, GQA 8/2, shuffled pages, NaN spare pages and page tails,
    a NaN-filled output: every row written, each sequence within the error rule; bit for bit the same
    kernel's output on the keys packed back to back."""
    kernel = load_once(head_dim, dtype)
    assert kernel.plan.paged
    dt = torch_dtype(torch, dtype)
    q, k, v, cu_q, cu_k, g = packed(torch, MIXED, 8, 2, head_dim, dt, seed=pg + head_dim)
    lens_k = [s[1] for s in MIXED]
    kp, vp, table = page_pools(torch, k, v, lens_k, pg, g)
    used = torch.tensor(lens_k, dtype=torch.int32, device="cuda")
    scale = head_dim ** -0.5
    out = torch.full_like(q, float("nan"))
    kernel.varlen(q, kp, vp, cu_q, None, block_table=table, seqused_k=used, causal=causal, out=out,
                  max_seqlen_q=max(s[0] for s in MIXED))
    torch.cuda.synchronize()
    attngen.check_errors()
    check_sequences(torch, q, k, v, out, MIXED, causal, scale, f"d{head_dim} {dtype} page {pg}")
    contiguous = kernel.varlen(q, k, v, cu_q, cu_k, causal=causal, alignment="bottom_right" if causal else None)
    assert torch.equal(out, contiguous)
    # without seqused_k the keys come from cu_seqlens_k, as FlashAttention takes them
    again = kernel.varlen(q, kp, vp, cu_q, cu_k, block_table=table, causal=causal)
    assert torch.equal(again, out)


@pytest.mark.parametrize("head_dim,dtype", [(128, "fp16"), (64, "bf16")], ids=["d128-fp16", "d64-bf16"])
def test_repeated_paged_varlen_calls_take_the_prepared_path(torch, head_dim, dtype, monkeypatch):
    """A paged varlen call of a layout seen before is a prepared launch (no full path) with its own
    tensors: two calls on new q, pools, tables and lengths of one layout each give what the full path
    (validate=True) gives on theirs, and differ from each other; lengths and table entries rewritten in
    place are read at the next launch."""
    import attngen.runtime.calls.varlen as varlen_module
    kernel = load_once(head_dim, dtype)
    dt = torch_dtype(torch, dtype)
    lens_k = [s[1] for s in MIXED]
    longest = max(s[0] for s in MIXED)
    full = []
    first = varlen_module.check_offsets
    monkeypatch.setattr(varlen_module, "check_offsets", lambda *a, **kw: full.append(1) or first(*a, **kw))
    calls = []
    for i, seed in enumerate((11, 12)):
        q, k, v, cu_q, _, g = packed(torch, MIXED, 8, 2, head_dim, dt, seed=seed)
        kp, vp, table = page_pools(torch, k, v, lens_k, 16, g)
        used = torch.tensor(lens_k, dtype=torch.int32, device="cuda")
        out = kernel.varlen(q, kp, vp, cu_q, None, block_table=table, seqused_k=used, causal=True, max_seqlen_q=longest)
        if i == 0:
            taken = len(full)
        calls.append((q, kp, vp, cu_q, table, used, out))
    assert len(full) == taken, "the second call of the layout took the full path"
    monkeypatch.undo()
    for q, kp, vp, cu_q, table, used, out in calls:
        want = kernel.varlen(q, kp, vp, cu_q, None, block_table=table, seqused_k=used, causal=True,
                             max_seqlen_q=longest, validate=True)
        assert torch.isfinite(out).all() and torch.equal(out, want)
    assert not torch.equal(calls[0][-1], calls[1][-1])
    q, kp, vp, cu_q, table, used, _ = calls[0]
    used.sub_(1).clamp_(min=0)              # each sequence one key shorter, in place
    table[[4, 7]] = table[[7, 4]].clone()   # two sequences of 4 pages swap them, in place (no NaN row read)
    got = kernel.varlen(q, kp, vp, cu_q, None, block_table=table, seqused_k=used, causal=True, max_seqlen_q=longest)
    want = kernel.varlen(q, kp, vp, cu_q, None, block_table=table, seqused_k=used, causal=True, max_seqlen_q=longest,
                         validate=True)
    assert torch.equal(got, want) and not torch.equal(got, calls[0][-1])


@pytest.mark.parametrize("window", [(100, 0), (48, 17)], ids=["causal-100", "two-sided"])
@pytest.mark.parametrize("pg", (1, 16, 256))
@pytest.mark.parametrize("head_dim,dtype", CELLS + [(80, "fp16")], ids=[f"d{d}-{t}" for d, t in CELLS + [(80, "fp16")]])
def test_paged_varlen_window_against_reference(torch, head_dim, dtype, pg, window):
    """A sliding window in the paged call (FlashAttention's flash_attn_varlen_func(window_size=,
    block_table=)): through attngen.attention_varlen (d80 padded to d96's cell), each sequence's window
    from its own key count (bottom-right), within the error rule of the fp32 reference sequence by
    sequence, NaN spare pages and tails, and bit for bit the same cell's packed varlen call."""
    dt = torch_dtype(torch, dtype)
    q, k, v, cu_q, cu_k, g = packed(torch, MIXED, 8, 2, head_dim, dt, seed=3 * pg + head_dim)
    lens_k = [s[1] for s in MIXED]
    kp, vp, table = page_pools(torch, k, v, lens_k, pg, g)
    used = torch.tensor(lens_k, dtype=torch.int32, device="cuda")
    causal = window[1] == 0
    longest = max(s[0] for s in MIXED), max(lens_k)
    out = attngen.attention_varlen(q, kp, vp, cu_q, None, *longest, block_table=table, seqused_k=used,
                                   causal=causal, window=window)
    torch.cuda.synchronize()
    attngen.check_errors()
    check_sequences(torch, q, k, v, out, MIXED, causal, head_dim ** -0.5, f"d{head_dim} {dtype} page {pg}",
                    window=window)
    if head_dim != 80:      # the paged cell's own packed path (d80 runs padded)
        cell = served_paged_cell(torch, q, kp, "window", {}, max(lens_k))
        packed_out = cell.varlen(q, k, v, cu_q, cu_k, causal=causal, window=window, alignment="bottom_right")
        assert torch.equal(out, packed_out)


# The models that serve score modifiers from paged caches: gpt-oss (d64, learned sinks, causal and a 128-key
# window), Gemma 2's global layers (d256, softcap 50, causal) and local ones (a window the sequences cross,
# standing in for its 4096 keys), MPT (d128, ALiBi), every modifier at once
# under a window the sequences cross; d96 pads to d128's cells. The packed call it is compared with
# runs the same cell (at d256, where the softcap members read packed K/V only, the paged cell's packed path).
SCORE_CASES = [
    (64, "bf16", {"sinks": True}, (128, 0)), (64, "fp16", {"sinks": True}, None),
    (256, "bf16", {"softcap": 50.0}, None), (256, "fp16", {"softcap": 50.0}, None),
    (256, "bf16", {"softcap": 50.0}, (48, 0)), (256, "fp16", {"softcap": 50.0}, (48, 0)),
    (128, "fp16", {"alibi": True}, None), (128, "bf16", {"softcap": 30.0, "alibi": True, "sinks": True}, (48, 17)),
    (96, "bf16", {"softcap": 30.0, "sinks": True}, None),
]


def served_paged_cell(torch, q, pool, mask: str, kw, seqlen: int, head_dim: int | None = None):
    """The kernel the table serves a paged varlen call of q's head dim (or `head_dim`, the one it is padded to) on
    `pool`'s pages with this mask and these score modifiers (softcap=, alibi_slopes=, sinks=) from: the packed call
    it is compared with runs the same cell, since packed varlen calls may be served by other cells (the Hopper
    kind's) than paged ones, and pages of some sizes by other cells than others (min_page)."""
    from attngen.ops.dispatch import DISPATCH
    from attngen.ops.library import call_scores
    return DISPATCH.kernel("varlen", q.get_device(), q.dtype, head_dim or q.shape[-1], mask, seqlen, paged=True,
                           scores=call_scores(kw.get("softcap"), kw.get("alibi_slopes"), kw.get("sinks")),
                           page=pool.shape[1])


def served_packed_call(torch, q, k, v, cu_q, cu_k, pool, mask: str, kw, seqlen: int, **call):
    """The packed varlen call of the cell served_paged_cell names, at the head dim the table runs the paged call at:
    q, k and v zero-padded to it as the entry point pads them (no kernel of their own head dim), the scale of their
    own head dim, the output cut back to it."""
    from attngen.ops.dispatch import DISPATCH
    from attngen.ops.library import call_scores
    d = q.shape[-1]
    dims = DISPATCH.padded_dims("varlen", q.get_device(), q.dtype, d, v.shape[-1], mask,
                                call_scores(kw.get("softcap"), kw.get("alibi_slopes"), kw.get("sinks")), paged=True)
    to = dims[0] if dims else d
    widen = (lambda t: torch.nn.functional.pad(t, (0, to - d))) if to != d else (lambda t: t)
    cell = served_paged_cell(torch, q, pool, mask, kw, seqlen, to)
    return cell.varlen(widen(q), widen(k), widen(v), cu_q, cu_k, scale=d ** -0.5, **kw, **call)[..., :d]


def modifiers_of(kw):
    """The reference's score modifiers of a call's keyword arguments (softcap=, alibi_slopes=, sinks=)."""
    return tuple((m, kw[m.argument]) for m in (SOFTCAP, ALIBI, SINK) if m.argument in kw)


@pytest.mark.parametrize("pg", (1, 16, 256))
@pytest.mark.parametrize("head_dim,dtype,mods,window", SCORE_CASES,
                         ids=[f"d{d}-{t}-{'+'.join(m)}-{'w' if w else 'causal'}" for d, t, m, w in SCORE_CASES])
def test_paged_varlen_scores_against_reference(torch, head_dim, dtype, mods, window, pg):
    """Softcap, ALiBi and learned sinks in the paged call (the scores members of h100_mma_d64 and d128 read
    pages too; d256's softcap has h100_mma_d256_paged_softcap, with a window h100_mma_d256_paged_window_softcap):
    through attngen.attention_varlen, each sequence's ALiBi offset and window from its own key count
    (bottom-right), within the error rule of the fp32 reference with the same modifiers sequence by sequence, NaN
    spare pages and tails, and bit for bit the served paged cell's packed varlen call."""
    dt = torch_dtype(torch, dtype)
    q, k, v, cu_q, cu_k, g = packed(torch, MIXED, 8, 2, head_dim, dt, seed=5 * pg + head_dim)
    lens_k = [s[1] for s in MIXED]
    kp, vp, table = page_pools(torch, k, v, lens_k, pg, g)
    used = torch.tensor(lens_k, dtype=torch.int32, device="cuda")
    kw = {}
    if "softcap" in mods:
        kw["softcap"] = mods["softcap"]
    if "alibi" in mods:
        kw["alibi_slopes"] = torch.rand(8, generator=g, device="cuda") * 0.3
    if "sinks" in mods:
        kw["sinks"] = torch.randn(8, generator=g, device="cuda") * 2
    causal = window is None or window[1] == 0
    longest = max(s[0] for s in MIXED), max(lens_k)
    out = attngen.attention_varlen(q, kp, vp, cu_q, None, *longest, block_table=table, seqused_k=used,
                                   causal=causal, window=window, **kw)
    torch.cuda.synchronize()
    attngen.check_errors()
    check_sequences(torch, q, k, v, out, MIXED, causal, head_dim ** -0.5, f"d{head_dim} {dtype} page {pg}",
                    window=window, modifiers=modifiers_of(kw))
    # the paged cell's own packed path
    packed_out = served_packed_call(torch, q, k, v, cu_q, cu_k, kp, "window" if window else "causal" if causal else
                                    "none", kw, longest[1], causal=causal, window=window, alignment="bottom_right")
    # the varlen kernel's rows (without a window, single-query sequences may take the paged decode call)
    rows = [r for b, (sq, _) in enumerate(MIXED) if sq > 1 or window
            for r in range(int(cu_q[b]), int(cu_q[b + 1]))]
    rows = torch.tensor(rows, device="cuda")
    assert torch.equal(out[rows], packed_out[rows])


@pytest.mark.parametrize("head_dim,dtype", CELLS, ids=[f"d{d}-{t}" for d, t in CELLS])
def test_attention_varlen_routes_paged_calls(torch, head_dim, dtype):
    """attngen.attention_varlen(block_table=, seqused_k=, cu_seqlens_k=None) takes the paged entry (causal
    bottom-right by default, as FlashAttention's), returns the LSE, and agrees with the packed call of the
    dispatch table (another spec) within the error rule's bound."""
    dt = torch_dtype(torch, dtype)
    seqs = ((1, 300), (17, 17), (1, 5), (96, 1100))
    q, k, v, cu_q, cu_k, g = packed(torch, seqs, 16, 4, head_dim, dt, seed=7)
    kp, vp, table = page_pools(torch, k, v, [s[1] for s in seqs], 16, g)
    used = torch.tensor([s[1] for s in seqs], dtype=torch.int32, device="cuda")
    with torch.no_grad():
        o, lse = attngen.attention_varlen(q, kp, vp, cu_q, None, 96, 1100, causal=True, block_table=table,
                                          seqused_k=used, return_lse=True)
        ref = attngen.attention_varlen(q, k, v, cu_q, cu_k, 96, 1100, causal=True, alignment="bottom_right")
    assert lse.shape == (16, q.shape[0]) and torch.isfinite(lse).all()
    check_sequences(torch, q, k, v, o, seqs, True, head_dim ** -0.5, f"d{head_dim} {dtype} attention_varlen")
    check_sequences(torch, q, k, v, ref, seqs, True, head_dim ** -0.5, f"d{head_dim} {dtype} packed")
    assert (o.float() - ref.float()).abs().max().item() < 5e-2
    # the decode kind's pools (num_pages, Hkv, page_size, D) serve the same call through a transposed view
    kp_decode, vp_decode = kp.transpose(1, 2).contiguous(), vp.transpose(1, 2).contiguous()
    o2 = attngen.attention_varlen(q, kp_decode.transpose(1, 2), vp_decode.transpose(1, 2), cu_q, None, 96, 1100,
                                  causal=True, block_table=table, seqused_k=used)
    assert torch.equal(o2, o)


# Head dims with no paged varlen cell: q and the pools zero-padded to the next that has one (32, 40 and
# 59 to 64, 80 to 96, 111 to 128, 160-224 to 256), as FlashAttention's varlen tests call them
PADDED_CELLS = [(32, "bf16"), (59, "bf16"), (80, "fp16"), (111, "bf16"), (160, "bf16"), (224, "fp16")]


@pytest.mark.parametrize("head_dim,dtype", PADDED_CELLS, ids=[f"d{d}-{t}" for d, t in PADDED_CELLS])
def test_attention_varlen_pads_other_head_dims(torch, head_dim, dtype):
    """A paged call at a head dim the table has no paged varlen kernel of runs padded: out of q's head
    dim, within the error rule sequence by sequence, agreeing with the packed call; the pools unchanged."""
    from attngen.ops.dispatch import DISPATCH
    dt = torch_dtype(torch, dtype)
    assert not DISPATCH.serves("varlen", 0, dt, head_dim, "causal", paged=True)
    assert DISPATCH.padded_dims("varlen", 0, dt, head_dim, head_dim, "causal", "", paged=True)
    seqs = ((1, 300), (17, 17), (1, 5), (96, 1100))
    q, k, v, cu_q, cu_k, g = packed(torch, seqs, 8, 2, head_dim, dt, seed=11)
    kp, vp, table = page_pools(torch, k, v, [s[1] for s in seqs], 16, g)
    before = (kp.clone(), vp.clone())
    used = torch.tensor([s[1] for s in seqs], dtype=torch.int32, device="cuda")
    with torch.no_grad():
        o, lse = attngen.attention_varlen(q, kp, vp, cu_q, None, 96, 1100, causal=True, block_table=table,
                                          seqused_k=used, return_lse=True)
        ref = attngen.attention_varlen(q, k, v, cu_q, cu_k, 96, 1100, causal=True, alignment="bottom_right")
    assert o.shape == q.shape and o.is_contiguous() and lse.shape == (8, q.shape[0])
    check_sequences(torch, q, k, v, o, seqs, True, head_dim ** -0.5, f"d{head_dim} {dtype} padded paged")
    assert (o.float() - ref.float()).abs().max().item() < 5e-2
    for pool, kept in zip((kp, vp), before):        # padded copies: the caller's pools are untouched
        assert torch.equal(pool.isnan(), kept.isnan()) and torch.equal(pool.nan_to_num(), kept.nan_to_num())


DECODE_STEP_CELLS = CELLS


@pytest.mark.parametrize("head_dim,dtype", DECODE_STEP_CELLS, ids=[f"d{d}-{t}" for d, t in DECODE_STEP_CELLS])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_a_decode_step_takes_the_decode_kernel(torch, monkeypatch, head_dim, dtype, causal):
    """A paged varlen call with one query per sequence (max_seqlen_q 1, total_q == batch) runs the paged
    decode kernel (GQA rows packed, keys read once per KV head): within the rule of fp32, its LSE in the
    varlen layout (Hq, total_q) and close to the varlen kernel's; NaN spare pages and page tails."""
    from attngen.ops import library
    calls = []
    real = library.kvcache
    monkeypatch.setattr(library, "kvcache", lambda *a, **kw: calls.append(a[0].shape) or real(*a, **kw))
    dt = torch_dtype(torch, dtype)
    seqs = tuple((1, n) for n in (1, 700, 33, 4096, 129, 16, 2000, 5))
    q, k, v, cu_q, cu_k, g = packed(torch, seqs, 32, 8, head_dim, dt, seed=head_dim + causal)
    kp, vp, table = page_pools(torch, k, v, [s[1] for s in seqs], 16, g)
    used = torch.tensor([s[1] for s in seqs], dtype=torch.int32, device="cuda")
    with torch.no_grad():
        o, lse = attngen.attention_varlen(q, kp, vp, cu_q, None, 1, 4096, causal=causal, block_table=table,
                                          seqused_k=used, return_lse=True)
    torch.cuda.synchronize()
    attngen.check_errors()
    assert calls == [(len(seqs), 1, 32, head_dim)], calls
    assert o.shape == q.shape and lse.shape == (32, len(seqs)) and lse.is_contiguous()
    check_sequences(torch, q, k, v, o, seqs, causal, head_dim ** -0.5, f"d{head_dim} {dtype} decode step")
    # a sequence with no query between others, q holding a spare row at the end: rows follow cu_seqlens_q
    gap = seqs[:3] + ((0, 64),) + seqs[3:]
    qg, kg, vg, cu_g, _, gg = packed(torch, gap, 32, 8, head_dim, dt, seed=5)
    qg = torch.cat([qg, qg[:1]])
    kpg, vpg, table_g = page_pools(torch, kg, vg, [s[1] for s in gap], 16, gg)
    used_g = torch.tensor([s[1] for s in gap], dtype=torch.int32, device="cuda")
    with torch.no_grad():
        og = attngen.attention_varlen(qg, kpg, vpg, cu_g, None, 1, 4096, causal=causal, block_table=table_g,
                                      seqused_k=used_g)
    check_sequences(torch, qg[:-1], kg, vg, og[:-1], gap, causal, head_dim ** -0.5, f"d{head_dim} {dtype} gap")
    # the varlen kernel serves each of these head dims paged too: the two kernels agree
    ov, lsev = load_once(head_dim, dtype).varlen(q, kp, vp, cu_q, None, block_table=table, seqused_k=used,
                                                 causal=causal, return_lse=True, max_seqlen_q=1)
    assert (o.float() - ov.float()).abs().max().item() < 2e-2
    assert (lse - lsev).abs().max().item() < 1e-3


@pytest.mark.parametrize("head_dim,dtype", CELLS, ids=[f"d{d}-{t}" for d, t in CELLS])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_a_mixed_step_sends_its_decode_rows_to_the_decode_kernel(torch, monkeypatch, head_dim, dtype, causal):
    """Prefill chunks beside single decode tokens (and sequences of no query) in one paged varlen call: the
    decode kernel takes the single-query sequences, the varlen kernel the rest, split on the GPU; every
    row within the rule of fp32, output and LSE close to the varlen kernel's alone, and the same again
    when the step is replayed from a CUDA graph after the lengths change."""
    from attngen.ops import library
    calls = []
    real = library.kvcache
    monkeypatch.setattr(library, "kvcache", lambda *a, **kw: calls.append(a[0].shape) or real(*a, **kw))
    dt = torch_dtype(torch, dtype)
    seqs = ((1, 300), (17, 17), (0, 40), (1, 5), (96, 1100), (1, 1), (1, 2049), (3, 64), (0, 9))
    q, k, v, cu_q, cu_k, g = packed(torch, seqs, 16, 4, head_dim, dt, seed=11 + causal)
    kp, vp, table = page_pools(torch, k, v, [s[1] for s in seqs], 16, g)
    used = torch.tensor([s[1] for s in seqs], dtype=torch.int32, device="cuda")
    with torch.no_grad():
        o, lse = attngen.attention_varlen(q, kp, vp, cu_q, None, 96, 2049, causal=causal, block_table=table,
                                          seqused_k=used, return_lse=True)
    torch.cuda.synchronize()
    attngen.check_errors()
    assert calls == [(len(seqs), 1, 16, head_dim)], calls
    assert o.shape == q.shape and lse.shape == (16, q.shape[0]) and lse.is_contiguous()
    check_sequences(torch, q, k, v, o, seqs, causal, head_dim ** -0.5, f"d{head_dim} {dtype} mixed")
    cell = served_paged_cell(torch, q, kp, "causal" if causal else "none", {}, 2049)   # the varlen kernel it ran
    ov, lsev = cell.varlen(q, kp, vp, cu_q, None, block_table=table, seqused_k=used, causal=causal, return_lse=True,
                           max_seqlen_q=96)
    assert (o.float() - ov.float()).abs().max().item() < 2e-2
    assert (lse - lsev).abs().max().item() < 1e-3
    # rows of the prefill sequences are the varlen kernel's own, bit for bit
    prefill = torch.cat([torch.arange(int(cu_q[b]), int(cu_q[b + 1])) for b, s in enumerate(seqs) if s[0] > 1])
    assert torch.equal(o[prefill.cuda()], ov[prefill.cuda()])
    # captured once, replayed after new lengths: no value is read back on the host
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        o_graph = attngen.attention_varlen(q, kp, vp, cu_q, None, 96, 2049, causal=causal, block_table=table,
                                           seqused_k=used)
    shorter = [max(s[0], min(s[1], s[1] // 2 + 1)) for s in seqs]
    used.copy_(torch.tensor(shorter, dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    k_short = torch.cat([k[int(cu_k[b]):int(cu_k[b]) + n] for b, n in enumerate(shorter)])
    v_short = torch.cat([v[int(cu_k[b]):int(cu_k[b]) + n] for b, n in enumerate(shorter)])
    check_sequences(torch, q, k_short, v_short, o_graph, [(s[0], n) for s, n in zip(seqs, shorter)], causal,
                    head_dim ** -0.5, f"d{head_dim} {dtype} mixed, graph replay")


def decode_calls(monkeypatch, name: str = "kvcache"):
    """The decode launches of a step's decode rows, recorded: ("rows", batch, Hq, D) for a rows call in place
    (DecodeKernel.rows_call), q's shape for a decode call on the rows gathered by tensor ops (library.<name>)."""
    from attngen.ops import library
    from attngen.runtime.calls.decode import DecodeKernel
    calls = []
    real, rows_call = getattr(library, name), DecodeKernel.rows_call
    monkeypatch.setattr(library, name, lambda *a, **kw: calls.append(tuple(a[0].shape)) or real(*a, **kw))

    def recorded(self, q, k, v, lens, table, *a, **kw):
        done = rows_call(self, q, k, v, lens, table, *a, **kw)
        if done:
            calls.append(("rows", table.shape[0]) + tuple(q.shape[1:]))
        return done
    monkeypatch.setattr(DecodeKernel, "rows_call", recorded)
    return calls


@pytest.mark.parametrize("head_dim,dtype", CELLS, ids=[f"d{d}-{t}" for d, t in CELLS])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_a_mixed_step_in_place_equals_the_split_by_tensor_ops(torch, monkeypatch, head_dim, dtype, causal):
    """Without LSE a serving step's decode rows are decoded in place: the paged decode kernel's rows functions read
    and write them at their packed rows, and the varlen kernel leaves them alone (single_queries_apart). Bit for bit
    the step split by tensor ops (the same call with LSE), every row within the rule of fp32, at pages of 16 and 256;
    then from a CUDA graph replayed after the lengths change."""
    calls = decode_calls(monkeypatch)
    dt = torch_dtype(torch, dtype)
    seqs = ((1, 300), (17, 17), (0, 40), (1, 5), (96, 1100), (1, 1), (1, 2049), (3, 64), (0, 9), (1, 4100))
    q, k, v, cu_q, cu_k, g = packed(torch, seqs, 16, 4, head_dim, dt, seed=31 + causal)
    used = torch.tensor([s[1] for s in seqs], dtype=torch.int32, device="cuda")
    for pg in (16, 256):
        kp, vp, table = page_pools(torch, k, v, [s[1] for s in seqs], pg, g)
        with torch.no_grad():
            o = attngen.attention_varlen(q, kp, vp, cu_q, None, 96, 4100, causal=causal, block_table=table,
                                         seqused_k=used)
            torch.cuda.synchronize()
            attngen.check_errors()
            assert calls == [("rows", len(seqs), 16, head_dim)], (pg, calls)
            split, _ = attngen.attention_varlen(q, kp, vp, cu_q, None, 96, 4100, causal=causal, block_table=table,
                                                seqused_k=used, return_lse=True)
        assert calls[1:] == [(len(seqs), 1, 16, head_dim)], (pg, calls)
        calls.clear()
        assert torch.equal(o, split), f"pages of {pg}: {(o.float() - split.float()).abs().max().item()}"
        check_sequences(torch, q, k, v, o, seqs, causal, head_dim ** -0.5, f"d{head_dim} {dtype} in place, pages {pg}")
        # the varlen kernel told single_queries_apart, alone into NaN: the decode rows untouched, the others the step's
        cell = served_paged_cell(torch, q, kp, "causal" if causal else "none", {}, 4100)
        alone = torch.full_like(q, float("nan"))
        cell.varlen(q, kp, vp, cu_q, None, block_table=table, seqused_k=used, causal=causal, max_seqlen_q=96,
                    out=alone, single_queries_apart=True)
        torch.cuda.synchronize()
        decode_rows = torch.tensor([int(cu_q[b]) for b, s in enumerate(seqs) if s[0] == 1], device="cuda")
        prefill = torch.ones(q.shape[0], dtype=torch.bool, device="cuda")
        prefill[decode_rows] = False
        assert torch.isnan(alone[decode_rows]).all() and torch.equal(alone[prefill], o[prefill])
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        o_graph = attngen.attention_varlen(q, kp, vp, cu_q, None, 96, 4100, causal=causal, block_table=table,
                                           seqused_k=used)
    shorter = [max(s[0], min(s[1], s[1] // 3 + 1)) for s in seqs]
    used.copy_(torch.tensor(shorter, dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    k_short = torch.cat([k[int(cu_k[b]):int(cu_k[b]) + n] for b, n in enumerate(shorter)])
    v_short = torch.cat([v[int(cu_k[b]):int(cu_k[b]) + n] for b, n in enumerate(shorter)])
    check_sequences(torch, q, k_short, v_short, o_graph, [(s[0], n) for s, n in zip(seqs, shorter)], causal,
                    head_dim ** -0.5, f"d{head_dim} {dtype} in place, graph replay")


def test_a_step_the_rows_functions_cannot_take_is_split_by_tensor_ops(torch, monkeypatch):
    """Lengths that are not contiguous (a view of every other element), in a mixed step and in a step of decode rows
    only (max_seqlen_q 1, no varlen kernel): the rows call declines before launching anything and the step is split
    by tensor ops as before, every row within the rule of fp32."""
    calls = decode_calls(monkeypatch)
    seqs = ((1, 300), (17, 17), (1, 5), (96, 1100), (1, 2049))
    for label, seqs in (("mixed", seqs), ("decode rows only", tuple((1, sk) for _, sk in seqs))):
        q, k, v, cu_q, cu_k, g = packed(torch, seqs, 16, 4, 128, torch.bfloat16, seed=41)
        kp, vp, table = page_pools(torch, k, v, [s[1] for s in seqs], 16, g)
        every_other = torch.zeros(2 * len(seqs), dtype=torch.int32, device="cuda")
        every_other[::2] = torch.tensor([s[1] for s in seqs], dtype=torch.int32)
        used = every_other[::2]
        assert not used.is_contiguous()
        longest = max(s[0] for s in seqs)
        with torch.no_grad():
            o = attngen.attention_varlen(q, kp, vp, cu_q, None, longest, 2049, causal=True, block_table=table,
                                         seqused_k=used)
        torch.cuda.synchronize()
        attngen.check_errors()
        assert calls == [(len(seqs), 1, 16, 128)], (label, calls)
        calls.clear()
        check_sequences(torch, q, k, v, o, seqs, True, 128 ** -0.5, f"d128 bf16 {label}, strided lengths")


@pytest.mark.parametrize("name", ["h200_decode_d128_bf16", "h200_decode_d128_fused"])
def test_rows_call_writes_only_the_single_query_rows(torch, name):
    """DecodeKernel.rows_call alone (a combine-kernel cell, a fused one), into a NaN-filled output: each single-query
    sequence's row bit for bit the plain decode call on the rows gathered (the same grid and splits), every other
    row still NaN; with many splits and one, and again through the prepared path; offsets past q clamped."""
    kernel = attngen.load(ROOT / "specs" / f"{name}.yaml", synchronize=True)
    dt = torch.bfloat16 if name.endswith("bf16") else torch.float16
    for keys in (9000, 16):    # many splits; a capacity of one tile, one split
        seqs = ((1, 300), (17, 17), (0, 40), (1, 5), (96, 1100), (1, 1), (1, 2049), (3, 64), (1, 9000))
        seqs = tuple((sq, min(sk, keys)) for sq, sk in seqs)
        q, k, v, cu_q, cu_k, g = packed(torch, seqs, 32, 8, 128, dt, seed=7 + keys)
        kp, vp, table = page_pools(torch, k, v, [s[1] for s in seqs], 16, g, extra_cols=0)
        used = torch.tensor([s[1] for s in seqs], dtype=torch.int32, device="cuda")
        single = torch.tensor([s[0] == 1 for s in seqs], device="cuda")
        rows = cu_q[:-1].long()
        for round_ in range(2):    # the second call takes the prepared path
            guarded = torch.full((q.shape[0] + 4,) + tuple(q.shape[1:]), float("nan"), dtype=dt, device="cuda")
            out = guarded[2:-2]    # two NaN rows on each side: nothing may be written outside out
            assert kernel.rows_call(q, kp, vp, used, table, cu_q, out)
            torch.cuda.synchronize()
            attngen.check_errors()
            gathered = q[torch.where(single, rows, 0)].unsqueeze(1)
            plain = kernel(gathered, kp, vp, cache_seqlens=torch.where(single, used, 0), block_table=table,
                           layout="bshd").squeeze(1)
            assert torch.equal(out[rows[single]], plain[single]), (keys, round_)
            rest = torch.ones(q.shape[0], dtype=torch.bool, device="cuda")
            rest[rows[single]] = False
            assert torch.isnan(out[rest]).all() and torch.isnan(guarded[:2]).all() and torch.isnan(guarded[-2:]).all()
    # offsets past q's rows: clamped like the varlen kernel's, nothing written outside out
    cut = cu_q.clone()
    cut[-2:] = q.shape[0] + 5
    guarded = torch.full((q.shape[0] + 4,) + tuple(q.shape[1:]), float("nan"), dtype=dt, device="cuda")
    out = guarded[2:-2]
    assert kernel.rows_call(q, kp, vp, used, table, cut, out)
    torch.cuda.synchronize()
    assert torch.isnan(guarded[:2]).all() and torch.isnan(guarded[-2:]).all()
    assert torch.equal(out[rows[single][:-1]], plain[single][:-1])
    assert torch.isnan(out[rows[single][-1]]).all()    # the last sequence lost its row to the clamp


@pytest.mark.parametrize("head_dim,dtype", CELLS, ids=[f"d{d}-{t}" for d, t in CELLS])
def test_a_prefill_of_equal_chunks_skips_the_split(torch, monkeypatch, head_dim, dtype):
    """A paged step whose q holds batch x max_seqlen_q rows (max_seqlen_q >= 2) has no decode row: no decode launch,
    and bit for bit the served varlen kernel's own call. The same count of rows with a single-query sequence and
    rows past the last offset (q longer than the sequences need) keeps that sequence in the varlen kernel: every
    sequence within the rule of fp32."""
    from attngen.ops import library
    calls = []
    real = library.kvcache
    monkeypatch.setattr(library, "kvcache", lambda *a, **kw: calls.append(a[0].shape) or real(*a, **kw))
    dt = torch_dtype(torch, dtype)
    seqs = ((64, 300), (64, 64), (64, 1100), (64, 2049))
    q, k, v, cu_q, cu_k, g = packed(torch, seqs, 16, 4, head_dim, dt, seed=13)
    kp, vp, table = page_pools(torch, k, v, [s[1] for s in seqs], 16, g)
    used = torch.tensor([s[1] for s in seqs], dtype=torch.int32, device="cuda")
    o = attngen.attention_varlen(q, kp, vp, cu_q, None, 64, 2049, causal=True, block_table=table, seqused_k=used)
    torch.cuda.synchronize()
    attngen.check_errors()
    assert calls == [], calls
    check_sequences(torch, q, k, v, o, seqs, True, head_dim ** -0.5, f"d{head_dim} {dtype} equal chunks")
    cell = served_paged_cell(torch, q, kp, "causal", {}, 2049)
    assert torch.equal(o, cell.varlen(q, kp, vp, cu_q, None, block_table=table, seqused_k=used, causal=True,
                                      max_seqlen_q=64))
    # 4 x 64 rows again, but sequence 1 has one query and the last 63 rows belong to no sequence
    short = ((64, 300), (1, 64), (64, 1100), (64, 2049))
    cu_short = torch.tensor([0, 64, 65, 129, 193], dtype=torch.int32, device="cuda")
    o = attngen.attention_varlen(q, kp, vp, cu_short, None, 64, 2049, causal=True, block_table=table,
                                 seqused_k=used)
    torch.cuda.synchronize()
    assert calls == [], calls
    check_sequences(torch, q[:193], k, v, o[:193], short, True, head_dim ** -0.5, f"d{head_dim} {dtype} rows past")


# (head dim, dtype, modifiers, whether a paged decode kernel runs them at that head dim): gpt-oss's sinks,
# softcap with ALiBi, softcap with sinks (the decode call joins those sinks after its softcap kernel), and d64
# softcap and softcap with ALiBi (the d64 decode cells of 2026-12-04; before them its decode rows stayed in the
# varlen kernel, the `splits` False path, which no shipped variant takes now)
MIXED_SCORES = [(64, "bf16", ("sinks",), True), (128, "fp16", ("softcap", "alibi"), True),
                (128, "bf16", ("softcap", "sinks"), True), (64, "fp16", ("softcap",), True),
                (64, "bf16", ("softcap", "alibi"), True)]
# The cells whose decode call joins the sinks after its kernel of the other modifiers: their steps keep the split by
# tensor ops (the rows functions run a kernel's own modifiers only); every other step above is decoded in place.
JOINS_SINKS = {(128, "bf16", ("softcap", "sinks"))}


@pytest.mark.parametrize("head_dim,dtype,mods,splits", MIXED_SCORES,
                         ids=[f"d{d}-{t}-{'+'.join(m)}" for d, t, m, _ in MIXED_SCORES])
def test_a_mixed_step_with_score_modifiers(torch, monkeypatch, head_dim, dtype, mods, splits):
    """A serving step with score modifiers: the decode rows go to the paged decode call with the same
    modifiers where it runs them at the head dim (once, for every single-query sequence), else stay in the
    varlen kernel; every row within the rule of the fp32 reference with the modifiers, and the prefill rows
    bit for bit the varlen kernel's alone."""
    calls = decode_calls(monkeypatch, "kvcache_variant")
    dt = torch_dtype(torch, dtype)
    seqs = ((1, 300), (17, 17), (0, 40), (1, 5), (96, 1100), (1, 1), (1, 2049), (3, 64))
    q, k, v, cu_q, cu_k, g = packed(torch, seqs, 16, 4, head_dim, dt, seed=21 + head_dim)
    kp, vp, table = page_pools(torch, k, v, [s[1] for s in seqs], 16, g)
    used = torch.tensor([s[1] for s in seqs], dtype=torch.int32, device="cuda")
    kw = {"softcap": 30.0} if "softcap" in mods else {}
    if "alibi" in mods:
        kw["alibi_slopes"] = torch.rand(16, generator=g, device="cuda") * 0.3
    if "sinks" in mods:
        kw["sinks"] = torch.randn(16, generator=g, device="cuda") * 2
    with torch.no_grad():
        o = attngen.attention_varlen(q, kp, vp, cu_q, None, 96, 2049, causal=True, block_table=table, seqused_k=used,
                                     **kw)
    torch.cuda.synchronize()
    attngen.check_errors()
    # once for the decode rows: in place, or (a call that joins sinks after the decode kernel of the others, which
    # calls itself again without them) on the rows gathered by tensor ops
    gathered = (head_dim, dtype, mods) in JOINS_SINKS
    assert (calls[:1] == [(len(seqs), 1, 16, head_dim) if gathered else ("rows", len(seqs), 16, head_dim)]) \
        if splits else not calls, calls
    if splits and not gathered:     # in place: bit for bit the split by tensor ops (the call with LSE takes it)
        with torch.no_grad():
            split, _ = attngen.attention_varlen(q, kp, vp, cu_q, None, 96, 2049, causal=True, block_table=table,
                                                seqused_k=used, return_lse=True, **kw)
        assert torch.equal(o, split)
    check_sequences(torch, q, k, v, o, seqs, True, head_dim ** -0.5, f"d{head_dim} {dtype} mixed",
                    modifiers=modifiers_of(kw))
    # the paged cell's own packed path (packed varlen calls may be served by another cell)
    alone = served_paged_cell(torch, q, kp, "causal", kw, 2049).varlen(q, k, v, cu_q, cu_k, causal=True,
                                                                   alignment="bottom_right", **kw)
    prefill = torch.cat([torch.arange(int(cu_q[b]), int(cu_q[b + 1])) for b, s in enumerate(seqs) if s[0] > 1])
    assert torch.equal(o[prefill.cuda()], alone[prefill.cuda()])
    if not splits:
        assert torch.equal(o, alone)


def test_a_paged_serving_step_compiles_without_a_graph_break(torch):
    """torch.compile(fullgraph=True) of a mixed serving step with learned sinks (the op
    attngen::attention_varlen_paged): the eager call's output and LSE bit for bit."""
    torch._dynamo.reset()
    dt = torch.bfloat16
    seqs = ((1, 300), (17, 17), (1, 5), (96, 1100), (1, 2049))
    q, k, v, cu_q, cu_k, g = packed(torch, seqs, 16, 2, 64, dt, seed=5)
    kp, vp, table = page_pools(torch, k, v, [s[1] for s in seqs], 16, g)
    used = torch.tensor([s[1] for s in seqs], dtype=torch.int32, device="cuda")
    sinks = torch.randn(16, generator=g, device="cuda")

    def step(q, kp, vp):
        return attngen.attention_varlen(q, kp, vp, cu_q, None, 96, 2049, causal=True, block_table=table,
                                        seqused_k=used, sinks=sinks, return_lse=True)
    with torch.no_grad():
        o, lse = step(q, kp, vp)
        oc, lsec = torch.compile(step, fullgraph=True)(q, kp, vp)
        assert torch.equal(o, oc) and torch.equal(lse, lsec)
    torch._dynamo.reset()


def test_paged_varlen_refuses_bad_inputs(torch):
    kernel = load_once(64, "fp16")
    q, k, v, cu_q, cu_k, g = packed(torch, ((3, 40), (1, 9)), 4, 2, 64, torch.float16, seed=1)
    kp, vp, table = page_pools(torch, k, v, [40, 9], 16, g)
    used = torch.tensor([40, 9], dtype=torch.int32, device="cuda")

    def call(**kw):
        args = dict(k=kp, v=vp, block_table=table, seqused_k=used)
        args.update(kw)
        return kernel.varlen(q, args.pop("k"), args.pop("v"), cu_q, args.pop("cu_seqlens_k", None), **args)

    odd = torch.zeros((4, 24, 2, 64), dtype=torch.float16, device="cuda")
    with pytest.raises(ValueError, match="power of two from 1 to 512"):
        call(k=odd, v=odd)
    big = torch.zeros((1, 1024, 2, 64), dtype=torch.float16, device="cuda")
    with pytest.raises(ValueError, match="power of two from 1 to 512"):
        call(k=big, v=big)
    empty = torch.zeros((0, 16, 2, 64), dtype=torch.float16, device="cuda")
    with pytest.raises(ValueError, match="num_pages >= 1"):
        call(k=empty, v=empty)
    with pytest.raises(TypeError, match="block_table must be int32"):
        call(block_table=table.long())
    with pytest.raises(ValueError, match="block_table is on cpu"):
        call(block_table=table.cpu())
    with pytest.raises(ValueError, match=r"block_table must be \(2, max_pages\)"):
        call(block_table=table[:1])
    with pytest.raises(TypeError, match="seqused_k must be int32"):
        call(seqused_k=used.long())
    with pytest.raises(ValueError, match=r"seqused_k must be a contiguous \(2,\)"):
        call(seqused_k=used[:1])
    with pytest.raises(ValueError, match="seqused_k .* or cu_seqlens_k"):
        call(seqused_k=None)
    with pytest.raises(ValueError, match="k and v must be page pools of one shape"):
        call(v=vp[:, :8])
    with pytest.raises(ValueError, match="holds page id"):
        call(block_table=torch.where(table >= 0, table + 100, table), validate=True)
    with pytest.raises(ValueError, match="sequence 0 has 49 keys"):
        call(seqused_k=torch.tensor([49, 9], dtype=torch.int32, device="cuda"), validate=True, block_table=table[:, :3])
    # without validation a bad page id is clamped to the pool and recorded
    call(block_table=torch.where(table >= 0, table + 100, table))
    torch.cuda.synchronize()
    with pytest.raises(InputError, match="block_table entry"):
        attngen.check_errors()
    unpaged = attngen.load(ROOT / "specs" / "h100_mma_d64_m128n64w4s2x3q.yaml", synchronize=True)
    with pytest.raises(ValueError, match="paged: true"):
        unpaged.varlen(q, kp, vp, cu_q, None, block_table=table, seqused_k=used)
    with pytest.raises(ValueError, match="seqused_k is read with block_table"):
        kernel.varlen(q, k, v, cu_q, cu_k, seqused_k=used)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, kp, vp))
    with pytest.raises(NotImplementedError, match="block_table"):
        attngen.attention_varlen(qg, kg, vg, cu_q, None, block_table=table, seqused_k=used, causal=True)
    with pytest.raises(ValueError, match="softcap= needs a spec whose `scores` list has 'softcap'"):
        kernel.varlen(q, kp, vp, cu_q, None, block_table=table, seqused_k=used, softcap=30.0)
    sinks = torch.randn(4, device="cuda").requires_grad_()
    with pytest.raises(NotImplementedError, match="block_table"):
        attngen.attention_varlen(q, kp, vp, cu_q, None, block_table=table, seqused_k=used, causal=True, sinks=sinks)


# The Hopper kind's paged varlen members (TMA copies of a page's rows at a time; the rows of a sequence's last tile
# past its keys zeroed in shared memory): page sizes from 1 (one copy per key) to 512 (a tile inside one page),
# every mask they have; d128 (a producer warpgroup) in fp16 and bf16, d64 (homogeneous: a consumer warp copies),
# d256 on 80-key tiles (copies of 16 rows at most; bf16) and on 64-key tiles (copies of up to 64 rows; fp16).
HOPPER_PAGED = {(128, "fp16"): "h100_wgmma_d128_varlen_paged", (128, "bf16"): "h100_wgmma_d128_varlen_paged_bf16",
                (64, "bf16"): "h100_wgmma_d64_varlen_paged_bf16", (256, "bf16"): "h100_wgmma_d256_varlen_paged_bf16",
                (256, "fp16"): "h100_wgmma_d256_varlen_paged_n64"}
HOPPER_MASKS = [(True, None), (False, None), (True, (100, 0)), (False, (48, 17))]


@functools.lru_cache(maxsize=None)
def load_hopper(head_dim: int, dtype: str):
    return attngen.load(ROOT / "specs" / f"{HOPPER_PAGED[head_dim, dtype]}.yaml", synchronize=True)


@pytest.mark.parametrize("causal,window", HOPPER_MASKS, ids=["causal", "full", "causal-100", "two-sided"])
@pytest.mark.parametrize("pg", (1, 2, 4, 8, 16, 32, 64, 128, 256, 512))
@pytest.mark.parametrize("head_dim,dtype", list(HOPPER_PAGED), ids=[f"d{d}-{t}" for d, t in HOPPER_PAGED])
def test_hopper_paged_varlen_against_reference(torch, head_dim, dtype, pg, causal, window):
    """A Hopper member on shuffled pages with NaN spare pages and page tails, into a NaN-filled output: each sequence
    within the error rule of the fp32 reference; bit for bit its own packed varlen call on the same keys (rows past
    a sequence's keys zeroed, where the packed call reads the next sequence's); the same again with the keys from
    cu_seqlens_k, on the full path and the prepared one."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the Hopper kind (wgmma, TMA) needs sm_90")
    kernel = load_hopper(head_dim, dtype)
    assert kernel.plan.paged
    dt = torch_dtype(torch, dtype)
    q, k, v, cu_q, cu_k, g = packed(torch, MIXED, 8, 2, head_dim, dt, seed=7 * pg + head_dim + (window or (0,))[0])
    lens_k = [s[1] for s in MIXED]
    kp, vp, table = page_pools(torch, k, v, lens_k, pg, g)
    used = torch.tensor(lens_k, dtype=torch.int32, device="cuda")
    out = torch.full_like(q, float("nan"))
    kw = {"window": window} if window is not None else {}
    kernel.varlen(q, kp, vp, cu_q, None, block_table=table, seqused_k=used, causal=causal, out=out,
                  max_seqlen_q=max(s[0] for s in MIXED), **kw)
    torch.cuda.synchronize()
    attngen.check_errors()
    check_sequences(torch, q, k, v, out, MIXED, causal, head_dim ** -0.5, f"hopper d{head_dim} {dtype} page {pg}",
                    window=window)
    contiguous = kernel.varlen(q, k, v, cu_q, cu_k, causal=causal,
                               alignment="bottom_right" if causal or window else None, **kw)
    assert torch.equal(out, contiguous)
    for _ in range(2):      # the full path, then the prepared one
        again = kernel.varlen(q, kp, vp, cu_q, cu_k, block_table=table, causal=causal, **kw)
        assert torch.equal(again, out)


def test_hopper_paged_varlen_records_bad_pages(torch):
    """A table entry outside the pools is clamped and recorded (check_errors raises), as the mma.sync cells do."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the Hopper kind (wgmma, TMA) needs sm_90")
    kernel = load_hopper(128, "fp16")
    q, k, v, cu_q, cu_k, g = packed(torch, MIXED, 8, 2, 128, torch.float16, seed=11)
    lens_k = [s[1] for s in MIXED]
    kp, vp, table = page_pools(torch, k, v, lens_k, 16, g)
    table[0, 0] = kp.shape[0] + 5
    used = torch.tensor(lens_k, dtype=torch.int32, device="cuda")
    kernel.varlen(q, kp, vp, cu_q, None, block_table=table, seqused_k=used, causal=True)
    torch.cuda.synchronize()
    with pytest.raises(InputError, match="block_table"):
        attngen.check_errors()
