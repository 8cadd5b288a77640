"""softmax.lazy_rescale (the forward wgmma kinds): a row keeps its max until a tile's passes it by the plan's
slack, and the output's multiplies run only in a warp where a row moved. Checked here without a GPU: the slack
the plan derives from P's type, the rule, the rendering, an emulation of the step in float32 against the exact
softmax, and the SASS (the multiplies behind a branch of their own at the tile's end)."""
from __future__ import annotations

import math
import random
import struct
import subprocess

import pytest

from attngen.compile import run_nvcc
from attngen.core.fp8 import E4M3_MAX, P_LOG2_OFFSET
from attngen.errors import ToolError
from attngen.render import render_for
from test_fma_exp2 import trial_spec
from test_softmax_block_sass import ROOT, cuda_tools, functions


def lazy_trial(directory, base: str, kept_max_first: bool = False):
    """specs/BASE.yaml (its first dtype) with softmax.lazy_rescale: true, as a spec file of its own; kept_max_first:
    and softmax.kept_max_first: true."""
    if kept_max_first:
        return trial_spec(directory, base, 0, first_dtype=True, softmax={"lazy_rescale": True, "kept_max_first": True},
                          suffix="km")
    return trial_spec(directory, base, 0, first_dtype=True, softmax={"lazy_rescale": True}, suffix="lz")


@pytest.mark.parametrize("base, slack", [("h100_wgmma_d128_fp8", 0.75), ("h100_wgmma_d64_persistent_q2", 8.0),
                                         ("h100_wgmma_d128_persistent_q2", 8.0)])
def test_the_slack_keeps_p_inside_its_type(tmp_path, base, slack):
    plan, source, _ = render_for(ROOT / "specs" / f"{base}.yaml")
    assert plan.fragments.lazy_slack == 0 and "rescale_output_where_moved" not in source
    plan, source, _ = render_for(lazy_trial(tmp_path, base))
    f = plan.fragments
    assert f.lazy_slack == slack
    if plan.spec.dtype == "e4m3":   # P <= 2^(8 + slack) stays below e4m3's largest value, by less than an eighth
        assert f.p_log2_offset == P_LOG2_OFFSET and 2 ** (f.p_log2_offset + slack) <= E4M3_MAX < 2 ** (
            f.p_log2_offset + slack + 0.125)
    assert f"return (m_tile - row_max) * scale_log2 <= {slack!r}f;" in source
    assert "const float m_new = keeps_max(m_tile, row_max, scale_log2) ? row_max : m_tile;" in source
    # the vote and its multiplies come after P's fragments, in both the overlapped loop and the sequential one
    assert source.count("p_fragments(pa, s);\n                    rescale_output_where_moved(o, alpha);") == 2
    assert "rescale_output(o, alpha);\n                    p_fragments(pa, s);" not in source
    assert "until a tile's passes it by" in source   # the provenance header's plan line


def test_other_kinds_refuse_the_key():
    from attngen.errors import SpecError
    from attngen.spec import load_spec
    import tempfile
    from pathlib import Path
    directory = Path(tempfile.mkdtemp())
    text = (ROOT / "specs" / "l4_mma_d64.yaml").read_text()
    path = directory / "l4_mma_d64.yaml"
    path.write_text(text.replace("\nsoftmax:\n", "\nsoftmax:\n  lazy_rescale: true\n") if "\nsoftmax:\n" in text
                    else text + "softmax:\n  lazy_rescale: true\n")
    with pytest.raises(SpecError) as e:
        load_spec(path)
    assert "softmax.lazy_rescale" in str(e.value) and "remove lazy_rescale" in str(e.value)


def f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def tile_growth(row_max, s, scale_log2):
    """(the tile's max with the row's, how far past the row's max it is in log2 units: NaN from -inf, as on the GPU)."""
    m_tile = max([row_max] + s)
    return m_tile, (m_tile - row_max) * scale_log2 if row_max != -math.inf else math.nan


def lazy_tile_step(state, s, t0, n, scale_log2, slack, offset):
    """The kernel's step on one tile `s` (keys t0.. of n) in float32, `state` = [row max, row sum, O for one value
    column] updated in place: the max (kept within the slack), P = 2^(s scale - m scale + offset), alpha, sum, O.
    Returns (alpha, P)."""
    row_max, row_sum, o = state
    m_tile, grow = tile_growth(row_max, s, scale_log2)
    m_new = row_max if (slack and grow <= slack) else m_tile
    m_scaled = f32((0.0 if m_new == -math.inf else m_new) * scale_log2)
    alpha = 1.0 if m_new == row_max else f32(2.0 ** (row_max * scale_log2 - m_scaled))
    p = [f32(2.0 ** f32(x * scale_log2 + (offset - m_scaled))) if x != -math.inf else 0.0 for x in s]
    state[:] = [m_new, f32(row_sum * alpha + f32(sum(p))), f32(o * alpha + sum(pi * (j + t0) / n for j, pi in enumerate(p)))]
    return alpha, p


def emulate_row(scores, tile, scale_log2, slack, offset):
    """lazy_tile_step over a row's tiles: returns (O / sum, LSE in log2 units, the largest P, how many tiles
    rescaled)."""
    state, top, moves = [-math.inf, 0.0, 0.0], 0.0, 0
    for t0 in range(0, len(scores), tile):
        alpha, p = lazy_tile_step(state, scores[t0:t0 + tile], t0, len(scores), scale_log2, slack, offset)
        moves += alpha != 1.0
        top = max([top] + p)
    row_max, row_sum, o = state
    return o / row_sum, row_max * scale_log2 + math.log2(row_sum) - offset, top, moves


@pytest.mark.parametrize("trend", [0.0, 0.05, -0.05])
def test_the_kept_max_gives_the_exact_softmax(trend):
    """Rows whose max rises along the keys (it moves often), falls, or neither, with masked keys at the start: the
    kept max gives the exact softmax's output and LSE to float32's rounding, with P inside 2^(offset + slack),
    and rescales fewer tiles than moving the max every tile does."""
    rng = random.Random(11)
    scale_log2 = f32(64 ** -0.5 * math.log2(math.e))
    for slack, offset in ((8.0, 0), (0.75, P_LOG2_OFFSET)):
        rescaled = rescaled_every = 0
        for _ in range(20):
            n = 192 * 12
            scores = [f32(rng.gauss(0, 4) + trend * j) for j in range(n)]
            scores[:300] = [-math.inf] * 300   # a causal row's first tiles hide every key
            ref_m = max(scores) * scale_log2
            ref_sum = sum(2.0 ** (x * scale_log2 - ref_m) for x in scores if x != -math.inf)
            ref_o = sum(2.0 ** (x * scale_log2 - ref_m) * j / n for j, x in enumerate(scores) if x != -math.inf) / ref_sum
            o, lse, top, moves = emulate_row(scores, 192, scale_log2, slack, offset)
            o_every, lse_every, _, moves_every = emulate_row(scores, 192, scale_log2, 0, offset)
            assert abs(o - ref_o) <= 1e-5 * abs(ref_o) and abs(lse - (ref_m + math.log2(ref_sum))) <= 1e-5
            assert top <= 2 ** (offset + slack)
            assert abs(o - o_every) <= 1e-5 * abs(ref_o)
            rescaled, rescaled_every = rescaled + moves, rescaled_every + moves_every
        # random rows (trend 0): about one rescale a row (its first tile with a key) against 3-4
        assert rescaled < rescaled_every if trend == 0 else rescaled <= rescaled_every


def test_the_multiplies_sit_behind_a_branch_of_their_own(tmp_path):
    """SASS (nvcc 13 + cuobjdump, sm_90a; skipped without them): in the e4m3 d128 cell a branch skips exactly
    the output's multiplies, a thread's 64 registers of O (64 rows x 128 columns over a warpgroup's 128 threads),
    and the committed spec has no such branch; no spills either way."""
    tools = cuda_tools()
    if tools is None:
        pytest.skip("nvcc and cuobjdump are needed to read the SASS")
    nvcc, cuobjdump = tools
    skipped = {}
    for name, path in (("as committed", ROOT / "specs" / "h100_wgmma_d128_fp8.yaml"),
                       ("lazy", lazy_trial(tmp_path, "h100_wgmma_d128_fp8"))):
        plan, source, _ = render_for(path)
        cubin = tmp_path / f"{plan.spec.name}.cubin"
        try:
            result = run_nvcc(source, "sm_90a", nvcc)
        except ToolError as e:
            pytest.skip(f"nvcc could not build for sm_90a here: {e}")
        assert all(not f.spills for f in result.functions), result.functions
        cubin.write_bytes(result.cubin)
        sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
        body = next(ins for fn, ins in functions(sass).items() if fn.endswith("_none"))
        skipped[name] = fmul_only_branches(body)
        if name == "lazy":
            assert any("VOTE.ANY" in x for x in body)
    assert skipped == {"as committed": [], "lazy": [64]}


def fmul_only_branches(instructions: list[str]) -> list[int]:
    """The forward branches whose skipped instructions are all FMUL: how many each skips (the SASS lines are
    numbered by position; a branch target is read from its 0x address at 16 bytes an instruction)."""
    out = []
    for i, text in enumerate(instructions):
        target = text.rsplit("0x", 1)[-1] if "BRA" in text and "0x" in text else None
        if target is None:
            continue
        j = int(target, 16) // 16
        if j > i + 1 and all(x.startswith("FMUL") for x in instructions[i + 1:j]):
            out.append(j - i - 1)
    return out
