"""GPU tests of the decode call: every decode spec passes every decode case of the verifier
(per-sequence lengths, GQA packing, splits), and bad tables or lengths are refused on the host."""
from __future__ import annotations

import functools
from pathlib import Path

import pytest

import attngen
from attngen.eval import verify
from attngen.eval.decode_verify import decode_cases

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
DECODE_SPECS = sorted((ROOT / "specs").glob("*decode*.yaml"))
D128 = ROOT / "specs" / "h200_decode_d128.yaml"


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
    assert len(results) == len(decode_cases(kernel.plan.block_n, kernel.plan.page_size))
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
    kernel = load_once(D128)   # page_size 16
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
    with pytest.raises(ValueError, match="pages of 16 keys"):
        kernel(q, kp[:, :, :8], vp[:, :, :8], cache_seqlens=lens, block_table=table)


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
