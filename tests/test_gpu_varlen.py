"""GPU tests of the varlen call: every varlen spec passes the verifier's varlen
cases, a varlen call agrees with the padded call sequence by sequence, bad offsets are refused on
the host, and without validation the kernel stays inside the tensors."""
from __future__ import annotations

import functools
from pathlib import Path

import pytest

import attngen
from attngen.eval import verify
from attngen.eval.verify.varlen import varlen_cases
from attngen.runtime import InputError
from attngen.runtime.calls.varlen import cu_seqlens
from spec_sample import SPEC_PATHS, spec_text

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
# the forward specs with varlen functions (the backward ones: tests/test_gpu_backward.py's full suite)
VARLEN_SPECS = [p for p in SPEC_PATHS if ("\nvarlen: true" in spec_text(p) or "\nvarlen: only" in spec_text(p))
                and "\nbackward:" not in spec_text(p)]
D64 = ROOT / "specs" / "h100_mma_d64_m128n64w4s2x3q.yaml"
D64_WGMMA = ROOT / "specs" / "h100_wgmma_d64_varlen.yaml"       # TMA at each sequence's rows (sm_90a)
D128_WGMMA = ROOT / "specs" / "h100_wgmma_d128_varlen.yaml"     # ping-pong, a TMA-store spec stored without it
# the kinds' two ways to reach a sequence's rows: moved pointers and TMA coordinates
BY_KIND = [pytest.param(D64, id="mma"), pytest.param(D64_WGMMA, id="wgmma")]


@functools.lru_cache(maxsize=None)
def load_once(path: Path):
    return attngen.load(path, synchronize=True)


@pytest.fixture
def torch():
    import torch
    return torch


def needs_sm90a(path):
    """Skip a Hopper-kind spec on a GPU without sm_90a."""
    import torch
    if "wgmma" in path.stem and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip(f"{path.stem} needs sm_90a (an H100 or H200)")


def test_varlen_specs_exist():
    assert len(VARLEN_SPECS) >= 4 and D64 in VARLEN_SPECS


@pytest.mark.parametrize("spec", VARLEN_SPECS, ids=[p.stem for p in VARLEN_SPECS])
def test_varlen_spec_passes_every_case(spec):
    needs_sm90a(spec)
    kernel = load_once(spec)
    assert kernel.varlen_masks == kernel.masks      # a varlen function for every mask of the spec
    cases = varlen_cases(kernel, verify.FULL_SUITE, kernel.masks)
    results = [check(1000 + i, kernel.name) for i, (_v, _f, _c, _n, check) in enumerate(cases)]
    assert len(results) == len(verify.variants(kernel.masks, kernel.plan.block_n)) * 6
    assert all(r.passed for r in results), "\n".join(
        f"{r.variant} {r.shape.label}: {'; '.join(r.problems)}" for r in results if not r.passed)


def offsets(torch, lengths):
    return cu_seqlens(torch, lengths, "cuda")


@pytest.mark.parametrize("spec", BY_KIND + [pytest.param(D128_WGMMA, id="wgmma-d128")])
@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
def test_varlen_matches_padded_calls(torch, alignment, spec):
    """Each sequence of a varlen call gives what the padded call gives on that sequence alone, bit
    for bit (the Hopper kind's keys past a sequence's end hold the next sequence's rows, not zeros:
    the mask must hide them exactly)."""
    needs_sm90a(spec)
    kernel = load_once(spec)
    d = kernel.plan.head_dim
    lq, lk = (3, 130, 64), (200, 130, 1)
    q = torch.randn(sum(lq), 4, d, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(sum(lk), 2, d, device="cuda", dtype=torch.float16) for _ in range(2))
    o, lse = kernel.varlen(q, k, v, offsets(torch, lq), offsets(torch, lk), causal=True, alignment=alignment,
                           return_lse=True)
    q0 = k0 = 0
    for a, b in zip(lq, lk):
        ob, lb = kernel(q[q0:q0 + a][None], k[k0:k0 + b][None], v[k0:k0 + b][None], causal=True, alignment=alignment,
                        layout="bshd", return_lse=True)
        assert torch.equal(o[q0:q0 + a], ob[0])
        assert torch.equal(lse[:, q0:q0 + a], lb[0])
        q0, k0 = q0 + a, k0 + b


@pytest.mark.parametrize("cu_q, cu_k, kw, error, fragment", [
    ([0, 5, 3], [0, 5, 8], {"validate": True}, ValueError, "decreases at sequence 1"),
    ([0, 5, 20], [0, 5, 8], {"validate": True}, ValueError, "has 10 rows"),
    ([-2, 5, 8], [0, 5, 8], {"validate": True}, ValueError, "0 or more"),
    ([0, 5, 8], [0, 8], {}, ValueError, "the same sequences"),
    ([0, 5, 8], [0, 5, 8], {"max_seqlen_q": 4, "validate": True}, ValueError, "pass at least 5"),
    ("int64", [0, 5, 8], {}, TypeError, "must be int32"),
    ([0, 5, 8], [0, 5, 8], {"causal": False, "alignment": "bottom_right"}, ValueError, "causal=True or a window only"),
])
def test_bad_offsets_are_refused(torch, cu_q, cu_k, kw, error, fragment):
    kernel = load_once(D64)
    q = torch.randn(10, 4, 64, device="cuda", dtype=torch.float16)
    k = v = torch.randn(8, 4, 64, device="cuda", dtype=torch.float16)
    cq = (torch.tensor([0, 5, 8], dtype=torch.int64, device="cuda") if cu_q == "int64"
          else torch.tensor(cu_q, dtype=torch.int32, device="cuda"))
    ck = torch.tensor(cu_k, dtype=torch.int32, device="cuda")
    with pytest.raises(error, match=fragment.replace("(", r"\(").replace("[", r"\[")):
        kernel.varlen(q, k, v, cq, ck, **kw)


def test_bad_shapes_are_refused(torch):
    kernel = load_once(D64)
    cu = torch.tensor([0, 4], dtype=torch.int32, device="cuda")
    q = torch.randn(4, 4, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="3-D"):
        kernel.varlen(q[None], q, q, cu, cu)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        kernel.varlen(q, q[:, :3], q[:, :3], cu, cu)
    padded = load_once(ROOT / "specs" / "h100_mma_d64.yaml")
    with pytest.raises(ValueError, match="varlen: true"):
        padded.varlen(q, q, q, cu, cu)


@pytest.mark.parametrize("spec", BY_KIND)
def test_unvalidated_offsets_stay_inside_the_tensors(torch, spec):
    """validate=False with offsets past the tensors: rows are clamped, nothing is read or written
    outside (a guard region after o stays NaN), and the call completes."""
    needs_sm90a(spec)
    kernel = load_once(spec)
    q = torch.randn(10, 4, 64, device="cuda", dtype=torch.float16)
    k = v = torch.randn(8, 4, 64, device="cuda", dtype=torch.float16)
    buf = torch.full((10 + 64, 4, 64), float("nan"), device="cuda", dtype=torch.float16)
    bad = torch.tensor([0, 6, 4000], dtype=torch.int32, device="cuda")
    kernel.varlen(q, k, v, bad, bad, max_seqlen_q=4000, validate=False, out=buf[:10])
    torch.cuda.synchronize()
    assert torch.isnan(buf[10:]).all()
    assert torch.isfinite(buf[:10]).all()
    with pytest.raises(InputError, match="cu_seqlens offsets"):   # recorded, and cleared for later tests
        attngen.check_errors()


# -- head dims 40, 80, 160 and 192, and V of its own head dim (192 / 128, 128 / 64) ----------------------

HEAD_DIMS = [(40, 40), (80, 80), (160, 160), (192, 192), (192, 128), (128, 64)]   # (q and k, v)
# odd lengths: a single row, tails of every query and key block, one past two 128-row blocks
LENGTHS = {"self": ((333, 1, 129, 77, 700), None),
           "cross": ((333, 1, 129, 77, 5), (400, 64, 129, 1, 700))}   # queries fewer and more than keys


def hopper_table(torch):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the table serves these varlen cells on sm_90 (H100, H200)")


def dims_id(dims) -> str:
    d, dv = dims
    return f"d{d}" + (f"_v{dv}" if dv != d else "")


@pytest.mark.parametrize("mask", ["none", "causal", "causal_bottom_right"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("dims", HEAD_DIMS, ids=[dims_id(x) for x in HEAD_DIMS])
def test_varlen_head_dims_match_the_reference(torch, dims, dtype, mask):
    """attngen.attention_varlen at the head dims the Hopper kind's varlen members serve (the table's
    h100_wgmma_d{40,80,160,192}_varlen, d192_v128_varlen and d128_v64_varlen; d40's tiles padded to 48
    columns): GQA 8/2, five sequences of odd lengths (one of a single row), causal top-left over
    self-attention and bottom-right over queries fewer and more than keys; every sequence within the
    error rule of its fp32 reference, the LSE beside it, o of V's head dim, and a second call (the
    prepared path) giving the same bits."""
    from attngen.eval.verify import Variant
    from attngen.eval.verify.cases import error_bound
    from attngen.eval.verify.varlen import reference
    hopper_table(torch)
    d, dv = dims
    lens_q, lens_k = LENGTHS["cross" if mask == "causal_bottom_right" else "self"]
    lens_k = lens_k or lens_q
    dt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(d + dv)
    q = torch.randn(sum(lens_q), 8, d, device="cuda", generator=g).to(dt)
    k = torch.randn(sum(lens_k), 2, d, device="cuda", generator=g).to(dt)
    v = torch.randn(sum(lens_k), 2, dv, device="cuda", generator=g).to(dt)
    cu_q, cu_k = offsets(torch, lens_q), offsets(torch, lens_k)
    causal = mask != "none"
    alignment = "bottom_right" if mask == "causal_bottom_right" else None
    call = dict(causal=causal, alignment=alignment, return_lse=True)
    o, lse = attngen.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), **call)
    assert o.shape == (sum(lens_q), 8, dv) and lse.shape == (8, sum(lens_q))
    variant = Variant("causal", alignment or "top_left") if causal else Variant("none")
    ref, ref_lse, low = reference(torch, q, k, v, lens_q, lens_k, variant, d ** -0.5)
    at = 0
    for n in lens_q:
        rows = slice(at, at + n)
        err = (o[rows].float() - ref[rows]).abs().max().item()
        bound = error_bound((low[rows] - ref[rows]).abs().max().item())
        assert err <= bound, f"d{d} v{dv} {dtype} {mask}, sequence of {n}: {err:.3g} > {bound:.3g}"
        at += n
    seen = torch.isfinite(ref_lse)
    assert torch.equal(seen, torch.isfinite(lse))
    assert (lse[seen] - ref_lse[seen]).abs().max().item() < 1e-2
    again, lse_again = attngen.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), **call)
    assert torch.equal(again, o) and torch.equal(lse_again, lse)


def test_varlen_head_dim_v_traces_and_trains_padded(torch):
    """V of its own head dim through torch.compile(fullgraph=True): the fake op gives o V's head dim,
    and the compiled call the eager bits; with gradients the call trains through the varlen backward at
    256/256 (no varlen backward has V of its own head dim; ops.table.padded_dims), each gradient shaped
    as its input (tests/test_gpu_head_dim_padding.py checks their values)."""
    hopper_table(torch)
    lens = (100, 1, 257)
    q, k = (torch.randn(sum(lens), 4, 192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(sum(lens), 4, 128, device="cuda", dtype=torch.bfloat16)
    cu = offsets(torch, lens)

    def call(q, k, v, cu):
        return attngen.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=True)

    eager = call(q, k, v, cu)
    assert eager.shape == (sum(lens), 4, 128)
    assert torch.equal(torch.compile(call, fullgraph=True)(q, k, v, cu), eager)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = call(*leaves, cu)
    assert o.grad_fn is not None and o.shape == eager.shape
    grads = torch.autograd.grad(o, leaves, torch.randn_like(o))
    assert [g.shape for g in grads] == [t.shape for t in leaves] and all(g.isfinite().all() for g in grads)

@pytest.mark.parametrize("spec", BY_KIND)
def test_varlen_calls_into_a_caller_s_out_take_the_prepared_path(torch, spec, monkeypatch):
    """A varlen call with out= is prepared under out's layout: a second call of the layout into another out is a
    prepared launch (no full path) writing there the same as a call that allocates its own."""
    needs_sm90a(spec)
    kernel = load_once(spec)
    d = kernel.plan.head_dim
    lq = (3, 130, 64)
    cu = offsets(torch, lq)
    full_paths = []
    import attngen.runtime.calls.varlen as varlen_module
    first = varlen_module.check_sequences
    monkeypatch.setattr(varlen_module, "check_sequences", lambda *a, **kw: full_paths.append(1) or first(*a, **kw))
    sets = [tuple(torch.randn(sum(lq), 4, d, device="cuda", dtype=torch.float16) for _ in range(3)) for _ in range(2)]
    outs = [torch.full((sum(lq), 4, d), float("nan"), device="cuda", dtype=torch.float16) for _ in range(2)]
    for i, ((q, k, v), out) in enumerate(zip(sets, outs)):
        assert kernel.varlen(q, k, v, cu, cu, causal=True, out=out) is out
        if i == 0:
            taken = len(full_paths)
    assert len(full_paths) == taken
    monkeypatch.undo()
    for (q, k, v), out in zip(sets, outs):
        assert torch.equal(out, kernel.varlen(q, k, v, cu, cu, causal=True))
