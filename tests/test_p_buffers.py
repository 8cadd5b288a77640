"""schedule.p_buffers: 2 (fwd_wgmma, on the overlapped schedule): a tile's P is made into a second register set while
P.V of the tile before still reads the first, and that P.V is waited for only afterwards: with
softmax.kept_max_first at the kept maxima, otherwise by the usual step (only O's rescale after the wait). Checked here
without a GPU: the rule, the rendering (the loop in pairs of tiles, each buffer named where it is written and read,
the wait after P) and the SASS (a tile's exponentials, and with the usual step its e4m3 conversions, come before the
wait, which ptxas would otherwise put at the top of their block; no spills)."""
from __future__ import annotations

import subprocess

import pytest
import yaml

from attngen.compile import run_nvcc
from attngen.errors import SpecError, ToolError
from attngen.render import render_for
from test_softmax_block_sass import ROOT, cuda_tools, functions

E4M3, SIXTEEN = "h100_wgmma_d128_fp8", "h100_wgmma_d128_n128c2ps2r24x240ppet"
KEPT = {"lazy_rescale": True, "kept_max_first": True}
USUAL = {"lazy_rescale": False, "kept_max_first": False}   # the usual step (the committed d128 ppet sets KEPT)


def trial(directory, base: str, softmax: dict, schedule: dict, suffix: str):
    """specs/BASE.yaml, its first dtype alone, with these softmax and schedule keys, written into DIRECTORY."""
    data = yaml.safe_load((ROOT / "specs" / f"{base}.yaml").read_text())
    data.pop("cells", None)
    if "dtypes" in data:
        data["dtype"] = data.pop("dtypes")[0]
    data["name"] = f"{base}_{suffix}"
    data.setdefault("softmax", {}).update(softmax)
    data.setdefault("schedule", {}).update(schedule)
    path = directory / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("softmax, schedule, says", [
    (KEPT, {"p_buffers": 2, "overlap": False}, "set schedule.overlap: true"),   # the sequential schedule
    (USUAL, {"p_buffers": 2, "softmax_block": True}, "drop schedule.softmax_block"),   # the tile makes its own block
])
def test_the_rule(tmp_path, softmax, schedule, says):
    from attngen.spec import load_spec
    with pytest.raises(SpecError) as e:
        load_spec(trial(tmp_path, E4M3, softmax, schedule, "pb"))
    assert "schedule.p_buffers" in str(e.value) and says in str(e.value)
    for kept in (KEPT, USUAL, {"lazy_rescale": True}):
        load_spec(trial(tmp_path, E4M3, kept, {"p_buffers": 2}, "pb"))


@pytest.mark.parametrize("base", [E4M3, SIXTEEN])
def test_the_rendering(tmp_path, base):
    _, one, _ = render_for(trial(tmp_path, base, KEPT, {}, "km"))
    assert "pb[" not in one and "in_own_block" not in one
    plan, source, _ = render_for(trial(tmp_path, base, KEPT, {"p_buffers": 2}, "pb"))
    assert plan.fragments.p_buffers == 2
    assert "uint32_t pb[kKStepsPV][4];" in source
    assert "for (int t = 1; t < tiles; t += 2) {" in source
    # odd tiles' P in pb while P.V of the even tile before reads pa, and the other way round
    for cur, prev in (("pb", "pa"), ("pa", "pb")):
        step = source.index(f"in_own_block([&] {{ kept = p_at_kept_max({cur}, s,")
        before, after = source[:step], source[step:]
        assert before.rindex(f"issue_pv(o, {prev}, slot(") > before.rindex("issue_scores(s, sQ,")
        # the wait for that P.V comes after the kept P, and before the rescale a warp where a row moved makes
        assert after.index("wgmma_wait<0>();") < after.index("if (!kept) {") < after.index(f"p_fragments({cur}, s);")
    # the last tile's P.V reads the buffer its P went to, each arm with its own fence (one ahead of the branch
    # had ptxas inject a warpgroup.arrive in each arm: C7519)
    tail = source[source.index("if ((tiles - 1) & 1) {"):]
    odd, even = tail.split("} else {", 1)
    assert odd.index("wgmma_fence();") < odd.index("issue_pv(o, pb, slot(tiles - 1) + kSmem_v0);")
    assert even.index("wgmma_fence();") < even.index("issue_pv(o, pa, slot(tiles - 1) + kSmem_v0);") < even.index("}")
    assert "two P buffers" in source   # the provenance header's plan line


@pytest.mark.parametrize("base", [E4M3, SIXTEEN])
def test_the_usual_step_with_two_buffers(tmp_path, base):
    """Without kept_max_first: the tile's softmax and P's fragments go into the free buffer in a block of their own,
    ahead of the wait for the previous P.V; O's rescale follows the wait."""
    plan, source, _ = render_for(trial(tmp_path, base, USUAL, {"p_buffers": 2}, "pbu"))
    assert plan.fragments.p_buffers == 2 and not plan.fragments.kept_max_first
    assert "p_at_kept_max" not in source and "uint32_t pb[kKStepsPV][4];" in source
    for cur, prev in (("pb", "pa"), ("pa", "pb")):
        step = source.index("in_own_block([&] {", source.index(f"issue_pv(o, {prev}, slot("))
        assert source.index(f"p_fragments({cur}, s);", step) < source.index("wgmma_wait<0>();", step)
        before, after = source[:step], source[step:]
        assert before.rindex(f"issue_pv(o, {prev}, slot(") > before.rindex("issue_scores(s, sQ,")
        assert after.index("wgmma_wait<0>();") < after.index("rescale_output(o, alpha);")
    lazy, _ = render_for(trial(tmp_path, base, {"lazy_rescale": True, "kept_max_first": False}, {"p_buffers": 2}, "pbl"))[1:]
    assert "rescale_output_where_moved(o, alpha);" in lazy and "in_own_block([&] {" in lazy


def exponentials_before_each_wait(code: list[str], opcode: str = "MUFU.EX2") -> list[int]:
    """In the order of the code: the exponentials (or other instructions of `opcode`) between each wait that leaves
    one group (S ready, P.V running) and the next wait for all (P.V done)."""
    counts, count = [], None
    for text in code:
        if "WARPGROUP.DEPBAR.LE gsb0, 0x1" in text:
            count = 0
        elif "WARPGROUP.DEPBAR.LE gsb0, 0x0" in text and count is not None:
            counts.append(count)
            count = None
        elif opcode in text and count is not None:
            count += 1
    return counts


def full_mask_sass(tmp_path, softmax: dict, schedule: dict, suffix: str):
    """(plan, the SASS lines of the full-mask function) of the e4m3 d128 cell with these keys, built for sm_90a; the
    test is skipped without nvcc and cuobjdump or where nvcc cannot build for sm_90a. Its full-mask functions must
    not spill."""
    tools = cuda_tools()
    if tools is None:
        pytest.skip("nvcc and cuobjdump are needed to read the SASS")
    nvcc, cuobjdump = tools
    plan, source, _ = render_for(trial(tmp_path, E4M3, softmax, schedule, suffix))
    try:
        result = run_nvcc(source, "sm_90a", nvcc)
    except ToolError as e:
        pytest.skip(f"nvcc could not build for sm_90a here: {e}")
    none = [f for f in result.functions if f.name.endswith("_none")]
    assert none and not any(f.spills for f in none), result.functions
    cubin = tmp_path / f"{suffix}.cubin"
    cubin.write_bytes(result.cubin)
    sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    return plan, next(ins for fn, ins in functions(sass).items() if fn.endswith("_none"))


def test_the_kept_p_is_made_before_the_wait(tmp_path):
    """SASS (nvcc 13 + cuobjdump, sm_90a; skipped without them) of the e4m3 d128 cell's full-mask function: with two
    buffers every wait for P.V of the tile before has a tile's exponentials (96 a thread) ahead of it, in both
    tiles of the pair; with one buffer none does (P goes into the registers that P.V reads). No spills."""
    found = {}
    for suffix, schedule in (("km", {}), ("pb", {"p_buffers": 2})):
        plan, body = full_mask_sass(tmp_path, KEPT, schedule, suffix)
        found[suffix] = exponentials_before_each_wait(body)
    per_tile = plan.spec.tile.block_n // 2   # a thread's scores of a tile: 64 rows x block_n over 128 threads
    assert found["km"] and max(found["km"]) == 0, found
    assert len(found["pb"]) >= 2 and min(found["pb"]) >= per_tile, found


def test_the_usual_p_is_made_before_the_wait(tmp_path):
    """SASS (sm_90a; skipped without nvcc and cuobjdump) of the committed e4m3 d128 cell's full-mask function and of
    the same with two buffers and the usual step: with two, each wait for the previous P.V has a tile's exponentials
    (96 a thread) and P's conversions to e4m3 (48) ahead of it; with one, the conversions all come after it. No
    spills."""
    found = {}
    for suffix, schedule in (("one", {}), ("pbu", {"p_buffers": 2})):
        plan, body = full_mask_sass(tmp_path, USUAL, schedule, suffix)
        found[suffix] = (exponentials_before_each_wait(body), exponentials_before_each_wait(body, "F2FP"))
    per_tile = plan.spec.tile.block_n // 2   # a thread's scores of a tile
    exps, cvts = found["pbu"]
    assert len(exps) >= 2 and min(exps) >= per_tile and min(cvts) >= per_tile // 2, found
    assert max(found["one"][1]) == 0, found
