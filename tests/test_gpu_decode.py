"""GPU tests of the decode call: every decode spec passes every decode case of the verifier
(per-sequence lengths, GQA packing, splits), and bad tables or lengths are refused on the host."""
from __future__ import annotations

import functools
from pathlib import Path

import pytest

import attngen
from attngen.eval import verify
from attngen.eval.verify.decode import append_cases, decode_cases, latent_cases, window_cases
from spec_sample import SPEC_PATHS
from test_gpu_runtime import assert_close_to_reference

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
DECODE_SPECS = [p for p in SPEC_PATHS if "decode" in p.name]
D128 = ROOT / "specs" / "h200_decode_d128.yaml"
WINDOW = ROOT / "specs" / "h200_decode_d128_window.yaml"
EXPR_WINDOW = ROOT / "specs" / "lab" / "h200_decode_d128_expr_window.yaml"


@functools.lru_cache(maxsize=None)
def load_once(path: Path):
    return attngen.load(path, synchronize=True)


@pytest.fixture
def torch():
    import torch
    return torch


@pytest.mark.parametrize("spec", DECODE_SPECS, ids=[p.stem for p in DECODE_SPECS])
def test_decode_spec_passes_every_case(spec):
    kernel = load_once(spec)
    results = verify.verify_kernel(kernel, verify.FULL_SUITE, spec_label=kernel.name)
    plan = kernel.plan
    windows = window_cases(plan.block_n, plan.paged) if "window" in plan.masks else ()
    cases = decode_cases(plan.block_n, plan.paged)
    if "expr" in plan.masks:   # each case once through the expression (causal cases fold into plain ones)
        cases = {(c.batch, c.heads, c.kv_heads, c.seqlen_q, c.capacity, c.lengths, c.layout, c.num_splits,
                  c.page_size) for c in cases}
    else:                       # a spec of the window mask alone (a window + softcap member) runs its windows
        cases = [c for c in cases if c.mask in plan.masks]
    appends = append_cases(plan.block_n, plan.paged, "window" in plan.masks) if plan.append else ()
    latent = latent_cases(plan.block_n, plan.paged) if plan.v_in_k else ()
    assert len(results) == len(cases) + len(windows) + len(appends) + len(latent)
    assert all(r.passed for r in results), "\n".join(
        f"{r.variant} {r.shape.label}: {'; '.join(r.problems)}" for r in results if not r.passed)


def test_splits_agree(torch):
    """One split, the heuristic's and the most: the same answer within rounding."""
    kernel = load_once(D128)
    q = torch.randn(2, 32, 1, 128, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(2, 8, 5000, 128, device="cuda", dtype=torch.float16) for _ in range(2))
    lens = torch.tensor([4999, 17], dtype=torch.int32, device="cuda")
    outs = [kernel(q, k, v, cache_seqlens=lens, num_splits=n) for n in (1, None, 40)]
    for o in outs[1:]:
        assert (o.float() - outs[0].float()).abs().max().item() < 2e-3


def test_split_and_combine_launched_as_programmatic_dependents(torch):
    """On sm_90 and up the split kernel is launched while the kernel ahead of it still runs, and the combine
    while the split kernel does (programmatic dependent launch); each waits for the writes of the kernel ahead
    itself. Calls queued back to back with no sync between them, each behind torch kernels that write its
    queries and a row of the cache it reads, give bit for bit what the same sequence gives with both launched
    the usual way, and the first is within the error rule of the fp32 reference."""
    kernel = attngen.load(D128)     # no synchronize after each call: the calls overlap as a model's do
    gen = torch.Generator(device="cuda").manual_seed(11)
    qs = [torch.randn(1, 32, 1, 128, generator=gen, device="cuda").half() for _ in range(8)]
    k, v = (torch.randn(1, 8, 16384, 128, generator=gen, device="cuda").half() for _ in range(2))
    new_rows = torch.randn(8, 8, 128, generator=gen, device="cuda").half()
    k0 = k.clone()
    kernel(qs[0], k, v)
    assert kernel.last_splits > 1
    (key, prepared), = kernel._prepared.items()
    hopper = torch.cuda.get_device_capability() >= (9, 0)
    assert [fn.programmatic for fn, _, _ in prepared.launches] == [hopper, hopper]

    def calls():
        k.copy_(k0)
        outs = []
        for i, q in enumerate(qs):
            k[0, :, 1000 + i].copy_(new_rows[i])       # written by the kernel just ahead of the call
            outs.append(kernel(q * 1.0, k, v))          # and so are its queries
        return outs
    early = calls()
    torch.cuda.synchronize()
    kernel._prepared[key] = prepared._replace(launches=tuple(
        (fn._replace(programmatic=False), handle, grid) for fn, handle, grid in prepared.launches))
    after = calls()
    torch.cuda.synchronize()
    for i, (a, b) in enumerate(zip(early, after)):
        assert torch.equal(a, b), f"call {i}: the programmatic launch differs by {(a - b).abs().max().item()}"
    k.copy_(k0)
    k[0, :, 1000].copy_(new_rows[0])
    assert_close_to_reference(torch, early[0], qs[0], k, v)


@pytest.mark.parametrize("lens, error, fragment", [
    ([5, 5000], ValueError, "outside [0, 4096]"),
    ([-1, 5], ValueError, "outside [0, 4096]"),
    ("int64", TypeError, "must be int32"),
    ("short", ValueError, "one length per sequence"),
])
def test_bad_lengths_are_refused(torch, lens, error, fragment):
    kernel = load_once(D128)
    q = torch.randn(2, 32, 1, 128, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(2, 8, 4096, 128, device="cuda", dtype=torch.float16) for _ in range(2))
    if lens == "int64":
        t = torch.tensor([5, 6], dtype=torch.int64, device="cuda")
    elif lens == "short":
        t = torch.tensor([5], dtype=torch.int32, device="cuda")
    else:
        t = torch.tensor(lens, dtype=torch.int32, device="cuda")
    with pytest.raises(error, match=fragment.replace("[", r"\[")):
        kernel(q, k, v, cache_seqlens=t, validate=True)   # the range check reads the lengths back


def test_bad_tables_are_refused(torch):
    kernel = load_once(D128)   # paged: pools of 16-key pages here
    q = torch.randn(2, 32, 1, 128, device="cuda", dtype=torch.float16)
    kp, vp = (torch.randn(10, 8, 16, 128, device="cuda", dtype=torch.float16) for _ in range(2))
    lens = torch.tensor([20, 33], dtype=torch.int32, device="cuda")
    table = torch.tensor([[3, 4, -1], [0, 1, 2]], dtype=torch.int32, device="cuda")
    kernel(q, kp, vp, cache_seqlens=lens, block_table=table)        # -1 past a sequence's pages is fine
    with pytest.raises(ValueError, match="page id 10"):
        kernel(q, kp, vp, cache_seqlens=lens, block_table=torch.tensor([[3, 4, 0], [0, 1, 10]], dtype=torch.int32,
                                                                        device="cuda"), validate=True)
    with pytest.raises(ValueError, match="page id -1"):
        kernel(q, kp, vp, cache_seqlens=torch.tensor([40, 33], dtype=torch.int32, device="cuda"), block_table=table,
               validate=True)
    with pytest.raises(ValueError, match=r"outside \[0, 48\]"):
        kernel(q, kp, vp, cache_seqlens=torch.tensor([49, 3], dtype=torch.int32, device="cuda"), block_table=table,
               validate=True)
    with pytest.raises(TypeError, match="block_table must be int32"):
        kernel(q, kp, vp, cache_seqlens=lens, block_table=table.long())
    with pytest.raises(ValueError, match="needs cache_seqlens"):
        kernel(q, kp, vp, block_table=table)
    short = torch.tensor([16, 24], dtype=torch.int32, device="cuda")
    kernel(q, kp[:, :, :8], vp[:, :, :8], cache_seqlens=short, block_table=table)   # pages of 8 keys: fine too
    attngen.check_errors()
    with pytest.raises(ValueError, match="page_size must be a power of two from 1 to 512"):
        kernel(q, kp[:, :, :12], vp[:, :, :12], cache_seqlens=lens, block_table=table)


def test_paged_matches_contiguous(torch):
    """The same keys through a shuffled page table and contiguously: the same output."""
    kernel = load_once(D128)
    q = torch.randn(2, 32, 4, 128, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(2, 8, 800, 128, device="cuda", dtype=torch.float16) for _ in range(2))
    lens = torch.tensor([799, 301], dtype=torch.int32, device="cuda")
    order = torch.randperm(100, device="cuda").int().view(2, 50)
    kp = torch.empty(100, 8, 16, 128, device="cuda", dtype=torch.float16)
    vp = torch.empty_like(kp)
    kp[order.flatten().long()] = k.view(2, 8, 50, 16, 128).permute(0, 2, 1, 3, 4).reshape(100, 8, 16, 128)
    vp[order.flatten().long()] = v.view(2, 8, 50, 16, 128).permute(0, 2, 1, 3, 4).reshape(100, 8, 16, 128)
    a = kernel(q, k, v, cache_seqlens=lens, causal=True)
    b = kernel(q, kp, vp, cache_seqlens=lens, block_table=order, causal=True)
    assert torch.equal(a, b)


def test_bad_num_splits_and_shapes_are_refused(torch):
    kernel = load_once(D128)
    q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(1, 8, 512, 128, device="cuda", dtype=torch.float16) for _ in range(2))
    with pytest.raises(ValueError, match="num_splits must be an integer from 1 to 128"):
        kernel(q, k, v, num_splits=0)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        kernel(q[:, :30], k, v)
    with pytest.raises(ValueError, match="k_cache and v_cache"):
        kernel(q, k, v[:, :, :256])


@pytest.mark.parametrize("expression", [False, True], ids=["builtin", "expression"])
@pytest.mark.parametrize("paged", [0, 1, 16, 256], ids=["contiguous", "paged1", "paged16", "paged256"])
def test_window_reads_only_its_tiles(torch, paged, expression):
    """A window over a long cache (the built-in, and the same window as a mask expression, whose
    block classification bounds the tiles): K and V are NaN in every tile before the one holding
    the first visible key (were one read, 0 x NaN would reach O), and with a page table the pages
    there are -1 (were one read, the kernel would report a bad page id); the output matches the
    cache without the poison, and the kernel reports nothing."""
    kernel = load_once(EXPR_WINDOW if expression else WINDOW)
    n, left = kernel.plan.block_n, 300
    window = {"params": {"left": left}} if expression else {"causal": True, "window": (left, 0)}
    q = torch.randn(2, 32, 4, 128, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(2, 8, 4096, 128, device="cuda", dtype=torch.float16) for _ in range(2))
    lens = torch.tensor([4096, 3001], dtype=torch.int32, device="cuda")
    clean = kernel(q, k, v, cache_seqlens=lens, num_splits=3, **window)
    first_tile = [(int(length) - 4 - left) // n for length in lens]
    for b, tile in enumerate(first_tile):
        k[b, :, :tile * n] = float("nan")
        v[b, :, :tile * n] = float("nan")
    if paged:
        page = paged
        pages = 4096 // page
        kp = k.view(2, 8, pages, page, 128).permute(0, 2, 1, 3, 4).reshape(2 * pages, 8, page, 128)
        vp = v.view(2, 8, pages, page, 128).permute(0, 2, 1, 3, 4).reshape(2 * pages, 8, page, 128)
        table = torch.arange(2 * pages, dtype=torch.int32, device="cuda").view(2, pages)
        for b, tile in enumerate(first_tile):
            table[b, :tile * n // page] = -1
        out = kernel(q, kp.contiguous(), vp.contiguous(), cache_seqlens=lens, block_table=table,
                     num_splits=3, **window)
    else:
        out = kernel(q, k, v, cache_seqlens=lens, num_splits=3, **window)
    attngen.check_errors()
    assert torch.isfinite(out).all()
    assert torch.equal(out, clean)


def test_window_splits_cover_the_window(torch):
    """Splits share the window's tiles, not the cache's: one split, the heuristic's and the most give
    the same answer, and the heuristic splits the window's few tiles, not the cache's many."""
    kernel = load_once(WINDOW)
    q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(1, 8, 32768, 128, device="cuda", dtype=torch.float16) for _ in range(2))
    lens = torch.tensor([32768], dtype=torch.int32, device="cuda")
    outs = [kernel(q, k, v, cache_seqlens=lens, window=(1000, 0), num_splits=n) for n in (1, None, 128)]
    assert kernel.last_splits <= 10   # 1001 keys: at most 9 tiles of 128
    for o in outs[1:]:
        assert (o.float() - outs[0].float()).abs().max().item() < 2e-3


@pytest.mark.parametrize("spec, option", [(WINDOW, {"window": (4, 4)}),
                                          (ROOT / "specs" / "h200_decode_d128_softcap.yaml", {"softcap": 0.0}),
                                          (ROOT / "specs" / "h200_decode_d128_alibi.yaml", {"alibi_slopes": "int"})])
def test_bad_variant_arguments_are_refused(torch, spec, option):
    kernel = load_once(spec)
    q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(1, 8, 512, 128, device="cuda", dtype=torch.float16) for _ in range(2))
    if "window" in option:
        with pytest.raises(ValueError, match="window sides must be integers >= -1"):
            kernel(q, k, v, window=(-2, 0))
        with pytest.raises(ValueError, match="softcap= needs a spec"):
            kernel(q, k, v, softcap=5.0)
    elif "softcap" in option:
        with pytest.raises(ValueError, match="positive finite"):
            kernel(q, k, v, softcap=0.0)
        with pytest.raises(ValueError, match="pass softcap="):
            kernel(q, k, v)
        with pytest.raises(ValueError, match="alibi_slopes= needs a spec"):
            kernel(q, k, v, softcap=5.0, alibi_slopes=torch.ones(32, device="cuda"))
    else:
        with pytest.raises(TypeError, match="must be float32"):
            kernel(q, k, v, alibi_slopes=torch.ones(32, dtype=torch.int32, device="cuda"))
        with pytest.raises(ValueError, match="must have shape"):
            kernel(q, k, v, alibi_slopes=torch.ones(8, device="cuda"))
