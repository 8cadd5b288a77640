"""GPU tests of the e4m3 forward: every e4m3 spec passes the verifier's cases, a planted bug in the
key order of P is caught, the call refuses malformed V^T and descales on the host, and the descales
act as FlashAttention-3's: scaling v's values up and its descale down changes nothing."""
from __future__ import annotations

import functools
from pathlib import Path

import pytest

import attngen
from attngen.eval import verify
from attngen.eval.verify.forward_fp8 import check_fp8_case, verify_cases
from attngen.runtime.calls.forward_fp8 import quantize_fp8
from spec_sample import SPEC_PATHS, spec_text

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
FP8_SPECS = [p for p in SPEC_PATHS if "\ndtype: e4m3" in spec_text(p)]
D128 = ROOT / "specs" / "l4_mma_d128_fp8.yaml"
WGMMA_D128 = ROOT / "specs" / "h100_wgmma_d128_fp8.yaml"     # sm_90a; k_rows: even_odd
WGMMA_D128_IN_ORDER = ROOT / "specs" / "h100_wgmma_d128_fp8_n192c2ps3r24x240opbq2.yaml"


def needs_sm90a(spec: Path) -> None:
    import torch
    if "target: h100" in spec.read_text() and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip(f"{spec.stem} targets sm_90a (H100/H200)")


@functools.lru_cache(maxsize=None)
def load_once(path: Path):
    return attngen.load(path, synchronize=True)


def test_fp8_specs_exist():
    assert D128 in FP8_SPECS and len(FP8_SPECS) >= 2


@pytest.mark.parametrize("spec", FP8_SPECS, ids=[p.stem for p in FP8_SPECS])
def test_fp8_spec_passes_every_case(spec):
    needs_sm90a(spec)
    kernel = load_once(spec)
    cases = verify_cases(kernel, verify.FULL_SUITE, kernel.masks)
    assert len(cases) == len(verify.variants(kernel.masks)) * len(verify.FULL_SUITE)
    results = [check(2000 + i, kernel.name) for i, (_v, _f, _c, _n, check) in enumerate(cases)]
    assert all(r.passed for r in results), "\n".join(
        f"{r.variant} {r.shape.label}: {'; '.join(r.problems)}" for r in results if not r.passed)


PLANTED = [
    # mma.sync: P's registers read through the K tile's key order; K stored in plain order (the
    # permutation undone) must fail the verifier.
    (D128, "kKeyOrder ? key_row(r) : r", "r"),
    # wgmma: P moves from the S accumulators to the A registers of P.V by two shuffles per 16 keys;
    # row g's halves of lanes 2 and 3 put in the wrong order must fail it.
    (WGMMA_D128_IN_ORDER, "row_g = t < 2 ? 0x5410u : 0x1054u", "row_g = 0x5410u"),
    # wgmma, k_rows: even_odd: a lane's A register packs its even and odd keys alternately; packed
    # evens first must fail it.
    (WGMMA_D128, "pack4_e4m3(g0, g1, g2, g3)", "pack4_e4m3(g0, g2, g1, g3)"),
]


@pytest.mark.parametrize("spec, right, wrong", PLANTED, ids=["key_order", "lane_exchange", "even_odd_pack"])
def test_planted_p_layout_bug_is_caught(spec, right, wrong):
    needs_sm90a(spec)
    from attngen.render import render_for
    plan, source, _ = render_for(spec)
    planted = source.replace(right, wrong)
    assert planted != source
    kernel = type(load_once(spec)).from_source(plan, planted, label="planted")
    r = check_fp8_case(kernel, verify.Variant("none"), verify.Shape(1, 2, 2, 200, 200), 7, "planted")
    assert not r.passed and "exceeds" in " ".join(r.problems)


@pytest.mark.parametrize("spec", [D128, WGMMA_D128], ids=lambda p: p.stem)
def test_descales_scale_the_values(spec):
    import torch
    needs_sm90a(spec)
    kernel = load_once(spec)
    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(2, 4, 300, 128, generator=g, device="cuda") for _ in range(3))
    q8, k8, vt, qd, kd, vd = quantize_fp8(q, k, v)
    o = kernel(q8, k8, vt, q_descale=qd, k_descale=kd, v_descale=vd, causal=True)
    o2 = kernel(q8, k8, vt, q_descale=qd, k_descale=kd, v_descale=vd * 4, causal=True)
    assert o.dtype == torch.bfloat16 and o.shape == q.shape
    assert torch.equal((o.float() * 4).to(torch.bfloat16), o2)  # a power of two is exact
    plain = kernel(q8, k8, vt, causal=True)       # no descales: the e4m3 values as they are
    assert not torch.equal(plain, o)


def test_a_caller_s_out_takes_the_prepared_path():
    """Repeated e4m3 calls into a caller's out (as the bench times them) are prepared launches: the
    second writes the second out, bit for bit the output of a call that allocates its own."""
    import torch
    needs_sm90a(WGMMA_D128)
    kernel = load_once(WGMMA_D128)
    g = torch.Generator(device="cuda").manual_seed(4)
    sets = [quantize_fp8(*(torch.randn(1, 4, 500, 128, generator=g, device="cuda") for _ in range(3)))
            for _ in range(2)]
    outs = [torch.full((1, 4, 500, 128), float("nan"), device="cuda", dtype=kernel.out_dtype) for _ in range(2)]
    q8, k8, vt, qd, kd, vd = sets[0]
    kernel(q8, k8, vt, q_descale=qd, k_descale=kd, v_descale=vd, causal=True, out=outs[0])
    before = len(kernel._prepared)
    q8, k8, vt, qd, kd, vd = sets[1]
    assert kernel(q8, k8, vt, q_descale=qd, k_descale=kd, v_descale=vd, causal=True, out=outs[1]) is outs[1]
    assert len(kernel._prepared) == before
    for (q8, k8, vt, qd, kd, vd), out in zip(sets, outs):
        assert torch.equal(out, kernel(q8, k8, vt, q_descale=qd, k_descale=kd, v_descale=vd, causal=True))


def test_bad_inputs_are_refused_on_the_host():
    import torch
    kernel = load_once(D128)
    q, k, v = (torch.randn(1, 2, 64, 128, device="cuda") for _ in range(3))
    q8, k8, vt, qd, kd, vd = quantize_fp8(q, k, v)
    with pytest.raises(ValueError, match="V transposed"):
        kernel(q8, k8, vt.transpose(2, 3), q_descale=qd)
    with pytest.raises(ValueError, match="q_descale must be a contiguous fp32"):
        kernel(q8, k8, vt, q_descale=qd.double())
    with pytest.raises(TypeError, match="takes torch.float8_e4m3fn"):
        kernel(q.half(), k8, vt)
    k70 = torch.zeros(1, 2, 70, 128, dtype=torch.float8_e4m3fn, device="cuda")
    vt70 = torch.zeros(1, 2, 128, 70, dtype=torch.float8_e4m3fn, device="cuda")   # rows 70 bytes apart
    with pytest.raises(ValueError, match="multiples of 16"):
        kernel(q8, k70, vt70)


@pytest.mark.parametrize("head_dim, seqlen", [(64, 300), (64, 5000), (128, 300), (128, 5000)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_each_table_cell_serves_its_kernel_s_output(head_dim, seqlen, causal):
    """attngen.attention_fp8 through the table's entry (its launch record: k_rows even_odd cells take K
    in two strided copies) gives the chosen spec's own output bit for bit, and that output is within 10 % of
    fp32 attention on the dequantized inputs (mean error against mean magnitude)."""
    import torch
    from attngen.ops.table import load_table, select, table_path
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm_90 entries")
    g = torch.Generator(device="cuda").manual_seed(head_dim + seqlen)
    q, k, v = (torch.randn(1, seqlen, 4, head_dim, generator=g, device="cuda") for _ in range(3))
    q8, k8, vt, qd, kd, vd = attngen.quantize_fp8(q, k, v, layout="bshd")
    entry = select(load_table(table_path(ROOT / "specs")), "forward_fp8", "sm_90", "e4m3", head_dim,
                   "causal" if causal else "none", seqlen)
    want = load_once(ROOT / "specs" / f"{entry.spec}.yaml")(q8, k8, vt, q_descale=qd, k_descale=kd, v_descale=vd,
                                                          causal=causal, layout="bshd")
    got = attngen.attention_fp8(q8, k8, vt, q_descale=qd, k_descale=kd, v_descale=vd, causal=causal, layout="bshd")
    assert torch.equal(got, want), entry.spec
    # fp32 attention on the dequantized inputs: what is left is P's rounding to e4m3, a few percent of
    # each output; keys out of order give errors of the outputs' own size.
    q_deq, k_deq = (t8.float().transpose(1, 2) * d[:, :, None, None] for t8, d in ((q8, qd), (k8, kd)))
    v_deq = vt[..., :seqlen].float().transpose(-1, -2) * vd[:, :, None, None]
    ref = torch.nn.functional.scaled_dot_product_attention(q_deq, k_deq, v_deq, is_causal=causal).transpose(1, 2)
    err = (got.float() - ref).abs().mean().item()
    assert err < 0.1 * ref.abs().mean().item(), (entry.spec, err, ref.abs().mean().item())


def test_library_call_is_the_kernel_call_and_compiles():
    """attngen.attention_fp8 serves the call from the dispatch table's e4m3 spec, bit for bit the
    kernel's output, eager and under torch.compile(fullgraph=True); opcheck passes on its op."""
    import torch
    torch._dynamo.reset()
    g = torch.Generator(device="cuda").manual_seed(5)
    q, k, v = (torch.randn(2, 300, 4, 128, generator=g, device="cuda") for _ in range(3))
    q8, k8, vt, qd, kd, vd = attngen.quantize_fp8(q, k, v, layout="bshd")
    from attngen.ops.table import load_table, select, table_path
    major, minor = torch.cuda.get_device_capability()
    entry = select(load_table(table_path(ROOT / "specs")), "forward_fp8", f"sm_{major}{minor}", "e4m3", 128, "causal", 300)
    want = load_once(ROOT / "specs" / f"{entry.spec}.yaml")(q8, k8, vt, q_descale=qd, k_descale=kd, v_descale=vd, causal=True, layout="bshd")
    got = attngen.attention_fp8(q8, k8, vt, q_descale=qd, k_descale=kd, v_descale=vd, causal=True, layout="bshd")
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)

    def f(q8, k8, vt, qd, kd, vd):
        return attngen.attention_fp8(q8, k8, vt, q_descale=qd, k_descale=kd, v_descale=vd, causal=True,
                                     layout="bshd") * 2
    compiled = torch.compile(f, fullgraph=True)(q8, k8, vt, qd, kd, vd)
    assert torch.equal(compiled, want * 2)
    # test_schema is left out: its mutation check does arithmetic on the inputs, which torch has no
    # kernel for on float8_e4m3fn tensors ("mul_cuda" not implemented). opcheck clones the inputs
    # contiguous, so its V^T rows must be 16-byte aligned without padding: 256 keys.
    q8, k8, vt, qd, kd, vd = attngen.quantize_fp8(*(t[:, :256] for t in (q, k, v)), layout="bshd")
    torch.library.opcheck(torch.ops.attngen.attention_fp8.default,
                          (q8, k8, vt, qd, kd, vd, True, None, None, "bshd"),
                          test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))


def test_the_bench_times_a_spec_only_on_the_masks_it_has():
    """A causal-only e4m3 spec benched on both masks: its full-mask row is "unsupported", its causal row timed."""
    spec = ROOT / "specs" / "lab" / "h100_wgmma_d128_fp8_n192c2ps3r24x240opbq2keo.yaml"
    needs_sm90a(spec)
    from attngen.eval.bench.forward_fp8 import run_fp8_bench
    report = run_fp8_bench([spec], shapes=[(1, 2, 384, 128)], causals=(False, True), backends=(), reps=3)
    (full,), (causal,) = (row.timings for row in report.results)
    assert (full.status, causal.status) == ("unsupported", "ok"), (full.note, causal.note)
    assert "no none function" in full.note
    assert causal.median_us > 0 and causal.back_to_back_us > 0 and causal.eager_us > 0
