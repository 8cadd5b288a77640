"""softmax.fma_exp2: a share of the softmax's exponentials on the FMA pipes (templates/lib/softmax.j2, exp2_fma).

The arithmetic is checked here as the kernel does it, each step rounded to float32 (the rounded-down add is exact in
the range the clamp leaves, so floor stands for it): the error against 2^x, the clamp's zeros, NaN, the exponent
bits. Then what a spec with the key renders and refuses, and in the SASS ptxas makes (where nvcc and cuobjdump are
installed) that the MUFU unit's exponentials go down by the share. No GPU, no numpy."""
from __future__ import annotations

import math
import struct
import subprocess
from pathlib import Path

import pytest
import yaml

from attngen.compile import run_nvcc
from attngen.core.constants import EXP2_CUBIC
from attngen.errors import ToolError
from attngen.render import render_for
from test_softmax_block_sass import ROOT, cuda_tools, functions

MAGIC = 12582912.0   # 1.5 * 2^23: ulp 1 from 2^23 to 2^24
GPU_NAN_BITS = 0x7FFFFFFF


def f32(x: float) -> float:
    """x rounded to float32."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def bits(x: float) -> int:
    return GPU_NAN_BITS if math.isnan(x) else struct.unpack("<I", struct.pack("<f", x))[0]


def from_bits(b: int) -> float:
    return struct.unpack("<f", struct.pack("<I", b & 0xFFFFFFFF))[0]


def fma32(a: float, b: float, c: float) -> float:
    """float32 fma: the product of two float32 is exact in a double (24 + 24 bits), then one rounding to double and
    one to float32 (a double rounding the kernel's FFMA does not make; at most an ulp of float32 apart)."""
    return f32(a * b + c)


C1, C2, C3 = (f32(c) for c in EXP2_CUBIC)
assert (C1, C2, C3) == EXP2_CUBIC   # each coefficient is a float32, as the kernel's literal reads back


def cubic(f: float) -> float:
    return fma32(fma32(fma32(C3, f, C2), f, C1), f, 1.0)


def exp2_fma(x: float) -> float:
    """exp2_fma as the kernel computes it, in float32."""
    x = f32(x)
    if not math.isnan(x):
        x = max(x, -127.0)                        # max.NaN.f32: NaN stays NaN
    if math.isnan(x):
        t, f = math.nan, math.nan
    else:
        t = MAGIC + math.floor(x)                 # __fadd_rd(x, MAGIC): exact from -127 up to 2^22
        assert f32(t) == t and 0 <= (x + MAGIC) - t <= 1
        f = f32(x - (t - MAGIC))                  # in [0, 1]: 1 where x is just below an integer (-1e-30)
    scale = from_bits((bits(t) << 23) + 0x3F800000)   # 2^n, or 0 for n = -127
    return f32(cubic(f) * scale)


def points(lo: float, hi: float, n: int) -> list[float]:
    return [f32(lo + (hi - lo) * i / (n - 1)) for i in range(n)]


def test_the_cubic_is_within_its_stated_error_where_softmax_calls_it():
    # Scores minus the row max, scaled (<= 0), and the e4m3 kernels' P kept 2^8 larger (<= 8); float32 near 0 too,
    # where f is tiny or just below 1; and the cubic's own extremes on [0, 1].
    xs = (points(-126.0, 8.0, 60_001) + [i / 4096 for i in range(-4096, 4097)]
          + [-126.0, -0.0, 0.0, 1e-30, -1e-30, 1e-40, 7.999999, 8.0] + points(-1.0, 0.0, 20_001))
    worst = max(xs, key=lambda x: abs(exp2_fma(x) / 2.0 ** f32(x) - 1))
    assert abs(exp2_fma(worst) / 2.0 ** f32(worst) - 1) < 8.6e-5, worst
    assert exp2_fma(0.0) == 1.0   # p(0) = 1 exactly
    assert all(exp2_fma(x) > 0 for x in xs)


def test_the_cubic_keeps_its_exponent_bits_at_127():
    # in [1, 2) on [0, 1] (1 included: x - floor(x) rounds to 1 for x just below 0), so that times 2^n is the
    # exponent moved by n
    assert all(bits(cubic(f)) >> 23 == 127 for f in points(0.0, 1.0, 20_001))


@pytest.mark.parametrize("x", [-math.inf, -1e30, -1000.0, -200.0, -127.0, -126.5, -126.0001, -126.0, -125.5])
def test_masked_and_vanishing_scores_give_zero(x):
    # -inf (a masked score) and anything below -127 clamp to -127; from there to -126, n is -127 and 2^n's bits
    # are 0: exactly 0 (as MUFU.EX2.FTZ gives 0 below 2^-126). From -126 up, a normal number.
    got = exp2_fma(x)
    if x < -126:
        assert got == 0.0
    else:
        assert abs(got / 2.0 ** x - 1) < 8.6e-5


def test_a_nan_score_stays_nan():
    # The clamp keeps NaN, and 2^n's bits from a NaN t are a finite power of two: NaN * 0.5 is NaN, as MUFU gives.
    assert from_bits((GPU_NAN_BITS << 23) + 0x3F800000) == 0.5
    assert math.isnan(exp2_fma(math.nan))


@pytest.mark.parametrize("share", [1, 2, 3, 4])
def test_the_share_is_spread_along_the_row(share):
    picked = [c for c in range(48) if (c * share) % 8 < share]
    assert len(picked) == 6 * share
    assert all(sum(1 for c in picked if 8 * b <= c < 8 * b + 8) == share for b in range(6))


def trial_spec(directory: Path, base: str, share: int, first_dtype: bool = False, *, softmax: dict | None = None,
               suffix: str | None = None) -> Path:
    """specs/BASE.yaml with softmax.fma_exp2: SHARE (or the `softmax` keys given, the name ending in `suffix`),
    written into DIRECTORY as a spec of its own; first_dtype: its first dtype alone, without dispatch cells (a
    kernel to load and verify)."""
    data = yaml.safe_load((ROOT / "specs" / f"{base}.yaml").read_text())
    if first_dtype:
        data.pop("cells", None)
        if "dtypes" in data:
            data["dtype"] = data.pop("dtypes")[0]
    data["name"] = f"{base}_{suffix or f'fe{share}'}"
    data.setdefault("softmax", {}).update(softmax or {"fma_exp2": share})
    path = directory / f"{data['name']}.yaml"
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
    assert 'asm("max.NaN.f32 %0, %0, 0fC2FE0000;"' in source   # the clamp keeps NaN (fmaxf would drop it)


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
    return {name.rsplit("_", 1)[-1]: (sum("MUFU.EX2" in ins for ins in code), sum("FMNMX.NAN" in ins for ins in code))
            for name, code in functions(sass).items()}


@pytest.mark.parametrize("base", ["h100_wgmma_d128_fp8", "h100_wgmma_d64_n128c1ps3opb"])
def test_the_mufu_unit_takes_fewer_exponentials(base, tmp_path):
    if cuda_tools() is None:
        pytest.skip("needs nvcc and cuobjdump (the CUDA toolkit's bin/ on PATH)")
    before = mufu_exponentials(ROOT / "specs" / f"{base}.yaml", tmp_path)
    after = mufu_exponentials(trial_spec(tmp_path, base, 2), tmp_path)
    assert before.keys() == after.keys()
    for mask, (count, clamps) in before.items():
        # a quarter of a row's exponentials leave the MUFU unit in each copy of the loop ptxas keeps, and each one
        # that leaves is an exp2_fma: one NaN-keeping clamp (FMNMX.NAN) apiece, none before
        moved = count - after[mask][0]
        assert clamps == 0 and moved > 0 and moved % 8 == 0 and after[mask][1] == moved, (mask, count, after[mask])
