"""GPU tests of the merge of partial attention results: every merge spec passes every verify case (an
fp32 reference, NaN-poisoned outputs, -inf rows, both layouts, strided parts, fp16/bf16/fp32 partials,
2 to 20 parts); attngen.merge_attention(_list) through the dispatch table; and attngen's forward over
split keys, merged, equals attention over all keys under the error rule."""
from __future__ import annotations

import functools
from pathlib import Path

import pytest

import attngen
from attngen.eval import verify
from attngen.eval.verify.cases import attention_torch, error_bound, exact_fp32_matmul
from attngen.eval.verify.merge import merge_cases
from spec_sample import SPEC_PATHS

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
MERGE_SPECS = [p for p in SPEC_PATHS if "_merge_d" in p.name]   # the cells of specs/h200_merge.yaml and l4_merge.yaml


@functools.lru_cache(maxsize=None)
def load_once(path: Path):
    return attngen.load(path, synchronize=True)


@pytest.fixture
def torch():
    import torch
    return torch


@pytest.mark.parametrize("spec", MERGE_SPECS, ids=[p.stem for p in MERGE_SPECS])
def test_merge_spec_passes_every_case(spec):
    # l4's specs run on any GPU from sm_89 on (no arch-specific instructions), so an H200 checks them too
    kernel = load_once(spec)
    results = verify.verify_kernel(kernel, verify.FULL_SUITE, spec_label=kernel.name)
    assert len(results) == len(merge_cases())
    bad = [(r.shape.label, r.problems) for r in results if not r.passed]
    assert not bad, bad


def parts_over_split_keys(torch, dtype, layout, n_parts, d=128, causal=False, seed=0):
    """q, k, v and the (out, lse) of attngen's forward over each of n_parts contiguous key slices."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    b, h, s, sk = 2, 8, 300, 1000
    shape = (lambda n: (b, h, n, d)) if layout == "bhsd" else (lambda n: (b, n, h, d))
    q = torch.randn(shape(s), generator=g, device="cuda").to(dtype)
    k = torch.randn(shape(sk), generator=g, device="cuda").to(dtype)
    v = torch.randn(shape(sk), generator=g, device="cuda").to(dtype)
    cuts = [round(i * sk / n_parts) for i in range(n_parts + 1)]
    seq = 2 if layout == "bhsd" else 1
    outs, lses = [], []
    for lo, hi in zip(cuts, cuts[1:]):
        o, lse = attngen.attention(q, k.narrow(seq, lo, hi - lo), v.narrow(seq, lo, hi - lo), layout=layout,
                                   return_lse=True)
        outs.append(o)
        lses.append(lse)
    return q, k, v, outs, lses


def bhsd(t, layout):
    return t if layout == "bhsd" else t.transpose(1, 2)


@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("n_parts", [2, 4])
def test_merged_forward_halves_equal_attention_over_all_keys(torch, dtype_name, layout, n_parts):
    dtype = getattr(torch, dtype_name)
    q, k, v, outs, lses = parts_over_split_keys(torch, dtype, layout, n_parts)
    if n_parts == 2:
        out, lse = attngen.merge_attention(outs[0], lses[0], outs[1], lses[1], layout=layout)
    else:
        out, lse = attngen.merge_attention_list(outs, lses, layout=layout)
    assert out.dtype == dtype and out.shape == q.shape and lse.shape == lses[0].shape
    scale = q.shape[-1] ** -0.5
    qb, kb, vb = (bhsd(t, layout) for t in (q, k, v))
    with exact_fp32_matmul(torch):
        ref, ref_lse = attention_torch(qb.float(), kb.float(), vb.float(), scale=scale)
    low, _ = attention_torch(qb, kb, vb, scale=scale)
    err = (bhsd(out, layout).float() - ref).abs().max().item()
    # two roundings (each part's output, then the merge's) against torch's one: the rule's factor covers it
    assert err <= error_bound((low.float() - ref).abs().max().item()), err
    assert (lse - ref_lse).abs().max().item() <= 1e-3 + 1e-3 * ref_lse.abs().max().item()


def test_fp32_partials_merge_into_fp32_and_half(torch):
    q, k, v, outs, lses = parts_over_split_keys(torch, torch.float16, "bhsd", 3)
    wide = [o.float() for o in outs]
    ring, ring_lse = attngen.merge_attention_list(wide[:2], lses[:2])          # a ring's running partial
    assert ring.dtype == torch.float32
    out, lse = attngen.merge_attention(ring, ring_lse, wide[2], lses[2], out_dtype=torch.float16)
    direct, direct_lse = attngen.merge_attention_list(outs, lses)
    assert out.dtype == torch.float16
    assert (out.float() - direct.float()).abs().max().item() <= 2e-3
    assert torch.allclose(lse, direct_lse, atol=1e-5, rtol=1e-5)


def test_minus_inf_parts_weigh_nothing_and_empty_rows_are_zero(torch):
    g = torch.Generator(device="cuda").manual_seed(1)
    a = torch.randn((1, 2, 6, 64), generator=g, device="cuda").half()
    b = torch.full_like(a, float("nan"))                       # a part that saw no key: never read
    lse_a = torch.randn((1, 2, 6), generator=g, device="cuda")
    lse_b = torch.full_like(lse_a, float("-inf"))
    lse_a[0, 1, 3:] = float("-inf")                            # rows where no part saw a key
    a[0, 1, 3:] = float("nan")
    out, lse = attngen.merge_attention(a, lse_a, b, lse_b)
    assert torch.isfinite(out).all()
    assert torch.equal(out[0, 0], a[0, 0]) and torch.equal(out[0, 1, :3], a[0, 1, :3])
    assert (out[0, 1, 3:] == 0).all()
    assert torch.isneginf(lse[0, 1, 3:]).all() and torch.equal(lse[0, 0], lse_a[0, 0])


def test_a_nan_lse_makes_its_row_nan(torch):
    """A NaN LSE (a part's row that went wrong) is not a part with no key: the row's output and LSE are
    NaN, as torch's logsumexp gives, beside -inf parts and beside finite ones; other rows are untouched."""
    g = torch.Generator(device="cuda").manual_seed(2)
    a, b = (torch.randn((1, 2, 6, 64), generator=g, device="cuda").half() for _ in range(2))
    lse_a, lse_b = (torch.randn((1, 2, 6), generator=g, device="cuda") for _ in range(2))
    clean_out, clean_lse = attngen.merge_attention(a, lse_a, b, lse_b)
    lse_a[0, 0, 1] = float("nan")                   # beside a finite part
    lse_a[0, 1, 2] = float("nan")
    lse_b[0, 1, 2] = float("-inf")                  # beside a part with no key
    out, lse = attngen.merge_attention(a, lse_a, b, lse_b)
    for h, t in ((0, 1), (1, 2)):
        assert torch.isnan(out[0, h, t]).all() and torch.isnan(lse[0, h, t])
    keep = torch.ones((1, 2, 6), dtype=torch.bool, device="cuda")
    keep[0, 0, 1] = keep[0, 1, 2] = False
    assert torch.equal(out[keep], clean_out[keep]) and torch.equal(lse[keep], clean_lse[keep])


def test_output_may_be_one_of_the_parts(torch):
    """out= and lse_out= naming the first part (a ring's running partial) give the bits a fresh output
    gets: every read of a row comes before its write."""
    arch = "h200" if torch.cuda.get_device_capability() >= (9, 0) else "l4"
    kernel = load_once(next(p for p in MERGE_SPECS if p.stem == f"{arch}_merge_d64"))
    g = torch.Generator(device="cuda").manual_seed(3)
    parts = [torch.randn((2, 3, 70, 64), generator=g, device="cuda").half() for _ in range(3)]
    lses = [torch.randn((2, 3, 70), generator=g, device="cuda") for _ in range(3)]
    fresh, fresh_lse = kernel([p.clone() for p in parts], [x.clone() for x in lses])
    out, lse = kernel(parts, lses, out=parts[0], lse_out=lses[0])
    assert out.data_ptr() == parts[0].data_ptr() and lse.data_ptr() == lses[0].data_ptr()
    assert torch.equal(out, fresh) and torch.equal(lse, fresh_lse)


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_repeated_merges_take_the_prepared_path(torch, layout, monkeypatch):
    """Merges of parts laid out as before (new tensors and values each call, strided parts among them) check
    nothing again and give what a call on the full path gives on the same tensors, bit for bit."""
    from attngen.runtime.calls.merge import MergeKernel
    arch = "h200" if torch.cuda.get_device_capability() >= (9, 0) else "l4"
    kernel = attngen.load(next(p for p in MERGE_SPECS if p.stem == f"{arch}_merge_d128"))
    full = []
    checks = MergeKernel._check_parts
    monkeypatch.setattr(MergeKernel, "_check_parts", lambda self, *a: full.append(1) or checks(self, *a))
    calls = []
    for seed in range(3):
        g = torch.Generator(device="cuda").manual_seed(seed)
        shape = (2, 3, 70, 128) if layout == "bhsd" else (2, 70, 3, 128)
        wide = torch.randn(shape[:3] + (256,), generator=g, device="cuda").half()
        parts = [torch.randn(shape, generator=g, device="cuda").half(), wide[..., 128:]]   # the second strided
        lses = [torch.randn((2, 3, 70), generator=g, device="cuda") for _ in range(2)]
        calls.append((parts, lses, kernel(parts, lses, layout=layout)))
    assert len(full) == 1, "a repeated merge took the full path"
    for parts, lses, (out, lse) in calls:
        kernel._prepared.clear()
        want, want_lse = kernel(parts, lses, layout=layout)
        assert torch.equal(out, want) and torch.equal(lse, want_lse)
    assert not torch.equal(calls[0][2][0], calls[1][2][0])


def test_many_parts_merge_in_rounds(torch):
    q, k, v, outs, lses = parts_over_split_keys(torch, torch.bfloat16, "bshd", 11, d=64)
    out, lse = attngen.merge_attention_list(outs, lses, layout="bshd")
    scale = q.shape[-1] ** -0.5
    with exact_fp32_matmul(torch):
        ref, ref_lse = attention_torch(*(bhsd(t, "bshd").float() for t in (q, k, v)), scale=scale)
    low, _ = attention_torch(*(bhsd(t, "bshd") for t in (q, k, v)), scale=scale)
    assert (bhsd(out, "bshd").float() - ref).abs().max().item() <= error_bound((low.float() - ref).abs().max().item())


def test_merge_refuses_bad_arguments_in_one_line(torch):
    a = torch.randn((1, 2, 6, 128), device="cuda").half()
    lse = torch.randn((1, 2, 6), device="cuda")
    with pytest.raises(ValueError, match="outs\\[1\\] has shape"):
        attngen.merge_attention(a, lse, a[:, :, :5], lse)
    with pytest.raises(TypeError, match="outs\\[1\\] is torch.bfloat16 but outs\\[0\\] is torch.float16"):
        attngen.merge_attention(a, lse, a.bfloat16(), lse)
    with pytest.raises(TypeError, match="lses\\[1\\] must be float32"):
        attngen.merge_attention(a, lse, a, lse.half())
    with pytest.raises(ValueError, match="must be on one GPU|needs CUDA"):
        attngen.merge_attention(a, lse, a, lse.cpu())
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        attngen.merge_attention(a.cpu(), lse, a, lse)
    with pytest.raises(LookupError, match="no merge kernel for .* head_dim 72"):
        attngen.merge_attention(a[..., :72], lse, a[..., :72], lse)
    with pytest.raises(TypeError, match="writes torch.float16 or torch.float32"):
        attngen.merge_attention(a, lse, a, lse, out_dtype=torch.bfloat16)


def test_merge_traces_under_torch_compile(torch):
    a = torch.randn((1, 4, 16, 64), device="cuda").half()
    b = torch.randn_like(a)
    la, lb = torch.randn((1, 4, 16), device="cuda"), torch.randn((1, 4, 16), device="cuda")

    @torch.compile(fullgraph=True)
    def step(a, la, b, lb):
        out, lse = attngen.merge_attention(a, la, b, lb)
        return out * 2, lse

    out, lse = step(a, la, b, lb)
    eager, eager_lse = attngen.merge_attention(a, la, b, lb)
    assert torch.equal(out, eager * 2) and torch.equal(lse, eager_lse)
