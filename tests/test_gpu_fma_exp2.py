"""GPU tests of softmax.fma_exp2 (exponentials on the FMA pipes): a committed spec with the largest share (4 of 8)
passes the verifier's cases, e4m3 and 16-bit; a planted wrong coefficient of the cubic fails them (the verifier
sees the FMA path); a NaN score stays NaN through it, as through MUFU's exponential."""
from __future__ import annotations

import functools
from pathlib import Path

import pytest

from attngen.eval import verify
from attngen.eval.verify.forward import verify_cases as forward_cases
from attngen.eval.verify.forward_fp8 import check_fp8_case, verify_cases as fp8_cases
from attngen.render import render_for
from test_fma_exp2 import trial_spec
from test_gpu_fp8 import needs_sm90a
from test_gpu_verify import load_once

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
BASES = ("h100_wgmma_d128_fp8", "h100_wgmma_d64_persistent_q2")
SHARE = 4   # the most the key takes: every other exponential of a row


@functools.lru_cache(maxsize=None)
def trial(base: str) -> Path:
    """specs/BASE.yaml (its first dtype) with softmax.fma_exp2: SHARE, as a spec file of its own."""
    import tempfile
    return trial_spec(Path(tempfile.mkdtemp()), base, SHARE, first_dtype=True)


def assert_every_case_passes(kernel, first_seed: int):
    """Every case `attngen verify` runs on the kernel (the full suite), seeded from first_seed."""
    cases = (fp8_cases if kernel.plan.spec.dtype == "e4m3" else forward_cases)(kernel, verify.FULL_SUITE, kernel.masks)
    results = [check(first_seed + i, kernel.name) for i, (_v, _f, _c, _n, check) in enumerate(cases)]
    assert results and all(r.passed for r in results), "\n".join(
        f"{r.variant} {r.shape.label}: {'; '.join(r.problems)}" for r in results if not r.passed)


@pytest.mark.parametrize("base", BASES)
def test_a_spec_with_the_fma_share_passes_every_case(base):
    needs_sm90a(ROOT / "specs" / f"{base}.yaml")
    kernel = load_once(trial(base))
    assert kernel.plan.fragments.fma_exp2 == SHARE
    assert_every_case_passes(kernel, 3000)


@pytest.mark.parametrize("base", BASES)
def test_a_wrong_cubic_is_caught(base):
    needs_sm90a(ROOT / "specs" / f"{base}.yaml")
    from attngen.core.constants import EXP2_CUBIC
    from attngen.render import cpp
    plan, source, _ = render_for(trial(base))
    planted = source.replace(cpp(EXP2_CUBIC[0]), "0.62f")   # 2^f off by up to 4 %
    assert planted != source
    kernel = type(load_once(trial(base))).from_source(plan, planted, label="planted")
    shape = verify.Shape(1, 2, 2, 200, 200)
    if plan.spec.dtype == "e4m3":
        r = check_fp8_case(kernel, verify.Variant("none"), shape, 7, "planted")
    else:
        r = verify.check_case(kernel, verify.Variant("none"), shape, 7, spec_label="planted")
    assert not r.passed


def test_a_nan_score_on_the_fma_path_stays_nan():
    """With 4 of 8 a 16-bit kernel's even keys take exp2_fma (a thread's column c is key 8(c / 2) + 2(lane % 4)
    + c % 2, and c % 2 == 0 picks the FMA path): a NaN in key 0 makes every score of it NaN, and every row's
    output NaN, as torch's attention gives (a max that dropped NaN would give finite rows)."""
    import torch
    base = "h100_wgmma_d64_persistent_q2"
    needs_sm90a(ROOT / "specs" / f"{base}.yaml")
    kernel = load_once(trial(base))
    g = torch.Generator(device="cuda").manual_seed(5)
    q, k, v = (torch.randn(1, 2, 256, 64, generator=g, device="cuda", dtype=torch.float16) for _ in range(3))
    k[:, :, 0, 0] = float("nan")
    out = kernel(q, k, v)
    assert torch.isnan(out).all(dim=-1).all()
    k[:, :, 0, 0] = 0.0
    assert not torch.isnan(kernel(q, k, v)).any()
