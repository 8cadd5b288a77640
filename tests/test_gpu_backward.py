"""GPU tests of the backward kind: its specs pass the gradient rule, its gradients agree with torch's
own autograd, the verifier rejects a kernel with a planted bug, and bad inputs are refused. Skipped
with a reason where there is no GPU, torch, CUDA driver or nvcc."""
from __future__ import annotations

import functools
from pathlib import Path

import pytest

import attngen
from attngen.eval import verify
from attngen.eval.verify.backward import check_backward_case, takes_turns, varlen_gradients
from attngen.eval.verify.varlen import VarlenCase, varlen_suite
from spec_sample import SPEC_PATHS

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
BACKWARD_SPECS = [p for p in SPEC_PATHS if "_bwd_" in p.name]
D64 = ROOT / "specs" / "l4_bwd_d64.yaml"


@functools.lru_cache(maxsize=None)
def kernel(path):
    return attngen.load(path, synchronize=True)


def failures(results) -> str:
    return "\n".join(f"{r.spec} {r.variant} {r.shape.label} {r.shape.layout}: {'; '.join(r.problems)}"
                     for r in results if not r.passed)


def test_backward_specs_exist():
    assert len(BACKWARD_SPECS) >= 3 and D64 in BACKWARD_SPECS


@pytest.mark.parametrize("spec", BACKWARD_SPECS, ids=[p.stem for p in BACKWARD_SPECS])
def test_backward_spec_passes_full_suite(spec):
    k = kernel(spec)
    results = verify.verify_kernel(k, verify.FULL_SUITE, spec_label=k.name)
    # none, causal top-left and bottom-right, or the window cases (a mask expression: with its long-key
    # shapes); deterministic mode where key blocks take turns
    shapes = verify.kernel_shapes(k.plan, verify.FULL_SUITE)
    turns = sum(takes_turns(s, k.plan.block_n) for s in shapes)
    assert turns >= 5
    # varlen specs: the varlen suite in both modes
    varlen = len(verify.variants(k.varlen_masks, k.plan.block_n)) * len(varlen_suite(k.plan.block_m)) * 2
    assert not k.plan.varlen or varlen >= 30
    # a varlen: only spec has no padded function: the varlen suite alone
    padded = len(verify.variants(k.plan.masks, k.plan.block_n)) if k.plan.spec.padded else 0
    assert len(results) == padded * (len(shapes) + turns) + varlen
    # every mask the spec carries over the whole suite, causal in both alignments (a mask expression: its one
    # function, expr; a spec of the full mask alone, such as the 80-row d128 cell: none)
    if k.plan.spec.padded:
        functions = 1 if k.plan.masks == ("expr",) else len(k.plan.masks) + ("causal" in k.plan.masks)
        assert len(results) >= functions * len(verify.FULL_SUITE)
    assert all(r.passed for r in results), failures(results)


@pytest.mark.parametrize("causal", [False, True])
def test_gradients_match_torch_autograd(causal):
    """Against SDPA's fp32 autograd (not the verifier's written-out formulas): GQA, Sq != Sk tails."""
    import torch
    import torch.nn.functional as F
    k = kernel(D64)
    gen = torch.Generator(device="cuda").manual_seed(7)
    b, h, hk, sq, sk, d = 2, 4, 2, 300, 300, 64

    def randn(*shape):
        return torch.randn(shape, generator=gen, device="cuda")
    q32, k32, v32, do32 = randn(b, h, sq, d), randn(b, hk, sk, d), randn(b, hk, sk, d), randn(b, h, sq, d)
    leaves = [t.clone().requires_grad_() for t in (q32, k32, v32)]
    with verify.exact_fp32_matmul(torch):
        out = F.scaled_dot_product_attention(*leaves, is_causal=causal, enable_gqa=True)
        out.backward(do32)
    low = [t.half().requires_grad_() for t in (q32, k32, v32)]
    out16 = F.scaled_dot_product_attention(*low, is_causal=causal, enable_gqa=True)
    out16.backward(do32.half())
    fwd = attngen.load(ROOT / "specs" / "h100_mma_d64.yaml") if torch.cuda.get_device_capability()[0] >= 9 else None
    q, kk, v, dout = (t.half() for t in (q32, k32, v32, do32))
    if fwd is not None:
        o, lse = fwd(q, kk, v, causal=causal, return_lse=True)
    else:
        o = out.detach().half()
        s = (q32 @ k32.repeat_interleave(h // hk, 1).transpose(-1, -2)) / d ** 0.5
        if causal:
            s = s.masked_fill(torch.ones(sq, sk, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
        lse = torch.logsumexp(s, -1).contiguous()
    grads = k(q, kk, v, o, lse, dout, causal=causal)
    for name, got, ref, base in zip(("dq", "dk", "dv"), grads, (t.grad for t in leaves), (t.grad for t in low)):
        err = (got.float() - ref).abs().max().item()
        bound = verify.error_bound((base.float() - ref).abs().max().item())
        assert err <= bound, f"{name}: {err:.3g} > {bound:.3g}"


def test_backward_launched_as_programmatic_dependents():
    """On sm_90 and up each of the backward's kernels (preprocess, main, convert) is launched while the kernel
    ahead of it still runs and waits for that kernel's writes itself. Deterministic calls queued back to back
    with no sync, each behind a torch kernel that writes its dout, give bit for bit the gradients of the same
    sequence with the usual launches."""
    import torch
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("programmatic dependent launches need sm_90 or later")
    spec = ROOT / "specs" / "h100_bwd_d64_wgmma.yaml"
    early_kernel, usual = attngen.load(spec), attngen.load(spec)
    assert all(fn.programmatic for fn in early_kernel.functions.values())
    for name, fn in list(usual.functions.items()):
        usual.functions[name] = fn._replace(programmatic=False)
    gen = torch.Generator(device="cuda").manual_seed(5)
    q, k, v, dout = (torch.randn(2, 4, 700, 64, generator=gen, device="cuda").half() for _ in range(4))
    o, lse = attngen.attention(q, k, v, causal=True, return_lse=True)

    def calls(bwd):
        return [bwd(q, k, v, o, lse, dout * (1.0 + i / 8), causal=True, deterministic=True) for i in range(5)]
    early, after = calls(early_kernel), calls(usual)
    torch.cuda.synchronize()
    for i, (a, b) in enumerate(zip(early, after)):
        for name, x, y in zip(("dq", "dk", "dv"), a, b):
            assert torch.equal(x, y), f"call {i} {name}: the programmatic launches differ by {(x - y).abs().max().item()}"


def test_planted_bug_is_rejected():
    """dK without its scale: the verifier must fail the case on dk alone."""
    k = kernel(D64)
    sources = list(k.sources)
    bad = sources[0].replace("pack2(dk[mt][dt][2 * h] * p.scale, dk[mt][dt][2 * h + 1] * p.scale)",
                             "pack2(dk[mt][dt][2 * h], dk[mt][dt][2 * h + 1])")
    assert bad != sources[0]
    broken = type(k).from_sources(k.plan, (bad, *sources[1:]), label="planted", synchronize=True)
    r = check_backward_case(broken, verify.Variant("none"), verify.Shape(2, 4, 2, 113, 300), 0, "planted")
    assert not r.passed and any(p.startswith("dk") for p in r.problems), r.problems
    assert not any(p.startswith(("dq", "dv")) for p in r.problems), r.problems


def test_a_call_with_no_backward_spec_is_refused_before_its_forward(monkeypatch):
    """With the table's d256 backward entries left out, head_dim 256 has forward specs but no backward
    one, and no larger head dim to run padded at: the eager call says so at once."""
    import torch
    from table_patch import without_backward
    without_backward(monkeypatch, 256)
    q = torch.randn(1, 2, 64, 256, device="cuda", dtype=torch.float16, requires_grad=True)
    with pytest.raises(NotImplementedError, match="no backward for this call"):
        attngen.attention(q, q, q)
    with torch.no_grad():
        assert attngen.attention(q, q, q).shape == q.shape


def test_bad_inputs_are_refused():
    import torch
    k = kernel(D64)
    q = torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.float16)
    lse = torch.zeros(1, 2, 64, device="cuda")
    with pytest.raises(ValueError, match="lse must be"):
        k(q, q, q, q, lse[:, :1], q)
    with pytest.raises(ValueError, match="dout must have"):
        k(q, q, q, q, lse, q[:, :, :32])
    with pytest.raises(TypeError, match="float16"):
        k(q, q, q, q, lse, q.float())


# -- autograd through attngen.attention --------------------------------------------------------------

def sdpa_gradients(torch, q, k, v, dout, causal):
    """(dq, dk, dv) of SDPA in fp32 (the reference) and in the inputs' dtype (its error sets the bound)."""
    import torch.nn.functional as F
    out = []
    for dtype in (torch.float32, q.dtype):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        with verify.exact_fp32_matmul(torch):
            F.scaled_dot_product_attention(*leaves, is_causal=causal, enable_gqa=True).backward(dout.to(dtype))
        out.append([t.grad.float() for t in leaves])
    return out


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype, d", [("float16", 128), ("bfloat16", 64)])
def test_loss_backward_through_attention(causal, dtype, d):
    """loss.backward() through attngen.attention (the op and its registered backward, the table's
    backward spec): gradients within the rule of SDPA's fp32 autograd; the LSE takes no gradient."""
    import torch
    gen = torch.Generator(device="cuda").manual_seed(3)
    dt = getattr(torch, dtype)
    q, k, v, dout = (torch.randn(s, generator=gen, device="cuda").to(dt) for s in
                     ((2, 8, 333, d), (2, 2, 333, d), (2, 2, 333, d), (2, 8, 333, d)))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = attngen.attention(*leaves, causal=causal)
    assert o.grad_fn is not None
    o.backward(dout)
    ref, low = sdpa_gradients(torch, q, k, v, dout, causal)
    for name, got, want, base in zip(("dq", "dk", "dv"), (t.grad for t in leaves), ref, low):
        err = (got.float() - want).abs().max().item()
        bound = verify.error_bound((base - want).abs().max().item())
        assert err <= bound, f"{name}: {err:.3g} > {bound:.3g}"
    o, lse = attngen.attention(*leaves, causal=causal, return_lse=True)
    assert not lse.requires_grad


@pytest.mark.parametrize("sq, sk, tile", [(128, 2048, "m64"), (2048, 512, "m80")])
def test_the_backward_takes_its_query_tile_by_seqlen_q(sq, sk, tile):
    """The d128 full-mask backward picks 64- or 80-row query blocks by seqlen_q, not seqlen_k (few queries
    against many keys: the 80-row blocks' empty tail rows cost more than they gain), and the cross call's
    gradients through attngen.attention are within the rule of SDPA's fp32 autograd."""
    import torch
    from attngen.ops import library
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the table's 80-row backward cells are sm_90's")
    gen = torch.Generator(device="cuda").manual_seed(5)
    q, dout = (torch.randn(1, 4, sq, 128, generator=gen, device="cuda").half() for _ in range(2))
    k, v = (torch.randn(1, 4, sk, 128, generator=gen, device="cuda").half() for _ in range(2))
    name = library.backward_kernel(q, k, v, False, "bhsd").plan.spec.name
    assert name.endswith("_m80") == (tile == "m80"), name
    rows_first = [t.transpose(1, 2) for t in (q, k, v)]   # the same call in bshd: seqlen_q is dim 1
    assert library.backward_kernel(*rows_first, False, "bshd").plan.spec.name == name
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    attngen.attention(*leaves).backward(dout)
    ref, low = sdpa_gradients(torch, q, k, v, dout, False)
    for gname, got, want, base in zip(("dq", "dk", "dv"), (t.grad for t in leaves), ref, low):
        err = (got.float() - want).abs().max().item()
        bound = verify.error_bound((base - want).abs().max().item())
        assert err <= bound, f"{gname}: {err:.3g} > {bound:.3g}"


def compiled_step_matches_eager(torch, step, leaves):
    """step(*leaves).backward() eager, then compiled with fullgraph=True: the same gradients (within
    dQ's atomics' run-to-run difference). Leaves the compiled gradients in place."""
    step(*leaves).backward()
    eager = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    torch.compile(step, fullgraph=True)(*leaves).backward()
    for a, b in zip(eager, (t.grad for t in leaves)):
        assert torch.allclose(a.float(), b.float(), atol=2e-3, rtol=0), (a.float() - b.float()).abs().max()


def test_sum_loss_and_compiled_step():
    """A loss whose gradient autograd expands (o.sum(): stride 0) and a torch.compile(fullgraph=True)
    training step give the eager gradients."""
    import torch
    gen = torch.Generator(device="cuda").manual_seed(4)
    q, k, v = (torch.randn(1, 4, 256, 64, generator=gen, device="cuda").half().requires_grad_() for _ in range(3))

    def step(q, k, v):
        o = attngen.attention(q, k, v, causal=True)
        return (o.float() * o.float()).sum()

    compiled_step_matches_eager(torch, step, (q, k, v))
    for t in (q, k, v):
        t.grad = None
    attngen.attention(q, k, v).sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_small_gpt_trains_like_sdpa():
    """docs/backward-h200/train_compare.py at a reduced size (2 layers, d_model 128, 2 heads of 64, 256 tokens, 100
    steps at lr 3e-3, bf16): the loss falls (by 2.1 on the CPU with SDPA: 6.40 -> 4.29), and attngen's
    curve stays as close to SDPA's as SDPA's second run (3x its mean |difference|, with a floor of
    0.05 for a run where SDPA repeats itself exactly)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("train_compare", ROOT / "docs" / "backward-h200" / "train_compare.py")
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    report = train.compare(train.options(["unused.json", "--steps", "100", "--layers", "2", "--d-model", "128",
                                          "--heads", "2", "--seq", "256", "--batch", "4", "--lr", "3e-3"]))
    losses = report["losses"]["attngen"]
    assert sum(losses[-10:]) / 10 < losses[0] - 1.0, losses
    assert report["attngen_vs_sdpa"]["mean"] <= max(3 * report["sdpa_vs_sdpa"]["mean"], 0.05), report


def test_bench_gpt_step_times_a_small_gpt_checked_against_sdpa(tmp_path):
    """`attngen bench --gpt-step` at a small size (1 layer, d_model 128, 2 heads of 64, 128 tokens, batch 2;
    2 steps a round, 2 rounds, so each attention runs first once): the first-step check passes, all four
    variants run (the compiled ones compile), and the report has each one's ms per step, both ratios and
    both modes' paired ratios over the 2 rounds."""
    import json
    from click.testing import CliRunner
    from attngen.cli import main
    out = tmp_path / "gpt.json"
    result = CliRunner().invoke(main, ["bench", "--gpt-step", "--gpt-model", "1x128x2x128x2", "--reps", "2",
                                       "--rounds", "2", "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["status"] == "ok" and report["loss_rel_diff"] <= 1e-3 and not report["failed"], report
    assert set(report["ms_per_step"]) == {"sdpa eager", "attngen eager", "sdpa compiled", "attngen compiled"}
    assert set(report["sdpa_over_attngen"]) == {"eager", "compiled"}
    assert {mode: pair["rounds"] for mode, pair in report["paired"].items()} == {"eager": 2, "compiled": 2}
    assert all(len(rounds) == 2 for rounds in report["rounds_ms"].values())


def test_opcheck_of_the_training_ops():
    """torch.library.opcheck: schema, fakes and the autograd registration (gradients through
    attention_train), bhsd and bshd. Not its AOT-dispatch test: that compares two runs' outputs
    bitwise-closely, and dQ's fp32 atomics land in any order."""
    import torch
    from attngen.ops import library  # noqa: F401  (defines torch.ops.attngen's ops; run alone, nothing else has)
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    gen = torch.Generator(device="cuda").manual_seed(5)
    q, k, v = (torch.randn(2, n, 200, 64, generator=gen, device="cuda").half() for n in (4, 2, 2))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    torch.library.opcheck(torch.ops.attngen.attention_train.default, (*leaves, True, None, None, "bhsd"),
                          test_utils=utils)
    bshd = [t.transpose(1, 2).clone().requires_grad_() for t in (q, k, v)]
    torch.library.opcheck(torch.ops.attngen.attention_train.default, (*bshd, False, None, 0.1, "bshd"),
                          test_utils=utils)
    o, lse = torch.ops.attngen.attention(q, k, v, True, None, None, "bhsd")
    torch.library.opcheck(torch.ops.attngen.attention_backward.default,
                          (torch.randn_like(o), q, k, v, o, lse, True, None, None, "bhsd"), test_utils=utils)


# -- variants: window, softcap, ALiBi ------------------------------------------------------------------

VARIANT_CALLS = [   # (name, causal, attention() keywords but the slopes, ALiBi)
    ("window", False, {"window": (100, 30)}, False),
    ("window_causal", True, {"window": (200, -1)}, False),
    ("softcap", True, {"softcap": 3.0}, False),
    ("alibi", False, {}, True),
    ("softcap_alibi", True, {"softcap": 3.0}, True),   # both at once: the _softcap_alibi specs
]


def variant_reference_gradients(torch, q, k, v, dout, causal, keywords, slopes):
    """(dq, dk, dv) through torch's autograd of verify's reference attention with the call's variants,
    in fp32 (the reference) and in the inputs' dtype (its error sets the bound)."""
    from attngen.core.variants import SCORES
    mask, window = "causal" if causal else "none", keywords.get("window")
    if window is not None:
        mask, window = "window", (window[0], 0 if causal else window[1])
    modifiers = (((SCORES["softcap"], keywords["softcap"]),) if "softcap" in keywords else ()) + (
        ((SCORES["alibi"], slopes),) if slopes is not None else ())
    out = []
    for dtype in (torch.float32, q.dtype):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        with verify.exact_fp32_matmul(torch):
            o, _ = verify.attention_torch(*leaves, scale=q.shape[-1] ** -0.5, mask=mask,
                                          alignment=None if mask == "none" else "top_left", window=window,
                                          modifiers=modifiers)
            o.backward(dout.to(dtype))
        out.append([t.grad.float() for t in leaves])
    return out


@pytest.mark.parametrize("dtype, d", [("float16", 64), ("bfloat16", 128)])
@pytest.mark.parametrize("name, causal, keywords, alibi", VARIANT_CALLS, ids=[c[0] for c in VARIANT_CALLS])
def test_variant_loss_backward(name, causal, keywords, alibi, dtype, d):
    """loss.backward() through attngen.attention with a window, softcap, ALiBi or both (attention_variant_train
    and the table's backward variant specs): gradients within the rule of torch's autograd through
    verify's reference attention; the ALiBi slopes take none."""
    import torch
    gen = torch.Generator(device="cuda").manual_seed(11)
    dt = getattr(torch, dtype)
    q, k, v, dout = (torch.randn(s, generator=gen, device="cuda").to(dt) for s in
                     ((2, 4, 333, d), (2, 2, 333, d), (2, 2, 333, d), (2, 4, 333, d)))
    slopes = torch.rand(4, generator=gen, device="cuda") * 0.3 if alibi else None
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = attngen.attention(*leaves, causal=causal, alibi_slopes=slopes, **keywords)
    assert o.grad_fn is not None
    o.backward(dout)
    ref, low = variant_reference_gradients(torch, q, k, v, dout, causal, keywords, slopes)
    for what, got, want, base in zip(("dq", "dk", "dv"), (t.grad for t in leaves), ref, low):
        err = (got.float() - want).abs().max().item()
        bound = verify.error_bound((base - want).abs().max().item())
        assert err <= bound, f"{name} {what}: {err:.3g} > {bound:.3g}"


@pytest.mark.parametrize("name, causal, keywords, alibi", VARIANT_CALLS, ids=[c[0] for c in VARIANT_CALLS])
def test_variant_training_steps_take_the_prepared_step(name, causal, keywords, alibi):
    """Repeated training steps with a window, softcap or ALiBi (attention()'s eager call, a _PreparedStep
    with the call's variants): the first step prepares the forward and the backward, the later ones run
    those, a sum's loss (dout expanded) takes the full backward, new slopes make a step of their own;
    every step's gradients are within the rule of the fp32 reference with the same variants."""
    import torch
    from attngen.ops import library
    from attngen.runtime.calls.shared import call_key, variant_key
    gen = torch.Generator(device="cuda").manual_seed(12)
    q, k, v, dout = (torch.randn(s, generator=gen, device="cuda").half() for s in
                     ((2, 4, 333, 64), (2, 2, 333, 64), (2, 2, 333, 64), (2, 4, 333, 64)))
    slopes = [torch.rand(4, generator=gen, device="cuda") * 0.3 for _ in range(2)] if alibi else [None, None]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    for n, (loss, s) in enumerate((("dout", slopes[0]), ("dout", slopes[0]), ("sum", slopes[0]), ("dout", slopes[0]),
                                   ("dout", slopes[1]))):
        o = attngen.attention(*leaves, causal=causal, alibi_slopes=s, **keywords)
        g = dout if loss == "dout" else torch.ones((), device="cuda", dtype=dout.dtype).expand(dout.shape)  # a sum's
        got = torch.autograd.grad(o, leaves, g)
        ref, low = variant_reference_gradients(torch, q, k, v, g, causal, keywords, s)
        for what, x, want, base in zip(("dq", "dk", "dv"), got, ref, low):
            err = (x.float() - want).abs().max().item()
            bound = verify.error_bound((base - want).abs().max().item())
            assert err <= bound, f"{name} step {n} ({loss}) {what}: {err:.3g} > {bound:.3g}"
    window = keywords.get("window")
    key = call_key(*leaves, causal, None, None, False, "bhsd", variant_key(window, keywords.get("softcap"), slopes[0]))
    step = library._TRAIN[key]
    assert step.forward_prepared is not None and step.gradient_prepared is not None


def test_variant_compiled_step_and_opcheck():
    """A torch.compile(fullgraph=True) training step with a window gives the eager gradients; opcheck
    of attention_variant_train (softcap) and attention_variant_backward (ALiBi)."""
    import torch
    gen = torch.Generator(device="cuda").manual_seed(12)
    q, k, v = (torch.randn(1, 4, 256, 64, generator=gen, device="cuda").half().requires_grad_() for _ in range(3))

    def step(q, k, v):
        o = attngen.attention(q, k, v, causal=True, window=(64, -1))
        return (o.float() * o.float()).sum()

    compiled_step_matches_eager(torch, step, (q, k, v))
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    torch.library.opcheck(torch.ops.attngen.attention_variant_train.default,
                          (*leaves, False, None, None, "bhsd", None, 5.0, None), test_utils=utils)
    slopes = torch.rand(4, generator=gen, device="cuda") * 0.3
    o, lse = torch.ops.attngen.attention_variant(q, k, v, True, None, None, "bhsd", None, None, slopes)
    torch.library.opcheck(torch.ops.attngen.attention_variant_backward.default,
                          (torch.randn_like(o), q, k, v, o, lse, True, None, None, "bhsd", None, None, slopes),
                          test_utils=utils)


# -- deterministic mode ----------------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True])
def test_deterministic_mode_repeats_bit_for_bit(causal):
    """deterministic=True: dq (and dk, dv) of repeated calls are bitwise equal, on a shape with many
    key blocks per query block and GQA; through autograd too (attngen.attention(deterministic=True))."""
    import torch
    gen = torch.Generator(device="cuda").manual_seed(13)
    q, k, v, dout = (torch.randn(s, generator=gen, device="cuda").half() for s in
                     ((2, 8, 1500, 128), (2, 2, 1500, 128), (2, 2, 1500, 128), (2, 8, 1500, 128)))
    bwd = kernel(ROOT / "specs" / "h100_bwd_d128.yaml")
    o, lse = attngen.attention(q, k, v, causal=causal, return_lse=True)
    first = bwd(q, k, v, o, lse, dout, causal=causal, deterministic=True)
    for _ in range(3):
        again = bwd(q, k, v, o, lse, dout, causal=causal, deterministic=True)
        assert all(torch.equal(a, b) for a, b in zip(first, again))
    plain = bwd(q, k, v, o, lse, dout, causal=causal)
    assert (plain[0].float() - first[0].float()).abs().max().item() < 2e-2   # the same sums, in another order
    grads = []
    for _ in range(2):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        attngen.attention(*leaves, causal=causal, deterministic=True).backward(dout)
        grads.append([t.grad for t in leaves])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


# -- varlen ------------------------------------------------------------------------------------------------

VARLEN_LENGTHS = ((300, 1, 0, 129, 77), (300, 64, 5, 129, 0))   # queries, keys: an empty sequence of each


def varlen_leaves(torch, gen, dtype, d, heads=(4, 2)):
    lens_q, lens_k = VARLEN_LENGTHS
    tq, tk = sum(lens_q), sum(lens_k)

    def randn(*shape):
        return torch.randn(shape, generator=gen, device="cuda").to(getattr(torch, dtype))
    q, k, v = randn(tq, heads[0], d), randn(tk, heads[1], d), randn(tk, heads[1], d)
    cu = [torch.tensor([0, *__import__("itertools").accumulate(n)], dtype=torch.int32, device="cuda")
          for n in (lens_q, lens_k)]
    return (q, k, v), cu, randn(tq, heads[0], d)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype, d", [("float16", 64), ("bfloat16", 128)])
def test_varlen_loss_backward(causal, dtype, d):
    """loss.backward() through attngen.attention_varlen (GQA, Sq != Sk per sequence, empty sequences,
    bottom-right causal): each sequence's gradients within the rule of its own reference."""
    import torch
    from attngen.eval.verify import Variant
    gen = torch.Generator(device="cuda").manual_seed(21)
    (q, k, v), (cu_q, cu_k), dout = varlen_leaves(torch, gen, dtype, d)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = attngen.attention_varlen(*leaves, cu_q, cu_k, max(VARLEN_LENGTHS[0]), max(VARLEN_LENGTHS[1]), causal=causal,
                                 alignment="bottom_right" if causal else None)
    o.backward(dout)
    case = VarlenCase(4, 2, *VARLEN_LENGTHS)
    variant = Variant("causal", "bottom_right") if causal else Variant("none")
    ref, low = varlen_gradients(torch, q, k, v, dout, case, variant, d ** -0.5)
    assert (o.float() - ref[0]).abs().max().item() < 2e-2
    for name, got, want, base in zip(("dq", "dk", "dv"), (t.grad for t in leaves), ref[2:], low[2:]):
        err = (got.float() - want).abs().max().item()
        bound = verify.error_bound((base.float() - want).abs().max().item())
        assert err <= bound, f"{name}: {err:.3g} > {bound:.3g}"


def test_varlen_deterministic_compiled_step_and_opcheck():
    """attention_varlen(deterministic=True) repeats bit for bit; a torch.compile(fullgraph=True)
    varlen training step gives the eager gradients; opcheck of attention_varlen_train and
    attention_varlen_backward."""
    import torch
    gen = torch.Generator(device="cuda").manual_seed(22)
    (q, k, v), (cu_q, cu_k), dout = varlen_leaves(torch, gen, "float16", 64)
    grads = []
    for _ in range(2):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        attngen.attention_varlen(*leaves, cu_q, cu_k, causal=True, deterministic=True).backward(dout)
        grads.append([t.grad for t in leaves])
    assert all(torch.equal(a, b) for a, b in zip(*grads))

    def step(q, k, v):
        o = attngen.attention_varlen(q, k, v, cu_q, cu_k, 300, 300, causal=True)
        return (o.float() * o.float()).sum()

    compiled_step_matches_eager(torch, step, [t.clone().requires_grad_() for t in (q, k, v)])
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    torch.library.opcheck(torch.ops.attngen.attention_varlen_train.default,
                          (*leaves, cu_q, cu_k, 300, 300, False, None, None), test_utils=utils)
    o, lse = torch.ops.attngen.attention_varlen(q, k, v, cu_q, cu_k, 300, 300, True, "bottom_right", None)
    torch.library.opcheck(torch.ops.attngen.attention_varlen_backward.default,
                          (dout, q, k, v, o, lse, cu_q, cu_k, 300, 300, True, "bottom_right", None), test_utils=utils)


@pytest.mark.parametrize("spec", ["h100_bwd_d64_wgmma_varlen", "h100_bwd_d64_varlen"])
def test_varlen_backward_ignores_rows_past_the_sequences(spec):
    """Rows of q and dout past the last sequence (the packed tensors are longer than cu_seqlens_q[-1])
    hold inf and NaN: the gradients of the sequences' rows are those of the same call with zeros
    there, bit for bit in deterministic mode. (The Hopper kind's TMA boxes of a sequence's last query
    block reach into those rows; the kernel zeroes them before its GEMMs.)"""
    import torch
    if "wgmma" in spec and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the wgmma backward targets sm_90a")
    gen = torch.Generator(device="cuda").manual_seed(29)
    (q, k, v), (cu_q, cu_k), dout = varlen_leaves(torch, gen, "float16", 64)
    o, lse = attngen.attention_varlen(q, k, v, cu_q, cu_k, causal=True, return_lse=True)
    pad = 70
    total = q.shape[0]

    def padded(t, fill):
        extra = torch.full((pad, *t.shape[1:]), fill, dtype=t.dtype, device=t.device)
        extra[::2] = float("nan")
        return torch.cat([t, extra])
    bwd = kernel(ROOT / "specs" / f"{spec}.yaml")
    lse_pad = torch.cat([lse, torch.zeros(lse.shape[0], pad, device=lse.device)], dim=1)
    grads = {}
    for fill in (0.0, float("inf")):
        qp, op, dp = padded(q, fill), padded(o, fill), padded(dout, fill)
        dq, dk, dv = bwd.varlen(qp, k, v, op, lse_pad, dp, cu_q, cu_k, causal=True, deterministic=True)
        grads[fill] = (dq[:total], dk, dv)
    for clean, dirty in zip(grads[0.0], grads[float("inf")]):
        assert torch.isfinite(dirty).all()
        assert torch.equal(clean, dirty)


@pytest.mark.parametrize("spec", ["h100_bwd_d64_wgmma_varlen", "h100_bwd_d64_varlen"])
@pytest.mark.parametrize("deterministic", [False, True])
def test_repeated_varlen_backward_calls_take_the_prepared_path(spec, deterministic, monkeypatch):
    """A varlen backward call of a layout seen before is a prepared launch (no full path) with its own tensors:
    calls on new q, k, v, out, lse, dout and offsets of one layout each give what the full path (validate=True)
    gives on theirs, and differ from each other."""
    import torch
    import attngen.runtime.calls.backward as backward_module
    if "wgmma" in spec and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the wgmma backward targets sm_90a")
    bwd = kernel(ROOT / "specs" / f"{spec}.yaml")
    full = []
    first = backward_module.check_sequences
    monkeypatch.setattr(backward_module, "check_sequences", lambda *a, **kw: full.append(1) or first(*a, **kw))
    calls = []
    for i, seed in enumerate((31, 32, 33)):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        (q, k, v), (cu_q, cu_k), dout = varlen_leaves(torch, gen, "float16", 64)
        o, lse = attngen.attention_varlen(q, k, v, cu_q, cu_k, causal=True, return_lse=True)
        grads = bwd.varlen(q, k, v, o, lse, dout, cu_q, cu_k, causal=True, deterministic=deterministic)
        if i == 0:
            taken = len(full)
        calls.append(((q, k, v, o, lse, dout, cu_q, cu_k), grads))
    assert len(full) == taken, "a repeated call of the layout took the full path"
    monkeypatch.undo()
    for args, grads in calls:
        want = bwd.varlen(*args, causal=True, deterministic=True, validate=True)
        for got, ref in zip(grads, want):
            assert torch.isfinite(got).all()
            if deterministic:
                assert torch.equal(got, ref)
            else:   # dq's fp32 sums land in any order: within a few ulps of the deterministic order's
                assert torch.allclose(got.float(), ref.float(), rtol=1e-2, atol=1e-3)
    assert not torch.equal(calls[0][1][0], calls[1][1][0])


def test_varlen_backward_refuses_bad_inputs():
    """The varlen backward call's checks: lse of the wrong shape, a too-small max_seqlen_k under
    validate=True, a padded-only spec."""
    import torch
    gen = torch.Generator(device="cuda").manual_seed(23)
    (q, k, v), (cu_q, cu_k), dout = varlen_leaves(torch, gen, "float16", 64)
    bwd = kernel(ROOT / "specs" / "lab" / "h100_bwd_d64_varlen.yaml")
    o, lse = attngen.attention_varlen(q, k, v, cu_q, cu_k, return_lse=True)
    with pytest.raises(ValueError, match="lse"):
        bwd.varlen(q, k, v, o, lse.t(), dout, cu_q, cu_k)
    with pytest.raises(ValueError, match="max_seqlen_k is 100"):
        bwd.varlen(q, k, v, o, lse, dout, cu_q, cu_k, max_seqlen_k=100, validate=True)
    with pytest.raises(ValueError, match="varlen: true"):
        kernel(ROOT / "specs" / "lab" / "h100_bwd_d64.yaml").varlen(q, k, v, o, lse, dout, cu_q, cu_k)


def test_bench_times_a_backward_spec(tmp_path):
    """`attngen bench` on a backward spec, one small shape: the spec's gradients pass the check and
    it is timed (GPU and eager, positive TFLOP/s) beside SDPA's flash and cuDNN backward; the JSON
    report gives backward dispatch entries."""
    import json
    import subprocess
    import sys
    import torch
    from attngen.eval.dispatch_table import bench_entries
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("h100_bwd_d64 targets sm_90")
    spec, out = ROOT / "specs" / "lab" / "h100_bwd_d64.yaml", tmp_path / "bwd.json"
    run = subprocess.run([sys.executable, "-m", "attngen", "bench", str(spec), "--shapes", "1x4x512x64", "--reps", "5",
                          "--dtype", "fp16", "--backends", "flash,cudnn", "--json", str(out)],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["call"] == "backward" and report["gpu"] == torch.cuda.get_device_name()
    assert [(r["case"]["seqlen"], r["case"]["causal"], r["case"]["call"]) for r in report["results"]] == [
        (512, False, "backward"), (512, True, "backward")]
    # The file is a family: its base cell and the members that run these inputs (no score variant)
    # are timed, each beside SDPA's backends.
    for r in report["results"]:
        timings = {t["impl"]: t for t in r["timings"]}
        ours_names = {name for name in timings if not name.startswith("sdpa:")}
        assert {"h100_bwd_d64", "sdpa:flash", "sdpa:cudnn"} <= set(timings)
        assert all(name.startswith("h100_bwd_d64") for name in ours_names), ours_names
        for name in ours_names:
            ours = timings[name]
            assert ours["status"] == "ok", ours
            assert ours["median_us"] > 0 and ours["back_to_back_us"] > 0 and ours["eager_us"] > 0 and ours["tflops"] > 0
            assert "max err" in ours["note"]
        assert all(t["status"] in ("ok", "unsupported") for t in timings.values())
        assert "h100_bwd_d64" in run.stdout and r["label"] in run.stdout
    entries = bench_entries([("bwd.json", report)])
    # Each mask's entry names the member that won it (the base cell or a sibling of its family).
    assert {("backward", "none"), ("backward", "causal")} <= {(e.call, e.mask) for e in entries}
    assert all(e.call == "backward" and e.spec.startswith("h100_bwd_d64") for e in entries)


def test_repeated_backward_calls_take_the_prepared_path():
    """A second call of one shape goes through the prepared call (its Params laid out once) and
    gives what the full path gives on the same tensors; a misaligned pointer still takes the full
    path, which refuses it."""
    import torch
    bwd = attngen.load(ROOT / "specs" / "lab" / "h100_bwd_d64.yaml", synchronize=True)
    gen = torch.Generator(device="cuda").manual_seed(31)

    def inputs():
        q, k, v, do = (torch.randn(2, 4, 300, 64, generator=gen, device="cuda").half() for _ in range(4))
        o, lse = attngen.attention(q, k, v, causal=True, return_lse=True)
        return q, k, v, o, lse, do
    bwd._prepared.clear()
    bwd(*inputs(), causal=True, deterministic=True)
    assert len(bwd._prepared) == 1
    args = inputs()
    fast = bwd(*args, causal=True, deterministic=True)
    full = bwd(*args, causal=True, deterministic=True, dq=torch.empty_like(args[0]), dk=torch.empty_like(args[1]),
               dv=torch.empty_like(args[2]))
    assert len(bwd._prepared) == 1 and all(torch.equal(a, b) for a, b in zip(fast, full))
    q = args[0]
    shifted = torch.empty(q.numel() + 8, device="cuda", dtype=q.dtype)[1:1 + q.numel()].view(q.shape)
    shifted.copy_(q)
    with pytest.raises(ValueError, match="16-byte"):
        bwd(shifted, *args[1:], causal=True, deterministic=True)


@pytest.mark.parametrize("d", [64, 224])
def test_training_steps_take_the_prepared_step(d):
    """attngen.attention's eager training call, step after step on one shape (GQA 8/2, causal): from the
    second step its forward and backward run their prepared calls (d64; d224 is padded to d256, whose
    kernels see padded copies, so it takes the full calls every step). Every step's gradients are within the rule
    of SDPA's fp32 autograd: the prepared steps', a dout in other strides (a slice of a wider tensor)
    and an expanded one (a sum's gradient), which take the full backward. Deterministic steps repeat
    the first one's gradients bit for bit."""
    import torch
    from attngen.ops import library
    gen = torch.Generator(device="cuda").manual_seed(32)
    q, k, v = (torch.randn(s, generator=gen, device="cuda").half().requires_grad_() for s in
               ((2, 8, 300, d), (2, 2, 300, d), (2, 2, 300, d)))
    wide = torch.randn(2, 8, 300, 2 * d, generator=gen, device="cuda").half()

    def step(dout, deterministic=False):
        o = attngen.attention(q, k, v, causal=True, deterministic=deterministic)
        return torch.autograd.grad(o, (q, k, v), dout)

    def within_rule(got, dout):
        ref, low = sdpa_gradients(torch, q, k, v, dout.contiguous(), True)
        for name, g, want, base in zip(("dq", "dk", "dv"), got, ref, low):
            err = (g.float() - want).abs().max().item()
            bound = verify.error_bound((base - want).abs().max().item())
            assert err <= bound, f"{name}: {err:.3g} > {bound:.3g}"
    for dout in (wide[..., :d].contiguous(),) * 3 + (wide[..., :d], torch.ones(1, device="cuda").half().expand(q.shape)):
        within_rule(step(dout), dout)
    prepared = library._TRAIN[library.call_key(q, k, v, True, None, None, False, "bhsd")]
    assert (prepared.gradient_prepared is not None) == (prepared.forward_prepared is not None) == (d == 64)
    dout = wide[..., :d].contiguous()
    first = step(dout, deterministic=True)
    for _ in range(2):
        assert all(torch.equal(a, b) for a, b in zip(step(dout, deterministic=True), first))


def test_a_training_step_under_saved_tensor_hooks():
    """q, k and v as views of one fused QKV tensor (rows 3 x H x D apart): the first steps prepare both
    directions for those strides; a step under torch.autograd.graph.save_on_cpu() gets contiguous
    copies back in its backward, which the prepared call was not made for, and takes the full backward.
    Every step's gradients (of the fused tensor) are within the rule of SDPA's fp32 autograd."""
    import torch
    gen = torch.Generator(device="cuda").manual_seed(33)
    fused = torch.randn(2, 300, 3, 8, 64, generator=gen, device="cuda").half().requires_grad_()
    dout = torch.randn(2, 8, 300, 64, generator=gen, device="cuda").half()

    def step():
        q, k, v = fused.permute(2, 0, 3, 1, 4).unbind(0)     # (B, H, S, D) views, row stride 3 x 8 x 64
        o = attngen.attention(q, k, v, causal=True)
        return torch.autograd.grad(o, fused, dout)[0].permute(2, 0, 3, 1, 4).unbind(0)
    q, k, v = (t.detach().contiguous() for t in fused.permute(2, 0, 3, 1, 4).unbind(0))
    ref, low = sdpa_gradients(torch, q, k, v, dout, True)
    for hooks in (False, False, False, True, False):
        if hooks:
            with torch.autograd.graph.save_on_cpu():
                got = step()
        else:
            got = step()
        for name, g, want, base in zip(("dq", "dk", "dv"), got, ref, low):
            err = (g.float() - want).abs().max().item()
            bound = verify.error_bound((base - want).abs().max().item())
            assert err <= bound, f"{name} (saved-tensor hooks: {hooks}): {err:.3g} > {bound:.3g}"


def test_wgmma_varlen_backward_with_bad_offsets_stays_inside_and_reports():
    """The Hopper class's varlen backward (whole-block accumulator per sequence, the convert kernel's
    bisection) given decreasing cu_seqlens: it reads and writes inside its tensors, its gradients are
    finite, and the input error is recorded; the next call with good offsets is right again."""
    import torch
    from attngen.runtime import InputError
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("h100_bwd_d64_wgmma_varlen targets sm_90a")
    bwd = kernel(ROOT / "specs" / "h100_bwd_d64_wgmma_varlen.yaml")
    gen = torch.Generator(device="cuda").manual_seed(5)
    q, o, do = (torch.randn(70, 4, 64, generator=gen, device="cuda").half() for _ in range(3))
    lse = torch.full((4, 70), 20.0, device="cuda")   # every P small: finite gradients whatever rows pair up
    attngen.check_errors()
    bad = torch.tensor([0, 70, 50], dtype=torch.int32, device="cuda")
    grads = bwd.varlen(q, q, q, o, lse, do, bad, bad, max_seqlen_k=70)
    torch.cuda.synchronize()
    assert all(bool(torch.isfinite(g).all()) for g in grads)
    with pytest.raises(InputError, match="cu_seqlens offsets"):
        attngen.check_errors()
    good = torch.tensor([0, 50, 70], dtype=torch.int32, device="cuda")
    again = bwd.varlen(q, q, q, o, lse, do, good, good, max_seqlen_k=50)
    torch.cuda.synchronize()
    attngen.check_errors()                 # nothing recorded
    assert all(bool(torch.isfinite(g).all()) for g in again)


EXPR_SOFTCAP = ROOT / "specs" / "lab" / "h100_bwd_d128_expr_softcap.yaml"
EXPR_WINDOW = ROOT / "specs" / "lab" / "h100_bwd_d128_expr_window.yaml"


@pytest.mark.parametrize("path, old, new, what", [
    (EXPR_SOFTCAP, "slope *= expr_score_slope(", "slope *= 1.f + 0.f * expr_score_slope(",
     "the score expression's derivative left out of dS"),
    (EXPR_WINDOW, "        m_end = rows.y;", "        m_end = max(rows.y - kBlockM, rows.x);",
     "the walk under the mask expression one query block short"),
    (EXPR_WINDOW, "if (mods.hides(mods.row_base(q0 + col, key), 0)) x = -INFINITY;", "",
     "partial tiles not masked by the expression"),
])
def test_expression_backward_planted_bugs_are_rejected(path, old, new, what):
    """Each bug, planted in an expression spec's backward, fails the verifier's cases."""
    k = kernel(path)
    sources = list(k.sources)
    assert sources[0].count(old) >= 1, what
    broken = type(k).from_sources(k.plan, (sources[0].replace(old, new), *sources[1:]), label="planted",
                                 synchronize=True)
    results = verify.verify_kernel(broken, verify.QUICK_SUITE, spec_label="planted")
    assert any(not r.passed for r in results), what
    assert all(r.passed for r in verify.verify_kernel(k, verify.QUICK_SUITE, spec_label=k.name))


# -- head dims 32, 96 and 256, and window with softcap (Gemma 2) -------------------------------------------

def hopper(torch):
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the table serves these backward cells on sm_90 (H100, H200)")


def within_rule(what, got, ref, low):
    """Each gradient within the rule: 2x torch's own low-precision error against fp32, plus the floor
    and FlashAttention's rounding floor (as attngen verify judges gradients)."""
    import torch
    from attngen.eval.verify.backward import rounding_floor
    for name, mine, want, base in zip(("dq", "dk", "dv"), got, ref, low):
        assert bool(torch.isfinite(mine).all()), f"{what} {name}: NaN or inf"
        err = (mine.float() - want).abs().max().item()
        bound = verify.error_bound((base - want).abs().max().item()) + rounding_floor(torch, want, mine.dtype)
        assert err <= bound, f"{what} {name}: {err:.3g} > {bound:.3g}"


@pytest.mark.parametrize("causal", [False, True], ids=["none", "causal"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d", [32, 40, 80, 96, 160, 192, 256])
def test_head_dim_loss_backward_through_attention(d, dtype, causal):
    """loss.backward() through attngen.attention at head dims 32, 40, 80, 96, 160, 192 and 256 (the
    table's h100_bwd_d{32,40,80,96,160,192,256}_wgmma cells; d40's tiles padded to 48 columns): GQA,
    333 rows (tails of every query and key block), gradients within the rule of SDPA's fp32 autograd."""
    import torch
    hopper(torch)
    gen = torch.Generator(device="cuda").manual_seed(d)
    dt = getattr(torch, dtype)
    q, k, v, dout = (torch.randn(s, generator=gen, device="cuda").to(dt) for s in
                     ((2, 8, 333, d), (2, 2, 333, d), (2, 2, 333, d), (2, 8, 333, d)))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = attngen.attention(*leaves, causal=causal)
    o.backward(dout)
    ref, low = sdpa_gradients(torch, q, k, v, dout, causal)
    within_rule(f"d{d} {dtype}", [t.grad for t in leaves], ref, low)


@pytest.mark.parametrize("causal", [False, True], ids=["none", "causal"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d, dv", [(192, 128), (128, 64)], ids=["d192_v128", "d128_v64"])
def test_head_dim_v_loss_backward_through_attention(d, dv, dtype, causal):
    """V of its own head dim (DeepSeek MLA's prefill and training: q and k 192, v 128; and 128 / 64):
    loss.backward() through attngen.attention, the table's head_dim_v entries (forward and backward),
    GQA, 333 rows, dv shaped like v; gradients within the rule of SDPA's fp32 autograd."""
    import torch
    hopper(torch)
    gen = torch.Generator(device="cuda").manual_seed(d + dv)
    dt = getattr(torch, dtype)
    q, k, v, dout = (torch.randn(s, generator=gen, device="cuda").to(dt) for s in
                     ((2, 8, 333, d), (2, 2, 333, d), (2, 2, 333, dv), (2, 8, 333, dv)))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = attngen.attention(*leaves, causal=causal)
    assert o.shape == (2, 8, 333, dv)
    o.backward(dout)
    assert leaves[2].grad.shape == v.shape
    ref, low = sdpa_gradients(torch, q, k, v, dout, causal)
    within_rule(f"d{d} v{dv} {dtype}", [t.grad for t in leaves], ref, low)


@pytest.mark.parametrize("causal", [False, True], ids=["none", "causal"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d", [32, 96, 256])
def test_varlen_head_dim_loss_backward(d, dtype, causal):
    """loss.backward() through attngen.attention_varlen at head dims 32, 96 and 256 (the table's
    h100_bwd_d{32,96,256}_wgmma_varlen cells; d32's forward h100_wgmma_d32_varlen): GQA, Sq != Sk per
    sequence, empty sequences, bottom-right causal; each sequence within the rule of its reference."""
    import torch
    from attngen.eval.verify import Variant
    hopper(torch)
    gen = torch.Generator(device="cuda").manual_seed(d)
    (q, k, v), (cu_q, cu_k), dout = varlen_leaves(torch, gen, dtype, d)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = attngen.attention_varlen(*leaves, cu_q, cu_k, max(VARLEN_LENGTHS[0]), max(VARLEN_LENGTHS[1]), causal=causal,
                                 alignment="bottom_right" if causal else None)
    o.backward(dout)
    case = VarlenCase(4, 2, *VARLEN_LENGTHS)
    variant = Variant("causal", "bottom_right") if causal else Variant("none")
    ref, low = varlen_gradients(torch, q, k, v, dout, case, variant, d ** -0.5)
    assert (o.float() - ref[0]).abs().max().item() < 2e-2
    within_rule(f"varlen d{d} {dtype}", [t.grad for t in leaves], [r.float() for r in ref[2:]],
                [b.float() for b in low[2:]])


VARIANT_CELLS = [   # (head dim, causal, attention() keywords): window with softcap at d64, d128 and d256 (a
    # left window that bounds the rows, 600 of them, and Gemma 2's own 4096), d256's softcap and window
    *((d, True, {"window": w, "softcap": 50.0}) for d in (64, 128, 256) for w in ((128, 0), (4096, 0))),
    (256, False, {"softcap": 30.0}), (256, True, {"softcap": 50.0}), (256, False, {"window": (100, 30)}),
]


def cell_id(cell) -> str:
    d, causal, keywords = cell
    parts = [f"window{w[0]}_{w[1]}" if name == "window" else f"{name}{w:g}" for name, w in keywords.items()]
    return f"d{d}_" + ("causal_" if causal else "") + "_".join(parts)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("cell", VARIANT_CELLS, ids=[cell_id(c) for c in VARIANT_CELLS])
def test_variant_backward_cells(cell, dtype):
    """The backward of the new variant cells (window with softcap: Gemma 2's local layers at d256, 16/8
    heads in the model, scale 1/16; d256 softcap and window) through the op attention_variant_backward
    and the table's backward specs, on the fp32 reference's output and LSE (the forward of some of
    these cells is not in the table): within the rule of torch's autograd through verify's reference
    attention."""
    import torch
    from attngen.core.variants import SCORES
    from attngen.ops import library   # noqa: F401  (defines the torch ops)
    hopper(torch)
    d, causal, keywords = cell
    gen = torch.Generator(device="cuda").manual_seed(59 + d)
    dt = getattr(torch, dtype)
    q, k, v, dout = (torch.randn(s, generator=gen, device="cuda").to(dt) for s in
                     ((2, 4, 600, d), (2, 2, 600, d), (2, 2, 600, d), (2, 4, 600, d)))
    window, softcap = keywords.get("window"), keywords.get("softcap")
    mask = "window" if window is not None else "causal" if causal else "none"
    if window is not None and causal:
        window = (window[0], 0)
    with verify.exact_fp32_matmul(torch):
        o32, lse = verify.attention_torch(*(t.float() for t in (q, k, v)), scale=d ** -0.5, mask=mask,
                                          alignment=None if mask == "none" else "top_left", window=window,
                                          modifiers=((SCORES["softcap"], softcap),) if softcap else ())
    grads = torch.ops.attngen.attention_variant_backward(
        dout, q, k, v, o32.to(dt), lse.float().contiguous(), causal, None, None, "bhsd",
        None if window is None else list(keywords["window"]), softcap, None)
    ref, low = variant_reference_gradients(torch, q, k, v, dout, causal, keywords, None)
    within_rule(f"{cell_id(cell)} {dtype}", grads[:3], ref, low)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("layer", ["global", "local"])
def test_gemma2_layer_trains_through_attention(layer, dtype):
    """A Gemma 2 layer (d256, 16/8 heads, scale 1/16, softcap 50; global: causal, local: a causal
    window) trains through attngen.attention: gradients within the rule. The forward of these cells
    is its own table entry: skipped, with the reason, where the table has none yet."""
    import torch
    hopper(torch)
    gen = torch.Generator(device="cuda").manual_seed(2)
    dt = getattr(torch, dtype)
    q, k, v, dout = (torch.randn(s, generator=gen, device="cuda").to(dt) for s in
                     ((1, 16, 520, 256), (1, 8, 520, 256), (1, 8, 520, 256), (1, 16, 520, 256)))
    keywords = {"softcap": 50.0} | ({"window": (128, 0)} if layer == "local" else {})
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    try:
        o = attngen.attention(*leaves, causal=True, scale=1 / 16, **keywords)
    except LookupError as exc:     # the forward's table miss (a backward miss is NotImplementedError)
        pytest.skip(f"no forward for {keywords} at d256 in the table yet: {exc}")
    o.backward(dout)
    ref, low = variant_reference_gradients(torch, q, k, v, dout, True, keywords, None)
    within_rule(f"gemma2 {layer}", [t.grad for t in leaves], ref, low)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gemma3_local_layer_trains_through_attention(dtype):
    """A Gemma 3 12B local layer (d256, 16/8 heads, scale 1/16, a causal window and no softcap) trains
    through attngen.attention: the table's forward window spec at d256, then its backward; output and
    gradients within the rule."""
    import torch
    hopper(torch)
    gen = torch.Generator(device="cuda").manual_seed(3)
    dt = getattr(torch, dtype)
    q, k, v, dout = (torch.randn(s, generator=gen, device="cuda").to(dt) for s in
                     ((1, 16, 520, 256), (1, 8, 520, 256), (1, 8, 520, 256), (1, 16, 520, 256)))
    keywords = {"window": (128, 0)}
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = attngen.attention(*leaves, causal=True, scale=1 / 16, **keywords)
    o.backward(dout)
    ref, low = variant_reference_gradients(torch, q, k, v, dout, True, keywords, None)
    within_rule("gemma3 local", [t.grad for t in leaves], ref, low)
