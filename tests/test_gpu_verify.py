"""GPU tests: every spec verifies, the runtime refuses bad inputs, and the verifier rejects kernels
with planted bugs. Skipped with a reason where there is no GPU, torch, CUDA driver or nvcc."""
from __future__ import annotations

import functools
import math
from pathlib import Path

import pytest

import attngen
from attngen.eval import verify
from attngen.eval.verify.merge import merge_cases
from attngen.eval.verify.varlen import QUICK_CASES as QUICK_VARLEN
from spec_sample import SPEC_PATHS, spec_text

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
SPECS = SPEC_PATHS
PHASE4 = ROOT / "specs" / "phase4.yaml"
MMA_SPEC = ROOT / "specs" / "h100_mma_d64.yaml"
WINDOW_SPEC = ROOT / "specs" / "h100_mma_d64_window.yaml"
WGMMA_WINDOW_SPEC = ROOT / "specs" / "h100_wgmma_d64_window.yaml"
ALIBI_SPEC = ROOT / "specs" / "h100_mma_d128_alibi.yaml"
SOFTCAP_SPEC = ROOT / "specs" / "h100_wgmma_d128_softcap.yaml"
EXPR_PREFIX_SPEC = ROOT / "specs" / "h100_wgmma_d128_expr_prefix_lm.yaml"
EXPR_WINDOW_SPEC = ROOT / "specs" / "lab" / "h100_mma_d128_expr_window.yaml"
EXPR_SOFTCAP_SPEC = ROOT / "specs" / "lab" / "h100_mma_d128_expr_softcap.yaml"


def failures(results) -> str:
    return "\n".join(f"{r.spec} {r.variant} {r.shape.label} {r.shape.layout}: {'; '.join(r.problems)}"
                     for r in results if not r.passed)


# Function-scoped fixtures, so that the conftest's gpu skip (an autouse function fixture) runs
# before them; the kernel itself is loaded once.
@pytest.fixture
def torch():
    import torch
    return torch


@functools.lru_cache(maxsize=None)
def load_once(path: Path):
    return attngen.load(path, synchronize=True)


@pytest.fixture
def phase4():
    return load_once(PHASE4)


def randn(torch, *shape, dtype=None):
    return torch.randn(*shape, device="cuda", dtype=dtype or torch.float16)


# -- every spec ----------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", SPECS, ids=[p.stem for p in SPECS])
def test_spec_passes_quick_suite(spec):
    kernel = attngen.load(spec, synchronize=True)
    results = verify.verify_kernel(kernel, verify.QUICK_SUITE, spec_label=kernel.name)
    if kernel.convention == "decode":   # a decode kernel brings its own cases (masks bottom-right)
        names = {"none": "none", "causal": "causal:bottom_right", "expr": "expr"}
        windows = {r.variant for r in results if r.variant.startswith("window(")}
        assert results and {r.variant for r in results} - windows == {names[m] for m in kernel.masks if m in names}
        assert bool(windows) == ("window" in kernel.masks)
    elif kernel.convention == "merge":  # a merge kernel brings its own cases (parts, layouts, NaN rows)
        assert results and {r.variant for r in results} <= {c.variant for c in merge_cases()}
    else:
        # a backward spec repeats cases in deterministic mode (where key blocks take turns; every
        # varlen case): the same variants again
        twice = [r for r in results if r.variant.endswith(" deterministic")]
        assert bool(twice) == (kernel.convention == "backward")
        results_once = [r for r in results if r not in twice]
        assert {r.variant[:-len(" deterministic")] for r in twice} <= {r.variant for r in results_once}
        padded = [r for r in results_once if not r.variant.endswith(" varlen")]
        variants = verify.variants(kernel.masks, kernel.plan.block_n)
        # a varlen: only spec has no padded function to run
        padded_variants = variants if kernel.plan.spec.padded else ()
        assert len(padded) == len(padded_variants) * len(verify.kernel_shapes(kernel.plan, verify.QUICK_SUITE))
        # causal runs in both alignments, a window over its windows; a varlen spec adds its varlen
        # cases in each
        expected = {v.label for v in variants}
        assert {r.variant for r in padded} == {v.label for v in padded_variants}
        if "causal" in kernel.masks:
            assert {"causal:top_left", "causal:bottom_right"} <= expected
        if "window" in kernel.masks:     # seven windows, beside the spec's other masks' variants
            assert sum(label.startswith("window(") for label in expected) == 7
        assert len(results_once) - len(padded) == (len(variants) * QUICK_VARLEN if kernel.varlen_masks else 0)
    assert all(r.passed for r in results), failures(results)


def test_reference_matches_sdpa(torch):
    """The verifier's own reference: top-left causal and GQA as torch SDPA defines them."""
    import torch.nn.functional as F
    q, k, v = randn(torch, 2, 8, 77, 64).float(), randn(torch, 2, 2, 130, 64).float(), randn(torch, 2, 2, 130, 64).float()
    for causal in (False, True):
        ours, _ = verify.attention_torch(q, k, v, causal=causal, scale=0.125)
        with verify.exact_fp32_matmul(torch):
            theirs = F.scaled_dot_product_attention(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1),
                                                    is_causal=causal, scale=0.125)
        assert (ours - theirs).abs().max().item() < 1e-4


def test_bottom_right_reference_matches_torch_lower_right(torch):
    """Bottom-right causal as torch defines it independently (torch.nn.attention.bias.causal_lower_right),
    with seqlen_q < seqlen_k and seqlen_q > seqlen_k (rows that see no key: zeros, LSE -inf)."""
    import torch.nn.functional as F
    from torch.nn.attention.bias import causal_lower_right
    for sq, sk in ((77, 130), (130, 77)):
        q, k, v = (randn(torch, 2, 4, s, 64).float() for s in (sq, sk, sk))
        ours, lse = verify.attention_torch(q, k, v, mask="causal", alignment="bottom_right", scale=0.125)
        mask = causal_lower_right(sq, sk)._materialize(q.device)
        with verify.exact_fp32_matmul(torch):
            theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.125)
        seen = mask.any(dim=-1)
        assert (ours[..., seen, :] - theirs[..., seen, :]).abs().max().item() < 1e-4
        assert (ours[..., ~seen, :] == 0).all() and torch.isneginf(lse[..., ~seen]).all()
        assert bool((~seen).any()) == (sq > sk)


def test_bottom_right_kernel_rows_without_keys(torch, phase4):
    """Sq > Sk, bottom-right: the first Sq - Sk rows see no key (zeros, LSE -inf); with Sq == Sk
    both alignments are the same mask."""
    q, k, v = randn(torch, 1, 2, 300, 64), randn(torch, 1, 2, 200, 64), randn(torch, 1, 2, 200, 64)
    o, lse = phase4(q, k, v, causal=True, alignment="bottom_right", return_lse=True)
    assert (o[:, :, :100] == 0).all() and torch.isneginf(lse[:, :, :100]).all()
    assert torch.isfinite(lse[:, :, 100:]).all()
    q2 = randn(torch, 1, 2, 200, 64)
    assert torch.equal(phase4(q2, k, v, causal=True, alignment="bottom_right"), phase4(q2, k, v, causal=True))
    with pytest.raises(ValueError, match="alignment"):
        phase4(q2, k, v, causal=True, alignment="diagonal")


# -- the runtime API -----------------------------------------------------------------------------

def test_bshd_layout_gives_the_same_result(torch, phase4):
    q, k, v = randn(torch, 2, 4, 113, 64), randn(torch, 2, 2, 300, 64), randn(torch, 2, 2, 300, 64)
    for causal in (False, True):
        o_bhsd = phase4(q, k, v, causal=causal)
        q_s, k_s, v_s = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        o_bshd = phase4(q_s, k_s, v_s, causal=causal, layout="bshd")
        assert o_bshd.shape == q_s.shape
        assert torch.equal(o_bshd.transpose(1, 2), o_bhsd)


def test_lse_matches_logsumexp(torch, phase4):
    q, k, v = randn(torch, 1, 3, 200, 64), randn(torch, 1, 3, 150, 64), randn(torch, 1, 3, 150, 64)
    scale = 0.2
    for causal in (False, True):
        o, lse = phase4(q, k, v, causal=causal, scale=scale, return_lse=True)
        assert lse.shape == (1, 3, 200) and lse.dtype == torch.float32 and lse.is_contiguous()
        scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
        if causal:
            scores = scores.masked_fill(~torch.ones(200, 150, dtype=torch.bool, device="cuda").tril(), -math.inf)
        ref = torch.logsumexp(scores, dim=-1)
        assert ((lse - ref).abs() <= verify.LSE_ATOL + verify.LSE_RTOL * ref.abs()).all()


def test_output_takes_q_layout_and_default_scale(torch, phase4):
    q, k, v = randn(torch, 2, 50, 4, 64), randn(torch, 2, 70, 4, 64), randn(torch, 2, 70, 4, 64)
    o = phase4(q, k, v, layout="bshd")
    assert o.shape == q.shape and o.stride() == q.stride() and o.dtype == q.dtype
    explicit = phase4(q, k, v, layout="bshd", scale=1 / 8)
    assert torch.equal(o, explicit)


def test_launch_on_a_side_stream(torch, phase4):
    q, k, v = randn(torch, 1, 4, 257, 64), randn(torch, 1, 4, 257, 64), randn(torch, 1, 4, 257, 64)
    expected = phase4(q, k, v, causal=True)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        o = phase4(q, k, v, causal=True)
        o2 = o * 1          # queued on the side stream after the kernel
    torch.cuda.current_stream().wait_stream(stream)
    assert torch.equal(o, expected) and torch.equal(o2, expected)


# Persistent walks with more query blocks than SMs: causal calls then take a head's query blocks in
# units (longest with shortest); 1-8 query blocks per head of 128 rows, 1-6 of 192 (the middle block
# of an odd count comes last; with schedule.middle_pairs, two heads' middle blocks share a unit, and of an
# odd count of heads the last middle block goes alone; with epilogue_tile: own_in_turns the two warpgroups pass O's
# tile at every item, full masks too), seqlen_q above seqlen_k (bottom-right: the first
# query blocks see no key) and below, GQA; and blocks of 64 rows with one consumer warpgroup.
PERSISTENT_SPECS = [ROOT / "specs" / f"h100_wgmma_{name}.yaml"
                    for name in ("d128_persistent_q2", "d64_persistent_q2", "d64_persistent_q2_c3", "d64_n128c1ps3opb",
                                 "d128_persistent_q2_pm", "d192_persistent_pm",
                                 "d256_persistent_n64_pm", "d192_persistent_n96_pm_ot", "d256_persistent_n64_ot",
                                 "d96_persistent_q2", "d192_v128_persistent_pm_ot",
                                 "d128_persistent_q2_sf", "d128_persistent_q2_pm_sf", "d192_persistent_n96_pm_ot_sf",
                                 "d256_persistent_n64_pm_ot_sf", "d192_persistent_n64s3_pm_ot",
                                 "d256_persistent_n64_pm_la_ot_sf", "d192_persistent_n96_pm_la_ot", "d192_persistent_n64s3_pm_la_ot")]
PERSISTENT_WALKS = (verify.Shape(2, 48, 16, 1024, 1024), verify.Shape(3, 40, 40, 300, 300, "bshd"),
                    verify.Shape(1, 96, 24, 640, 400), verify.Shape(2, 70, 70, 333, 900, "bshd"),
                    verify.Shape(2, 80, 80, 100, 100), verify.Shape(1, 160, 40, 256, 200, "bshd"),
                    verify.Shape(1, 64, 64, 576, 576), verify.Shape(1, 32, 8, 960, 1000, "bshd"),
                    verify.Shape(3, 15, 5, 576, 576), verify.Shape(3, 25, 5, 384, 384, "bshd"))


@pytest.mark.parametrize("spec", PERSISTENT_SPECS, ids=[p.stem for p in PERSISTENT_SPECS])
def test_persistent_walks_cover_every_query_block(torch, spec):
    kernel = load_once(spec)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for shape in PERSISTENT_WALKS:   # every shape has more query blocks than this GPU has SMs
        assert -(-shape.seqlen_q // kernel.plan.block_m) * shape.heads * shape.batch > sms, shape
    results = verify.verify_kernel(kernel, PERSISTENT_WALKS, spec_label=kernel.name)
    cases = len(verify.kernel_cases(kernel, PERSISTENT_WALKS, kernel.masks))
    assert cases >= len(PERSISTENT_WALKS) and len(results) == cases and all(r.passed for r in results), failures(results)


def _bad_inputs(torch):
    good = lambda *s: randn(torch, *s)  # noqa: E731
    q, k, v = good(1, 4, 32, 64), good(1, 2, 48, 64), good(1, 2, 48, 64)
    strided_last = randn(torch, 1, 4, 32, 128)[..., ::2]
    misaligned = randn(torch, 1 * 4 * 32 * 64 + 1).narrow(0, 1, 4 * 32 * 64).view(1, 4, 32, 64)
    return {
        "cpu tensor": ((q.cpu(), k, v), {}, ValueError),
        "wrong dtype": ((q.to(torch.bfloat16), k, v), {}, TypeError),
        "fp32": ((q.float(), k, v), {}, TypeError),
        "wrong head_dim": ((good(1, 4, 32, 128), good(1, 2, 48, 128), good(1, 2, 48, 128)), {}, ValueError),
        "heads not a multiple of kv_heads": ((good(1, 3, 32, 64), k, v), {}, ValueError),
        "k and v differ": ((q, k, good(1, 2, 40, 64)), {}, ValueError),
        "batch differs": ((good(2, 4, 32, 64), k, v), {}, ValueError),
        "3-D": ((q[0], k[0], v[0]), {}, ValueError),
        "non-contiguous last dim": ((strided_last, k, v), {}, ValueError),
        "misaligned pointer": ((misaligned, k, v), {}, ValueError),
        "no query heads": ((good(1, 0, 32, 64), k, v), {}, ValueError),
        "not a tensor": ((q.tolist(), k, v), {}, TypeError),
        "negative scale": ((q, k, v), {"scale": -1.0}, ValueError),
        "nan scale": ((q, k, v), {"scale": float("nan")}, ValueError),
        "unknown layout": ((q, k, v), {"layout": "sbhd"}, ValueError),
        "wrong out shape": ((q, k, v), {"out": good(1, 4, 31, 64)}, ValueError),
        "wrong lse_out": ((q, k, v), {"lse_out": torch.empty(1, 4, 32, device="cuda")[..., :16]}, ValueError),
    }


@pytest.mark.parametrize("case", ["cpu tensor", "wrong dtype", "fp32", "wrong head_dim",
                                  "heads not a multiple of kv_heads", "k and v differ", "batch differs", "3-D",
                                  "non-contiguous last dim", "misaligned pointer", "no query heads",
                                  "not a tensor", "negative scale", "nan scale",
                                  "unknown layout", "wrong out shape", "wrong lse_out"])
def test_bad_inputs_are_refused(torch, phase4, case):
    args, kwargs, error = _bad_inputs(torch)[case]
    with pytest.raises(error):
        phase4(*args, **kwargs)


def test_load_accepts_spec_and_plan_and_refuses_missing_causal(torch, phase4):
    from attngen.plan import make_plan
    spec = phase4.plan.spec.model_copy(update={"name": "phase4_noncausal", "masks": ["none"]})
    from_spec = attngen.load(spec)
    from_plan = attngen.load(make_plan(spec))
    assert from_spec.masks == ("none",)
    body = lambda src: src[src.index("#include"):]  # noqa: E731
    assert body(from_spec.source) == body(from_plan.source)
    # A path renders exactly the committed generated/ file.
    assert phase4.source == (ROOT / "generated" / "phase4.cu").read_text()
    q = randn(torch, 1, 2, 40, 64)
    assert torch.equal(from_spec(q, q, q), from_plan(q, q, q))
    with pytest.raises(ValueError, match="causal"):
        from_spec(q, q, q, causal=True)


# -- planted bugs: the verifier must reject them -------------------------------------------------

PLANTED = {
    # tail mask off by one: key == seqlen_k (a zero-filled row) takes part in the softmax
    "phase4-tail-off-by-one": (PHASE4, "if (n0 + lane + 32 * j >= end)", "if (n0 + lane + 32 * j > end)"),
    # the running output is not rescaled when a row's max grows
    "phase4-no-rescale": (PHASE4, "acc[r][c] *= alpha;", ";"),
    # the causal hook hides the diagonal too: row 0 sees no key
    "phase4-causal-diagonal": (PHASE4, "row + 1 + causal_offset", "row + causal_offset"),
    # key == key_end (past seqlen_k, or the first key above the diagonal) is not masked
    "mma-tail-off-by-one": (MMA_SPEC, "if (key >= end || (kHasLeftBound", "if (key > end || (kHasLeftBound"),
    # bottom-right with seqlen_q > seqlen_k: a negative offset is dropped, so the first rows see keys
    "mma-bottom-right-offset": (MMA_SPEC, "row + 1 + causal_offset", "row + 1 + max(causal_offset, 0)"),
    # tile skipping follows the block's first row instead of its last (kv_tile_count in mask.j2):
    # the mask bound is untouched, but later rows of a block never get the K/V tiles past the
    # first row's keys (top-left with block_m = block_n hides it; bottom-right offsets show it)
    "mma-tile-count-first-row": (MMA_SPEC, "const int end = tiles_up_to_row<kMask>(m0 + kBlockM - 1, p);",
                                 "const int end = tiles_up_to_row<kMask>(m0, p);"),
    # the window's left bound one key late: key i + lo is hidden
    "window-left-off-by-one": (WINDOW_SPEC, "return max(row + p.window_lo, 0);", "return max(row + p.window_lo + 1, 0);"),
    # blocks start one tile late: keys of the first visited tile are never seen
    "window-first-tile-late": (WINDOW_SPEC, "return key_begin<kMask>(first_row, p) / kBlockN;",
                               "return key_begin<kMask>(first_row, p) / kBlockN + 1;"),
    # the Hopper kind's TMA loads ignore the first tile: tile t of the block is read from tile t
    "wgmma-window-loads-from-zero": (WGMMA_WINDOW_SPEC, "load_kv<true>(smem_addr, maps.tma_v, c, at, ring + t, t0 + t);",
                                     "load_kv<true>(smem_addr, maps.tma_v, c, at, ring + t, t);"),
    # ALiBi's distance measured from the top-left corner instead of FlashAttention's bottom-right one
    "alibi-top-left": (ALIBI_SPEC, "alibi_offset = p.seqlen_k - p.seqlen_q;", "alibi_offset = 0;"),
    # softcap without the scale folded into its multiply
    "softcap-unscaled": (SOFTCAP_SPEC, "s = tanh_approx(s * softcap_premul);", "s = tanh_approx(s);"),
    # an expression mask is never applied: every tile counted as one of the full run
    "expr-mask-never-applied": (EXPR_PREFIX_SPEC, "return tile < 0 || tile >= tiles.full_count;", "return false;"),
    # the classification's span starts one tile late: the first visible tile is never loaded
    "expr-span-late": (EXPR_WINDOW_SPEC, "return {hi < 0 ? 0 : lo, hi < 0 ? 0 : hi - lo + 1,",
                       "return {hi < 0 ? 0 : lo + 1, hi < 0 ? 0 : hi - lo,"),
    # the score expression reads the raw score, not the scaled one
    "expr-score-unscaled": (EXPR_SOFTCAP_SPEC, "s = expr_score(e, s * scale, r.row, r.key0 + dk);",
                            "s = expr_score(e, s, r.row, r.key0 + dk);"),
}


@pytest.mark.parametrize("name", list(PLANTED))
def test_verifier_rejects_planted_bug(name):
    from attngen.render import render_for
    from attngen.runtime import kernel_class
    spec, old, new = PLANTED[name]
    plan, source, _ = render_for(spec)
    assert source.count(old) >= 1, f"the text to plant {name} into is gone from {spec.name}; update the test"
    bugged = source.replace(old, new)
    assert bugged != source
    kernel = kernel_class(plan).from_source(plan, bugged, label=name, synchronize=True)
    results = verify.verify_kernel(kernel, verify.QUICK_SUITE)
    rejected = [r for r in results if not r.passed]
    assert rejected, f"the verifier accepted {name}"
    assert any("exceeds" in p or "NaN" in p for r in rejected for p in r.problems)


# -- the command line ----------------------------------------------------------------------------

CLI_SPECS = {   # one spec of each kind and call convention
    "scalar": "phase4.yaml", "wmma": "phase5_wmma.yaml", "mma": "h100_mma_d64.yaml",
    "wgmma": "lab/h100_wgmma_d64.yaml", "decode": "h200_decode_d128_fused.yaml",
    "varlen": "h100_mma_d64_m128n64w4s2x3q.yaml", "fp8": "l4_mma_d64_fp8.yaml",
}


@pytest.mark.parametrize("what", sorted(CLI_SPECS))
def test_verify_command_line(what, tmp_path):
    """`attngen verify --quick SPEC --json FILE` exits 0 and prints one table row per case (the
    JSON lists the same cases), whatever the spec's kind and call convention."""
    import json
    import subprocess
    import sys
    spec = ROOT / "specs" / CLI_SPECS[what]
    if "wgmma" in what:
        import torch
        if torch.cuda.get_device_capability() != (9, 0):
            pytest.skip("the wgmma kind runs on sm_90 only")
    out = tmp_path / "verify.json"
    run = subprocess.run([sys.executable, "-m", "attngen", "verify", "--quick", str(spec), "--json", str(out)],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    data = json.loads(out.read_text())
    from attngen.core.spec_cells import spec_paths
    cells = {p.stem for p in spec_paths([spec])}    # a family file verifies each of its cells
    rows = [line for line in run.stdout.splitlines() if line.split(" ", 1)[0] in cells]
    assert data["failed"] == 0 and data["passed"] == len(data["cases"]) == len(rows) > 0
    if what == "varlen":
        assert any(c["shape"]["layout"] == "thd" for c in data["cases"])


def test_bench_command_line_per_convention(tmp_path):
    """`attngen bench` on a forward and a decode spec at once runs each convention's bench (one
    JSON report each, FILE-<convention>.json); --varlen runs the forward specs' varlen call and
    leaves the decode spec out."""
    import json
    import subprocess
    import sys
    forward, decode = ROOT / "specs" / CLI_SPECS["varlen"], ROOT / "specs" / "h200_decode_d64_contiguous.yaml"
    out = tmp_path / "bench.json"
    common = [sys.executable, "-m", "attngen", "bench", str(forward), str(decode), "--dtype", "fp16", "--reps", "3",
              "--backends", "flash"]
    run = subprocess.run(common + ["--shapes", "1x2x256x64", "--causal", "no", "--cells", "1x8/2x512x1",
                                   "--json", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    padded = json.loads((tmp_path / "bench-forward.json").read_text())
    cells = json.loads((tmp_path / "bench-decode.json").read_text())
    assert [t["impl"] for r in padded["results"] for t in r["timings"]] == [forward.stem, "sdpa:flash"]
    assert [(r["spec"], r["cell"]) for r in cells["rows"]] == [(decode.stem, "B1 8/2 Sk512 Sq1")]
    # each timed three ways: per call, back to back (GPU alone), eager
    assert all(t[key] > 0 for r in padded["results"] for t in r["timings"]
               for key in ("median_us", "back_to_back_us", "eager_us"))
    assert all(cells["rows"][0][f"{who}_{key}"] > 0 for who in ("attngen", "flash") for key in ("us", "b2b_us", "eager_us"))
    run = subprocess.run(common + ["--varlen", "--lengths", "7,300", "--heads", "4", "--causal", "yes"],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert forward.stem in run.stdout and decode.stem not in run.stdout


def test_mask_params_per_head_and_per_batch(tmp_path):
    """A mask that reads a per-head and a per-batch tensor param (each block loads its element; a
    varlen block its sequence's), padded and varlen, under the quick suite."""
    text = spec_text(ROOT / "specs" / "lab" / "h100_mma_d128_expr_window.yaml")
    text = text.replace("name: h100_mma_d128_expr_window", "name: t_expr_per_head")
    start = text.index("\nvariant:") + 1
    end = text.index("\ntarget:") + 1
    text = text[:start] + (
        'variant:\n  params: {left: "int[heads]", first: "int[batch]"}\n'
        '  mask: "kv_idx <= q_idx + causal_offset and q_idx + causal_offset - kv_idx <= left[h] and kv_idx >= first[b]"\n'
        '  verify: {left: [0, 300], first: [0, 200]}\n') + text[end:]
    path = tmp_path / "t_expr_per_head.yaml"
    path.write_text(text)
    kernel = attngen.load(path, synchronize=True)
    results = verify.verify_kernel(kernel, verify.QUICK_SUITE, spec_label="t_expr_per_head")
    assert any(r.variant.endswith(" varlen") for r in results)
    assert all(r.passed for r in results), failures(results)


def test_streaming_verify_reports_what_a_serial_run_reports(tmp_path, monkeypatch):
    """verify_streaming (the compile on a thread beside the workers, each spec handed out once built)
    gives the serial report, from an empty cubin cache, and hears of every spec and source."""
    import torch
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path / "cache"))
    names = ["h100_mma_d64.yaml", "h200_decode_d128_fused.yaml", "l4_bwd_d64.yaml", "phase4.yaml"]
    if torch.cuda.get_device_capability() == (9, 0):
        names.append("h100_bwd_d64_wgmma.yaml")
    paths = [ROOT / "specs" / n for n in names]
    shapes = verify.QUICK_SUITE
    loaded, compiled, heard = [], [], []
    streamed = verify.verify_streaming(paths, shapes, jobs=3, suite_name="quick", seed=3, on_case=heard.append,
                                       on_loaded=lambda k, n: loaded.append((k.name, n)),
                                       on_compiled=lambda done, total, hit: compiled.append((done, total, hit)))
    kernels = verify.load_kernels(paths, on_batch=lambda batch: None)
    serial = verify.verify_kernels(kernels, shapes, suite_name="quick", seed=3)

    def row(c):
        atomics = c.pycuda == "bitwise but atomics" or c.function.endswith("_dq") or "bwd" in c.spec
        return (c.spec, c.function, c.variant, c.shape.label, c.shape.layout, c.passed,
                c.problems == [], None if atomics else (c.max_err, c.lowprec_err, c.lse_err, c.pycuda))
    assert [row(c) for c in streamed.cases] == [row(c) for c in serial.cases]
    assert len(heard) == len(serial.cases) == sum(n for _, n in loaded) > 0
    assert sorted(name for name, _ in loaded) == sorted(k.name for k in kernels)
    assert compiled and compiled[-1][0] == compiled[-1][1]
    assert not any(hit for _, _, hit in compiled)      # the empty cache: every source was built here
    assert all(c.passed for c in streamed.cases)


def test_parallel_verify_reports_what_a_serial_run_reports():
    """verify_parallel (worker processes, each taking whole specs) gives the serial report: the same
    cases in the same order, each with the same errors, verdict and PyCUDA agreement."""
    import torch
    names = ["h100_mma_d64.yaml", "h200_decode_d128_fused.yaml", "l4_bwd_d64.yaml", "phase4.yaml"]
    if torch.cuda.get_device_capability() == (9, 0):
        names.append("h100_bwd_d64_wgmma.yaml")     # atomics: PyCUDA agreement under the error rule
    paths = [ROOT / "specs" / n for n in names]     # cells of family files are named by such paths
    kernels = verify.load_kernels(paths, on_batch=lambda batch: None)
    shapes = verify.QUICK_SUITE
    serial = verify.verify_kernels(kernels, shapes, suite_name="quick", seed=3)
    heard = []
    parallel = verify.verify_parallel(paths, kernels, shapes, jobs=2, suite_name="quick", seed=3, on_case=heard.append)

    def row(c):
        # An atomics-accumulated output (the backward's dq) differs in its last bits from run to run:
        # its errors and its PyCUDA verdict (bit for bit or within the rule) are not compared.
        atomics = c.pycuda == "bitwise but atomics" or c.function.endswith("_dq") or "bwd" in c.spec
        return (c.spec, c.function, c.variant, c.shape.label, c.shape.layout, c.passed,
                c.problems == [], None if atomics else (c.max_err, c.lowprec_err, c.lse_err, c.pycuda))
    assert len(heard) == len(parallel.cases) == len(serial.cases) > 0
    assert [row(c) for c in parallel.cases] == [row(c) for c in serial.cases]
    assert any(c.pycuda == "bitwise" for c in parallel.cases)


def test_parallel_verify_under_mps_reports_what_a_serial_run_reports():
    """Workers sharing the GPU through verify's private MPS daemon (this process, which already has a
    context, stays outside it) give the serial report; the daemon's folder is gone afterwards."""
    import glob
    import shutil
    import tempfile
    from attngen.eval.verify.mps import CONTROL, shared_gpu
    if shutil.which(CONTROL) is None:
        pytest.skip(f"no {CONTROL} on this machine")
    paths = [ROOT / "specs" / n for n in ("h100_mma_d64.yaml", "h200_decode_d128_fused.yaml")]
    kernels = verify.load_kernels(paths, on_batch=lambda batch: None)
    serial = verify.verify_kernels(kernels, verify.QUICK_SUITE, suite_name="quick", seed=5)
    with shared_gpu(True) as how:
        shared = verify.verify_parallel(paths, kernels, verify.QUICK_SUITE, jobs=2, suite_name="quick", seed=5)
    assert how.startswith("MPS"), how

    def row(c):
        return (c.spec, c.function, c.variant, c.shape.label, c.passed, c.max_err, c.lowprec_err, c.lse_err, c.pycuda)
    assert [row(c) for c in shared.cases] == [row(c) for c in serial.cases] and shared.ok
    assert not glob.glob(f"{tempfile.gettempdir()}/attngen-mps-*")


def test_verify_command_line_shares_the_gpu_through_mps(tmp_path):
    """`attngen verify -j 2` on two specs says how its workers shared the GPU: through MPS where the
    machine has nvidia-cuda-mps-control, time-sliced with --no-mps."""
    import shutil
    import subprocess
    import sys
    from attngen.eval.verify.mps import CONTROL
    specs = [str(ROOT / "specs" / n) for n in ("phase4.yaml", "h100_mma_d64.yaml")]
    for flag, words in (("--mps", "through MPS" if shutil.which(CONTROL) else "time-sliced (no"),
                        ("--no-mps", "time-sliced (--no-mps)")):
        run = subprocess.run([sys.executable, "-m", "attngen", "verify", "--quick", "-j", "2", flag, *specs],
                             capture_output=True, text=True, cwd=ROOT)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert f"2 worker processes sharing the GPU {words}" in run.stderr, run.stderr[-2000:]
