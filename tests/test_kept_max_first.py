"""softmax.kept_max_first (with lazy_rescale, the forward wgmma kinds): a warp makes each tile's P at its rows' kept
maxima at once, scans the tile's max beside the exponentials, and takes the usual step only where a row of the warp
moved. Checked here without a GPU: the rules, the rendering (the step's own shift and test), an emulation of a warp's
rows in float32 against the lazy_rescale step (the same output), and the SASS (the exponentials no longer wait for
the row max; every shift a rounded product and an add, so both paths round it alike)."""
from __future__ import annotations

import math
import random
import re
import subprocess

import pytest

from attngen.compile import run_nvcc
from attngen.core.fp8 import P_LOG2_OFFSET
from attngen.errors import SpecError, ToolError
from attngen.render import render_for
from test_lazy_rescale import emulate_row, f32, lazy_trial, lazy_tile_step, tile_growth
from test_softmax_block_sass import ROOT, cuda_tools, functions

E4M3, SIXTEEN = "h100_wgmma_d128_fp8", "h100_wgmma_d64_persistent_q2"


def spec_with(tmp_path, base: str, softmax: str, schedule: str = ""):
    """specs/BASE.yaml with `softmax` (and `schedule`) lines added to its blocks, loaded: the SpecError or None."""
    from attngen.spec import load_spec
    text = (ROOT / "specs" / f"{base}.yaml").read_text()
    assert "\nsoftmax:\n" in text and "\nschedule:\n" in text
    text = text.replace("\nsoftmax:\n", "\nsoftmax:\n" + softmax).replace("\nschedule:\n", "\nschedule:\n" + schedule)
    path = tmp_path / f"{base}.yaml"
    path.write_text(text)
    try:
        load_spec(path)
    except SpecError as e:
        return e
    return None


@pytest.mark.parametrize("softmax, schedule, says", [
    ("  kept_max_first: true\n", "", "set softmax.lazy_rescale: true"),
    ("  lazy_rescale: true\n  kept_max_first: true\n  fma_exp2: 2\n", "", "set softmax.fma_exp2: 0"),
    ("  lazy_rescale: true\n  kept_max_first: true\n", "  softmax_block: true\n", "remove one of the two"),
])
def test_the_rules(tmp_path, softmax, schedule, says):
    e = spec_with(tmp_path, E4M3, softmax, schedule)
    assert e is not None and "softmax.kept_max_first" in str(e) and says in str(e), e
    assert spec_with(tmp_path, E4M3, "  lazy_rescale: true\n  kept_max_first: true\n") is None


def test_other_kinds_refuse_the_key(tmp_path):
    from attngen.spec import load_spec
    text = (ROOT / "specs" / "l4_mma_d64.yaml").read_text()
    path = tmp_path / "l4_mma_d64.yaml"
    path.write_text(text + "softmax:\n  kept_max_first: true\n" if "\nsoftmax:\n" not in text
                    else text.replace("\nsoftmax:\n", "\nsoftmax:\n  kept_max_first: true\n"))
    with pytest.raises(SpecError) as e:
        load_spec(path)
    assert "softmax.kept_max_first" in str(e.value) and "remove kept_max_first" in str(e.value)


@pytest.mark.parametrize("base, shift", [(E4M3, "8.f - scaled_max(m, scale_log2)"),
                                         (SIXTEEN, "-scaled_max(m, scale_log2)")])
def test_the_rendering(tmp_path, base, shift):
    _, source, _ = render_for(ROOT / "specs" / f"{base}.yaml")
    assert "p_at_kept_max" not in source and "keeps_max" not in source
    _, lazy, _ = render_for(lazy_trial(tmp_path, base))
    assert "p_at_kept_max" not in lazy
    plan, source, _ = render_for(lazy_trial(tmp_path, base, kept_max_first=True))
    assert plan.fragments.kept_max_first and plan.fragments.lazy_slack > 0
    # P at the kept max uses the step's own shift and test, so a kept row's P is the step's, bit for bit
    assert f"    return {shift};" in source
    # the step's shift is written as exponent_shift's, from the same explicitly rounded product
    assert "const float m_scaled = scaled_max(m_new, scale_log2);" in source
    assert ("const float p_shift = 8.f - m_scaled;" if base == E4M3 else "fmaf(x, scale_log2, -m_scaled)") in source
    assert "shift[h] = exponent_shift(row_max[h], scale_log2);" in source
    assert "kept = keeps_max(group_max<4>(mx[h]), row_max[h], scale_log2) && kept;" in source
    # both loops: P at the kept max once P.V of the tile before is done, the usual step where it fails (the
    # sequential loop's first tile takes it at once: test_the_sequential_loop_takes_the_usual_step_on_its_first_tile)
    fallback = ("!p_at_kept_max(pa, s, row_max, row_sum, {0})) {{   // a row of the warp moved its max\n"
                "                        softmax_rows(s, alpha, row_max, row_sum, {0});\n"
                "                        p_fragments(pa, s);\n"
                "                        rescale_output_where_moved(o, alpha);\n"
                "                    }}").format("scale_log2" if plan.spec.dtype == "e4m3" else "p.scale_log2")
    assert source.count(fallback) == 2
    loop = source[source.index("wgmma_wait<1>();   // S_t is ready"):]
    assert loop.index("wgmma_wait<0>();   // P_(t-1).V_(t-1) is done") < loop.index("if (!p_at_kept_max(")
    assert "softmax_rows(" not in loop[:loop.index("if (!p_at_kept_max(")]
    # the first tile of the overlapped loop takes the usual step (no row has a max yet)
    assert source.count("softmax_rows(s, alpha, row_max, row_sum") == 3
    assert "P made at the kept maxima first" in source   # the provenance header's plan line


def test_the_sequential_loop_takes_the_usual_step_on_its_first_tile(tmp_path):
    """No row has a max before its first tile: the sequential loop (the three-warpgroup e4m3 d64 cell) skips P at the
    kept max there rather than make it and throw it away."""
    plan, source, _ = render_for(lazy_trial(tmp_path, "h100_wgmma_d64_fp8_n128c3ps4r32x160pb", kept_max_first=True))
    assert not plan.fragments.overlap
    assert source.count("if (t == 0 || !p_at_kept_max(pa, s, row_max, row_sum, scale_log2)) {") == 1


def emulate_warp_kept_first(rows, tile, scale_log2, slack, offset):
    """emulate_row's step for a warp's rows together, P at the kept maxima first: per tile, every row's P at its kept
    max and its tile max; where every row keeps its max, those P and sums; else the usual (lazy) step for every row.
    Returns per row (O / sum, LSE in log2 units) and the tiles that fell back."""
    n = len(rows[0])
    state = [[-math.inf, 0.0, 0.0] for _ in rows]   # row max, row sum, O (one value column)
    fell_back = 0
    for t0 in range(0, n, tile):
        tiles = [r[t0:t0 + tile] for r in rows]
        firsts = []
        for (row_max, _, _), s in zip(state, tiles):
            shift = f32(offset - f32((0.0 if row_max == -math.inf else row_max) * scale_log2))
            p = [f32(2.0 ** f32(x * scale_log2 + shift)) if x != -math.inf else 0.0 for x in s]
            firsts.append((p, tile_growth(row_max, s, scale_log2)[1] <= slack))
        if all(kept for _, kept in firsts):
            for st, (p, _) in zip(state, firsts):
                st[1] = f32(st[1] + f32(sum(p)))
                st[2] = f32(st[2] + sum(pi * (j + t0) / n for j, pi in enumerate(p)))
            continue
        fell_back += 1
        for st, s in zip(state, tiles):
            lazy_tile_step(st, s, t0, n, scale_log2, slack, offset)
    out = [(o / row_sum, row_max * scale_log2 + math.log2(row_sum) - offset) for row_max, row_sum, o in state]
    return out, fell_back


@pytest.mark.parametrize("trend", [0.0, 0.05, -0.05])
def test_a_warp_gets_the_lazy_steps_output(trend):
    """16 rows of a warp (their first keys masked, as a causal row's first tiles are): P at the kept maxima first
    gives each row the output and LSE of lazy_rescale's step to float32's rounding (the vote and the fallback);
    with 16-bit P's slack random rows fall back only on the masked tile and their first tile with a key."""
    rng = random.Random(5)
    scale_log2 = f32(64 ** -0.5 * math.log2(math.e))
    for slack, offset in ((8.0, 0), (0.75, P_LOG2_OFFSET)):
        n = 192 * 10
        rows = []
        for _ in range(16):
            r = [f32(rng.gauss(0, 4) + trend * j) for j in range(n)]
            r[:300] = [-math.inf] * 300
            rows.append(r)
        out, fell_back = emulate_warp_kept_first(rows, 192, scale_log2, slack, offset)
        for r, (o, lse) in zip(rows, out):
            o_lazy, lse_lazy, _, _ = emulate_row(r, 192, scale_log2, slack, offset)
            assert abs(o - o_lazy) <= 1e-5 * abs(o_lazy) and abs(lse - lse_lazy) <= 1e-5
        tiles = n // 192
        assert fell_back >= 2   # the tile of the masked keys and the first tile with keys
        if trend == 0 and slack == 8.0:
            assert fell_back <= 3, fell_back
        assert fell_back <= tiles


def exponentials_before_the_max(instructions: list[str]) -> int:
    """After a wait for P.V (WARPGROUP.DEPBAR 0x0), how many exponentials come before the first shuffle of the row
    max (SHFL.BFLY): the most over the function's such waits."""
    best = 0
    for i, text in enumerate(instructions):
        if "WARPGROUP.DEPBAR.LE gsb0, 0x0" in text:
            count = 0
            for later in instructions[i + 1:]:
                if "SHFL.BFLY" in later or "WARPGROUP.DEPBAR" in later:
                    break
                count += "MUFU.EX2" in later
            best = max(best, count)
    return best


@pytest.mark.parametrize("base", [E4M3, SIXTEEN])
def test_the_exponentials_no_longer_wait_for_the_max(tmp_path, base):
    """SASS (nvcc 13 + cuobjdump, sm_90a; skipped without them): with the key, the exponentials of a tile's P at the
    kept max begin before the shuffles that reduce the row max over its quad (ptxas puts the shuffles among them:
    77 of the e4m3 d128 cell's 96 and 11 of the d64 cell's 64 come first, nvcc 13.0); in the committed spec none
    does (the exponentials need the max). No spills."""
    tools = cuda_tools()
    if tools is None:
        pytest.skip("nvcc and cuobjdump are needed to read the SASS")
    nvcc, cuobjdump = tools
    found = {}
    for name, path in (("as committed", ROOT / "specs" / f"{base}.yaml"),
                       ("kept_max_first", lazy_trial(tmp_path, base, kept_max_first=True))):
        _, source, _ = render_for(path)
        try:
            result = run_nvcc(source, "sm_90a", nvcc)
        except ToolError as e:
            pytest.skip(f"nvcc could not build for sm_90a here: {e}")
        assert all(not f.spills for f in result.functions), result.functions
        cubin = tmp_path / f"{name.replace(' ', '_')}.cubin"
        cubin.write_bytes(result.cubin)
        sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
        body = next(ins for fn, ins in functions(sass).items() if fn.endswith("_none"))
        found[name] = exponentials_before_the_max(body)
        if name == "kept_max_first" and base == E4M3:   # every shift 8 - m * scale: a rounded product, then the add
            assert not any(re.match(r"FFMA\S* R\d+, \S+, \S+, 8$", x) for x in body)
            assert sum(bool(re.match(r"FADD\S* R\d+, -R\d+, 8$", x)) for x in body) >= 2
    assert found["as committed"] == 0 and found["kept_max_first"] >= 8, found   # at least a register's worth
