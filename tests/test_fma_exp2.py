"""softmax.fma_exp2: a share of the softmax's exponentials on the FMA pipes (templates/lib/softmax.j2, exp2_fma).

The arithmetic is checked here as the kernel does it, in float32 (numpy; the rounded-down add is exact in the range
the clamp leaves, so floor stands for it): the error against 2^x, the clamp's zeros, the exponent bits. Then what a
spec with the key renders and refuses, and in the SASS ptxas makes (where nvcc and cuobjdump are installed) that the
MUFU unit's exponentials go down by the share. No GPU."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest
import yaml

from attngen.compile import run_nvcc
from attngen.core.constants import EXP2_CUBIC
from attngen.errors import ToolError
from attngen.render import render_for
from test_softmax_block_sass import ROOT, cuda_tools, functions

MAGIC = np.float32(12582912.0)   # 1.5 * 2^23: ulp 1 from 2^23 to 2^24


def fma32(a, b, c):
    """float32 fma: the product is exact in float64 (24 + 24 bits), then one rounding to float64 and one to
    float32 (a double rounding the kernel's FFMA does not make; at most an ulp of float32 apart)."""
    return (np.float64(a) * np.float64(b) + np.float64(c)).astype(np.float32)


def exp2_fma(x: np.ndarray) -> np.ndarray:
    """exp2_fma as the kernel computes it."""
    x = np.asarray(x, np.float32)
    x = np.where(np.isnan(x), x, np.maximum(x, np.float32(-127.0)))   # max.NaN.f32: NaN stays NaN
    with np.errstate(invalid="ignore"):
        t = (MAGIC + np.floor(x)).astype(np.float32)      # __fadd_rd(x, MAGIC): exact from -127 up to 2^22
        ok = ~np.isnan(x)
        assert np.all((np.float64(x[ok]) + np.float64(MAGIC)) - np.float64(t[ok]) <= 1)   # x + MAGIC rounded down
        f = (x - (t - MAGIC)).astype(np.float32)   # in [0, 1], 1 where x is just below an integer (-1e-30: 1 - 1e-30)
        c1, c2, c3 = (np.float32(c) for c in EXP2_CUBIC)
        p = fma32(fma32(fma32(c3, f, c2), f, c1), f, np.float32(1.0))
    t_bits = np.where(np.isnan(t), np.float32(np.nan), t).view(np.uint32).astype(np.uint64)
    t_bits = np.where(np.isnan(t), 0x7FFFFFFF, t_bits)      # the GPU's NaN
    scale = (((t_bits << 23) + 0x3F800000) & 0xFFFFFFFF).astype(np.uint32).view(np.float32)
    with np.errstate(invalid="ignore"):
        return (p * scale).astype(np.float32)


def test_the_cubic_is_within_its_stated_error_where_softmax_calls_it():
    # Scores minus the row max, scaled (<= 0), and the e4m3 kernels' P kept 2^8 larger (<= 8); every float32 of
    # [-1, 1] near 0 too, where f is tiny and the cubic's terms vanish.
    x = np.concatenate([np.linspace(-126.0, 8.0, 2_000_003, dtype=np.float32),
                        np.arange(-1 << 16, 1 << 16, dtype=np.float32) / np.float32(1 << 16),
                        np.float32([-126.0, -0.0, 0.0, 1e-30, -1e-30, 7.999999, 8.0])])
    got, want = exp2_fma(x).astype(np.float64), np.exp2(x.astype(np.float64))
    rel = np.abs(got / want - 1)
    assert rel.max() < 8.6e-5, (x[rel.argmax()], rel.max())
    assert np.all(got > 0) and exp2_fma(np.float32([0.0]))[0] == 1.0   # p(0) = 1 exactly


def test_the_cubic_keeps_its_exponent_bits_at_127():
    f = np.linspace(0, 1, 100_001, dtype=np.float32)   # 1 included: x - floor(x) rounds to 1 for x just below 0
    c1, c2, c3 = (np.float32(c) for c in EXP2_CUBIC)
    p = fma32(fma32(fma32(c3, f, c2), f, c1), f, np.float32(1.0))
    assert np.all((p.view(np.uint32) >> 23) == 127)   # in [1, 2): adding n << 23 scales by 2^n


@pytest.mark.parametrize("x", [-np.inf, -1e30, -1000.0, -200.0, -127.0, -126.5, -126.0001, -126.0, -125.5])
def test_masked_and_vanishing_scores_give_zero(x):
    # -inf (a masked score) and anything below -127 clamp to -127; from there to -126, n is -127 and 2^n's bits
    # are 0: exactly 0 (as MUFU.EX2.FTZ gives 0 below 2^-126). From -126 up, a normal number.
    got = exp2_fma(np.float32([x]))[0]
    if x < -126:
        assert got == 0.0
    else:
        assert abs(got / 2.0 ** x - 1) < 8.6e-5


def test_a_nan_score_stays_nan():
    # The clamp keeps NaN, and 2^n's bits from a NaN t are a finite power of two: NaN * 0.5 is NaN, as MUFU gives.
    assert np.isnan(exp2_fma(np.float32([np.nan]))[0])


@pytest.mark.parametrize("share", [1, 2, 3, 4])
def test_the_share_is_spread_along_the_row(share):
    picked = [c for c in range(48) if (c * share) % 8 < share]
    assert len(picked) == 6 * share
    assert all(sum(1 for c in picked if 8 * b <= c < 8 * b + 8) == share for b in range(6))


def trial_spec(tmp_path, base: str, share: int):
    data = yaml.safe_load((ROOT / "specs" / f"{base}.yaml").read_text())
    data["name"] = f"{base}_fe{share}"
    data.setdefault("softmax", {})["fma_exp2"] = share
    path = tmp_path / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_spec_carries_exp2_fma_only_when_it_sets_the_key(tmp_path):
    plan, source, _ = render_for(ROOT / "specs" / "h100_wgmma_d128_fp8.yaml")
    assert plan.fragments.fma_exp2 == 0 and "exp2_fma" not in source
    plan, source, _ = render_for(trial_spec(tmp_path, "h100_wgmma_d128_fp8", 2))
    assert plan.fragments.fma_exp2 == 2
    assert source.count("exp2_fma(") == 2   # the function and its one call
    assert "if ((c * 2) % 8 < 2) x = exp2_fma(fmaf(x, scale_log2, p_shift));" in source
    assert "2 of every 8 exponentials on the FMA pipes" in source   # the provenance header's plan line


def mufu_exponentials(path, tmp_path) -> dict[str, int]:
    nvcc, cuobjdump = cuda_tools()
    _, source, _ = render_for(path)
    try:
        result = run_nvcc(source, "sm_90a", nvcc)
    except ToolError as exc:
        pytest.skip(f"nvcc could not build for sm_90a here: {exc}")
    cubin = tmp_path / f"{path.stem}.cubin"
    cubin.write_bytes(result.cubin)
    sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    assert all(not f.spills for f in result.functions), result.functions
    return {name.rsplit("_", 1)[-1]: sum("MUFU.EX2" in ins for ins in code) for name, code in functions(sass).items()}


@pytest.mark.parametrize("base", ["h100_wgmma_d128_fp8", "h100_wgmma_d64_n128c1ps3opb"])
def test_the_mufu_unit_takes_fewer_exponentials(base, tmp_path):
    if cuda_tools() is None:
        pytest.skip("needs nvcc and cuobjdump (the CUDA toolkit's bin/ on PATH)")
    before = mufu_exponentials(ROOT / "specs" / f"{base}.yaml", tmp_path)
    after = mufu_exponentials(trial_spec(tmp_path, base, 2), tmp_path)
    assert before.keys() == after.keys()
    for mask, count in before.items():
        # a quarter of a row's exponentials leave the MUFU unit in each copy of the loop ptxas keeps
        assert after[mask] < count and (count - after[mask]) % 8 == 0, (mask, count, after[mask])
