"""GPU tests of softmax.lazy_rescale (a row's max kept until a tile's passes it by the plan's slack): a committed
spec with the key passes every case the verifier runs, e4m3 and 16-bit; on keys whose scores rise along the
sequence (a row's max moves past the slack again and again) its output stays within the error rule (16-bit) or
within twice the committed kernel's error (e4m3), both against an fp32 reference; and the same checks catch a
kernel that never rescales, or an e4m3 slack that lets P pass 448. The same with softmax.kept_max_first (P at the
kept maxima first), whose planted fault keeps that P where a row of the warp moved."""
from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import pytest

from attngen.eval.verify import attention_torch, exact_fp32_matmul
from attngen.render import render_for
from test_gpu_fma_exp2 import assert_every_case_passes
from test_gpu_fp8 import needs_sm90a
from test_gpu_runtime import error_and_bound
from test_gpu_verify import load_once, torch  # noqa: F401 (torch: the fixture)
from test_lazy_rescale import lazy_trial

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
E4M3, SIXTEEN = "h100_wgmma_d128_fp8", "h100_wgmma_d64_persistent_q2"
E4M3_SEQUENTIAL = "h100_wgmma_d64_fp8_n128c3ps4r32x160pb"   # the sequential loop (no overlap), three consumer warpgroups
NO_RESCALE = ("alpha[1] != 1.f)) rescale_output(o, alpha);", "alpha[1] != 1.f)) {}")   # a planted fault


# softmax.kept_max_first planted: P at the kept max taken even where a row of the warp moved its max
ALWAYS_KEPT = ("if (!__all_sync(0xffffffffu, kept)) return false;", "if (!__all_sync(0xffffffffu, true)) return false;")
FIRST = [False, True]   # lazy_rescale alone, and with kept_max_first


@functools.lru_cache(maxsize=None)
def trial(base: str, kept_max_first: bool = False) -> Path:
    return lazy_trial(Path(tempfile.mkdtemp()), base, kept_max_first)


def planted(base: str, old: str, new: str, kept_max_first: bool = False):
    """The trial's kernel with `old` replaced by `new` in its source."""
    plan, source, _ = render_for(trial(base, kept_max_first))
    assert old in source
    return type(load_once(trial(base, kept_max_first))).from_source(plan, source.replace(old, new), label="planted")


@pytest.mark.parametrize("kept_max_first", FIRST, ids=["lazy", "kept_max_first"])
@pytest.mark.parametrize("base", [E4M3, SIXTEEN])
def test_a_spec_with_a_kept_max_passes_every_case(base, kept_max_first):
    needs_sm90a(ROOT / "specs" / f"{base}.yaml")
    kernel = load_once(trial(base, kept_max_first))
    assert kernel.plan.fragments.lazy_slack > 0 and kernel.plan.fragments.kept_max_first == kept_max_first
    assert_every_case_passes(kernel, 4000)


def rising(torch, d: int, trend: float, dtype, seqlen: int = 2048):
    """q, k, v (1, 2, seqlen, d) whose scores drift along the keys: key j's first column gains trend x j, each
    query's first column is 1 + N(0, 1). Counted on the CPU for 2048 keys, full mask: at d64 and trend 0.15 (fp16,
    128-key tiles, slack 8) a row's max moves past the slack 4.8 times after its first tile on average, in 79 % of
    the rows; at d128 and 0.05 (e4m3, 192-key tiles, slack 0.75) 5.4 times in 10 tiles, in 86 % of the rows; at
    d64 and 0.05 (e4m3, 128-key tiles) 8.9 times in 16 tiles, in 87 % of the rows. The other rows, whose first
    column is negative, fall."""
    g = torch.Generator(device="cuda").manual_seed(9)
    q, k, v = (torch.randn(1, 2, seqlen, d, generator=g, device="cuda") for _ in range(3))
    q[..., 0] += 1.0
    k[..., 0] += trend * torch.arange(seqlen, device="cuda")
    return q.to(dtype), k.to(dtype), v.to(dtype)


def error_and_bound_16bit(torch, kernel, causal: bool) -> tuple[float, float]:
    """The kernel's largest error against the fp32 reference on rising scores, and the error rule's bound."""
    q, k, v = rising(torch, 64, 0.15, torch.float16)
    return error_and_bound(torch, kernel(q, k, v, causal=causal), q, k, v, causal=causal)


def error_e4m3(torch, kernel, causal: bool, d: int = 128) -> float:
    """The kernel's largest error against the fp32 attention of the same e4m3 inputs, rising scores (head dim d)."""
    q, k, v = rising(torch, d, 0.05, torch.float32)
    q8, k8, v8 = (x.to(torch.float8_e4m3fn) for x in (q, k, v))
    with exact_fp32_matmul(torch):
        ref, _ = attention_torch(q8.float(), k8.float(), v8.float(), scale=d ** -0.5, causal=causal)
    out = kernel(q8, k8, v8.transpose(-1, -2).contiguous(), causal=causal)
    assert torch.isfinite(out).all()
    return (out.float() - ref).abs().max().item()


@pytest.mark.parametrize("kept_max_first", FIRST, ids=["lazy", "kept_max_first"])
@pytest.mark.parametrize("causal", [False, True])
def test_rising_maxima_16bit(torch, causal, kept_max_first):
    """kept_max_first: the warps whose rows move take the usual step; planted, a kernel that keeps P at the kept
    max there too fails as one that never rescales does."""
    needs_sm90a(ROOT / "specs" / f"{SIXTEEN}.yaml")
    err, bound = error_and_bound_16bit(torch, load_once(trial(SIXTEEN, kept_max_first)), causal)
    assert err <= bound, (err, bound)
    for fault in (NO_RESCALE, ALWAYS_KEPT) if kept_max_first else (NO_RESCALE,):
        err, bound = error_and_bound_16bit(torch, planted(SIXTEEN, *fault, kept_max_first), causal)
        assert not err <= bound, ("a planted kernel passed", fault, err, bound)   # NaN (fp16 P past 65504) fails too


@pytest.mark.parametrize("kept_max_first", FIRST, ids=["lazy", "kept_max_first"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("base", [E4M3, E4M3_SEQUENTIAL])
def test_rising_maxima_e4m3(torch, base, causal, kept_max_first):
    """P at up to 2^8.75 through e4m3 (its largest value 448): the kept max's error at most twice the committed
    kernel's, whose P reaches 2^8; a kernel that never rescales, one whose slack is 2 (P up to 2^10, clipped
    at 448) and, with kept_max_first, one that keeps P at the kept max where a row moved, fail the same test. The
    overlapped loop (d128) and the sequential one (d64, three consumer warpgroups)."""
    needs_sm90a(ROOT / "specs" / f"{base}.yaml")
    d = load_once(ROOT / "specs" / f"{base}.yaml").plan.head_dim
    limit = 2 * error_e4m3(torch, load_once(ROOT / "specs" / f"{base}.yaml"), causal, d) + 1e-3
    assert error_e4m3(torch, load_once(trial(base, kept_max_first)), causal, d) <= limit
    slack = load_once(trial(base, kept_max_first)).plan.fragments.lazy_slack
    wide = (f"scale_log2 <= {slack!r}f;", "scale_log2 <= 2.0f;")
    for fault in (NO_RESCALE, wide) + ((ALWAYS_KEPT,) if kept_max_first else ()):
        assert not error_e4m3(torch, planted(base, *fault, kept_max_first), causal, d) <= limit, fault
