"""`attngen sweep`: the space, static pruning, the record cache, the searches and the output, with
the GPU step behind a stub Measurer (and nvcc stubbed) unless a test is marked `nvcc` or `gpu`."""
from __future__ import annotations

import importlib
import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from attngen.eval import sweep as S
from attngen.eval.sweep import search as search_mod
from attngen.eval.bench import Case
from attngen.cli import main
from attngen.errors import NoGpuError
from attngen.plan import make_plan
from attngen.render import render_spec_file
from attngen.spec import load_spec, spec_dict

ROOT = Path(__file__).resolve().parents[1]
L4_D64 = ROOT / "specs" / "l4_mma_d64.yaml"
L4_D64_WS = ROOT / "specs" / "lab" / "l4_mma_d64_ws.yaml"
W = S.WarpChoice
CASES = [Case(1, 2, 256, 64, "fp16", False), Case(1, 2, 256, 64, "fp16", True)]


def space(**fields) -> S.SearchSpace:
    """A small space around l4_mma_d64 (64x64 tiles, 4 warps, 2 stages, xor3, Q in registers)."""
    d = dict(block_m=(64,), block_n=(64,), warps=(W(4),), stages=(2,), swizzle=("xor3",), q_in_registers=(True,))
    return S.forward_space(**{**d, **fields})


# 8 points on the L4 (48 KiB budget): 64 rows cannot split over 8 warps of 16 rows (2 rule breaks);
# 64x128, 128x128 with 4 or 8 warps need 72-80 KiB (3 over budget); 3 survive.
MIXED = space(block_m=(64, 128), block_n=(64, 128), warps=(W(4), W(8)))


@pytest.fixture(scope="module")
def base():
    return load_spec(L4_D64)


@pytest.fixture(scope="module")
def medium(base):
    """A 72-point space and its pruning, shared by the search tests."""
    sp = space(block_m=(64, 128), block_n=(32, 64, 128), warps=(W(2), W(4), W(8)), stages=(1, 2),
               q_in_registers=(False, True))
    return sp, S.prune(base, sp)


@pytest.fixture
def stub_nvcc(monkeypatch):
    """compile_all without nvcc: every candidate compiles cleanly unless its tag is in `spills`."""
    state = {"compiled": [], "spills": set()}

    def fake(cands, arch, jobs, on_done=None):
        out = {}
        for c in cands:
            state["compiled"].append(c.name)
            outcome = S.CompileOutcome(S.SPILLS if c.choice.tag in state["spills"] else "ok", 128)
            out[c.name] = outcome
            if on_done:
                on_done(c, outcome)
        return out
    monkeypatch.setattr(search_mod, "compile_all", fake)       # where the search looks it up
    return state


class StubMeasurer:
    """A deterministic GPU: time falls with block_m and stages; `fail` tags fail verification;
    `stop_after` raises KeyboardInterrupt on that call, as a user's Ctrl-C would."""

    gpu = "Stub GPU"
    arch = "sm_90"
    torch_version = "stub"

    def __init__(self, fail=(), stop_after=None):
        self.fail = set(fail)
        self.stop_after = stop_after
        self.calls: list[tuple[str, bool]] = []

    def measure(self, plan, sources, shape, causal):
        if self.stop_after is not None and len(self.calls) == self.stop_after:
            raise KeyboardInterrupt
        self.calls.append((plan.spec.name, causal))
        if S.choice_of(plan.spec).tag in self.fail:
            return S.Measurement(S.FAILED_VERIFY, note="planted")
        us = 10000 / plan.block_m + plan.block_n / 8 + 5 / plan.stages + 3 * plan.compute_warps \
            + (0 if plan.q_in_registers else 1) + (7 if causal else 0)
        return S.Measurement("ok", us)

    def flash_time(self, shape, dtype, causal, call):
        return 150.0


def sweep(base, sp, tmp_path, measurer, **opts):
    options = S.SweepOptions(CASES, **opts)
    return S.run_sweep(base, sp, options, arch="sm_90", measurer=measurer, cache=S.RecordCache(tmp_path / "rec"))


# -- the space -------------------------------------------------------------------------------------

def test_default_space_from_base(base):
    sp = S.default_space(base)
    assert sp.block_m == (64, 96, 112, 128) and sp.block_n == (32, 64, 128) and sp.stages == (1, 2, 3, 4)
    assert sp.warps == (W(2), W(4), W(8))            # no producer/consumer splits for a homogeneous base
    assert sp.swizzle == ("xor3", "none") and sp.q_in_registers == (False, True)
    assert S.choice_of(base) in set(sp.choices())


def test_default_space_with_warp_roles():
    ws = load_spec(L4_D64_WS)
    warps = S.default_space(ws).warps
    assert warps[:3] == (W(2), W(4), W(8))
    assert set(warps[3:]) == {W(4, 1), W(7, 1), W(4, 2), W(6, 2)}


def test_enumeration_is_deterministic_and_covers_the_space(base):
    sp = S.default_space(base)
    first, second = list(sp.choices()), list(sp.choices())
    assert first == second and len(first) == sp.size == 4 * 3 * 3 * 4 * 2 * 2
    assert len({c.tag for c in first}) == sp.size
    for f in sp.names:
        assert {getattr(c, f) for c in first} == set(getattr(sp, f))


def test_candidate_is_the_base_under_a_new_name(base):
    cand = S.build_candidate(base, S.default_space(base), S.choice_of(base))
    assert cand.name == "l4_mma_d64_m64n64w4s2x3q"
    assert {k: v for k, v in spec_dict(cand.spec).items() if k != "name"} == \
           {k: v for k, v in spec_dict(base).items() if k != "name"}
    assert cand.code_hash == S.code_hash((render_spec_file(L4_D64).source,), base.name)
    assert cand.spec_hash == S.spec_hash(base)


def test_candidate_names_keep_the_name_rule(base):
    long_base = base.model_copy(update={"name": "a" * 48})
    sp = S.default_space(base)
    cand = S.build_candidate(long_base, sp, sp.choice(112, 64, W(7, 1), 2, "xor3r1", True))
    assert len(cand.name) <= 48 and re.fullmatch(r"[a-z][a-z0-9_]{0,47}", cand.name)
    assert cand.name.endswith("_m112n64p1c7s2x3r1q")


def test_neighbours_step_one_field(base):
    sp = S.default_space(base)
    at = S.choice_of(base)
    for n in sp.neighbours(at):
        changed = [f for f in sp.names if getattr(n, f) != getattr(at, f)]
        assert len(changed) == 1
        values = getattr(sp, changed[0])
        assert abs(values.index(getattr(n, changed[0])) - values.index(getattr(at, changed[0]))) == 1


def test_swizzle_tokens_round_trip():
    for token in ("none", "pad16", "xor3", "xor2r1"):
        assert S.swizzle_token(S.swizzle_value(token)) == token
    with pytest.raises(ValueError):
        S.swizzle_value("zigzag")


# -- static pruning ----------------------------------------------------------------------------------

def test_pruning_counts_each_reason(base):
    survivors, pruned = S.prune(base, MIXED)
    reasons = {}
    for p in pruned:
        reasons[p.reason] = reasons.get(p.reason, 0) + 1
    assert reasons == {"spec rule: tile.block_m": 2, S.BUDGET: 3}
    assert [c.choice.tag for c in survivors] == ["m64n64w4s2x3q", "m128n64w4s2x3q", "m128n64w8s2x3q"]
    budget_refused = {p.choice.tag for p in pruned if p.reason == S.BUDGET}
    assert budget_refused == {"m64n128w4s2x3q", "m128n128w4s2x3q", "m128n128w8s2x3q"}


def test_duplicate_code_is_pruned(base):
    # xor3 and xor3r0 are the same swizzle: the second candidate renders the first one's code.
    sp = space(block_m=(64, 128), swizzle=("xor3", "xor3r0"))
    survivors, pruned = S.prune(base, sp)
    assert [c.choice.swizzle for c in survivors] == ["xor3", "xor3"]
    assert [(p.reason, p.choice.swizzle) for p in pruned] == [(S.DUPLICATE, "xor3r0")] * 2
    assert "same code as l4_mma_d64_m64n64w4s2x3q" in pruned[0].message


def test_report_counts(base, tmp_path, stub_nvcc):
    stub_nvcc["spills"].add("m128n64w8s2x3q")
    report = sweep(base, MIXED, tmp_path, StubMeasurer(fail={"m128n64w4s2x3q"}))
    assert report.counts() == {"enumerated": 8, S.FAILED_VERIFY: 1, S.BUDGET: 3, "spec rule: tile.block_m": 2,
                               S.SPILLS: 1, S.TIMED: 1}


def test_a_budget_renders_only_its_sample(base, medium, monkeypatch):
    """prune with a budget renders a seeded sample of the valid points until that many have code of
    their own (rendering is most of pruning's cost); the rest are counted as over the budget; a
    budget above the valid points gives prune without one."""
    prune_mod = importlib.import_module("attngen.eval.sweep.prune")
    sp, (everyone, refused) = medium
    rendered = []
    real = prune_mod.render_candidate
    monkeypatch.setattr(prune_mod, "render_candidate", lambda c: rendered.append(c.choice) or real(c))
    kept, pruned = S.prune(base, sp, budget=5, seed=1)
    assert len(kept) == 5 and len(rendered) - 5 == sum(p.reason == S.DUPLICATE for p in pruned)
    assert {c.name for c in kept} <= {c.name for c in everyone}
    assert [c.choice for c in kept] == [c for c in sp.choices() if c in {k.choice for k in kept}]   # space order
    valid = len(everyone) + sum(p.reason == S.DUPLICATE for p in refused)
    assert sum(p.reason == S.NOT_SAMPLED for p in pruned) == valid - len(rendered)
    assert [c.name for c in S.prune(base, sp, budget=5, seed=1)[0]] == [c.name for c in kept]
    assert [c.name for c in S.prune(base, sp, budget=5, seed=2)[0]] != [c.name for c in kept]
    assert [c.name for c in S.prune(base, sp, budget=10 ** 6)[0]] == [c.name for c in everyone]


def test_a_budget_keeps_the_earliest_of_equal_code(base, medium, monkeypatch):
    """Of the rendered points with the same code, a budgeted prune keeps the one earliest in space
    order, as an unbudgeted one does (here every point with the same block_m counts as equal code)."""
    prune_mod = importlib.import_module("attngen.eval.sweep.prune")
    sp, _ = medium
    real, rendered = prune_mod.render_candidate, []

    def coarse(checked):
        cand = replace(real(checked), code_hash=str(checked.spec.tile.block_m))
        rendered.append(cand)
        return cand
    monkeypatch.setattr(prune_mod, "render_candidate", coarse)
    order = [c for c in sp.choices()]
    for seed in range(4):
        rendered.clear()
        kept, pruned = S.prune(base, sp, budget=2, seed=seed)
        assert len(kept) == 2 and sum(p.reason == S.DUPLICATE for p in pruned) == len(rendered) - 2
        for c in kept:
            same = [order.index(r.choice) for r in rendered if r.code_hash == c.code_hash]
            assert order.index(c.choice) == min(same)


def test_budget_samples_deterministically(medium):
    _, (survivors, _) = medium
    a = S.sample(survivors, 5, seed=1)
    assert a == S.sample(survivors, 5, seed=1) and len(a) == 5
    assert a != S.sample(survivors, 5, seed=2)
    assert [survivors.index(c) for c in a] == sorted(survivors.index(c) for c in a)
    assert S.sample(survivors, len(survivors) + 1, seed=1) == survivors


# -- measuring, the cache, resuming ---------------------------------------------------------------

def test_cache_hit_skips_the_measurer(base, tmp_path, stub_nvcc):
    first = StubMeasurer()
    a = sweep(base, MIXED, tmp_path, first)
    assert len(first.calls) == 3 * len(CASES)
    again = StubMeasurer()
    compiled_before = len(stub_nvcc["compiled"])
    b = sweep(base, MIXED, tmp_path, again)
    assert again.calls == [] and len(stub_nvcc["compiled"]) == compiled_before   # neither measured nor compiled
    for case in CASES:
        assert [(r.candidate.name, r.time(case)) for r in a.ranking(case)] == \
               [(r.candidate.name, r.time(case)) for r in b.ranking(case)]
    rec = json.loads(next((tmp_path / "rec").rglob("*.json")).read_text())
    assert {"status", "median_us", "note", "torch", "gpu", "shape", "dtype", "causal", "spec_hash"} <= set(rec)


def test_record_of_other_code_is_not_reused(base, tmp_path, stub_nvcc):
    sweep(base, MIXED, tmp_path, StubMeasurer())
    for path in (tmp_path / "rec").rglob("*.json"):            # as if the templates had changed since
        rec = json.loads(path.read_text())
        path.write_text(json.dumps({**rec, "code_hash": "0" * 64}))
    again = StubMeasurer()
    sweep(base, MIXED, tmp_path, again)
    assert len(again.calls) == 3 * len(CASES)


def test_interrupted_sweep_resumes(base, tmp_path, stub_nvcc):
    with pytest.raises(KeyboardInterrupt):
        sweep(base, MIXED, tmp_path, StubMeasurer(stop_after=4))
    rest = StubMeasurer()
    report = sweep(base, MIXED, tmp_path, rest)
    assert len(rest.calls) == 3 * len(CASES) - 4
    assert all(len(r.records) == len(CASES) for r in report.results)
    assert [r.candidate.choice.tag for r in report.ranking(CASES[0])][0] == "m128n64w4s2x3q"


def test_failed_verify_and_spills_are_never_ranked(base, tmp_path, stub_nvcc):
    fastest = "m128n64w4s2x3q"
    stub_nvcc["spills"].add("m128n64w8s2x3q")
    measurer = StubMeasurer(fail={fastest})
    report = sweep(base, MIXED, tmp_path, measurer)
    assert "l4_mma_d64_m128n64w8s2x3q" not in {name for name, _ in measurer.calls}
    for case in CASES:
        assert [r.candidate.choice.tag for r in report.ranking(case)] == ["m64n64w4s2x3q"]
    assert {name for name, (_, cases) in S.winners(report).items()} == {"l4_mma_d64_m64n64w4s2x3q"}
    table = S.format_report(report)
    assert fastest not in table and "l4_mma_d64_m64n64w4s2x3q" in table


def test_fatal_error_stops_the_sweep_and_is_cached(base, tmp_path, stub_nvcc):
    class Faulting(StubMeasurer):
        def measure(self, plan, sources, shape, causal):
            self.calls.append((plan.spec.name, causal))
            return S.Measurement(S.ERROR, note="illegal address", fatal=True)
    from attngen.errors import ToolError
    with pytest.raises(ToolError, match="run the same command again"):
        sweep(base, MIXED, tmp_path, Faulting())
    resumed = StubMeasurer()
    report = sweep(base, MIXED, tmp_path, resumed)
    # the faulting candidate keeps its error and is not measured again; the others are
    assert report.results[0].outcome == S.ERROR and len(resumed.calls) == 2 * len(CASES)
    assert report.results[0].candidate.name not in {name for name, _ in resumed.calls}


# -- the searches -------------------------------------------------------------------------------------

def evolve(base, medium, tmp_path, seed):
    sp, survivors = medium
    measurer = StubMeasurer()
    options = S.SweepOptions(CASES, search="evolve", seed=seed, generations=3, top_k=2)
    S.run_sweep(base, sp, options, arch="sm_90", measurer=measurer, cache=S.RecordCache(tmp_path / f"r{seed}"),
                survivors=survivors)
    return [name for name, causal in measurer.calls if not causal]


def test_evolve_is_reproducible_for_a_seed(base, medium, tmp_path, stub_nvcc):
    a = evolve(base, medium, tmp_path / "a", seed=1)
    assert a == evolve(base, medium, tmp_path / "b", seed=1)
    assert a != evolve(base, medium, tmp_path / "c", seed=2)
    assert len(a) == len(set(a)) and 4 < len(a) <= 4 + 3 * 2      # first population 2 x top-k, then <= top-k each


def test_evolve_children_differ_from_a_parent_in_one_field(base, medium, tmp_path, stub_nvcc):
    sp, (survivors, _) = medium
    names = evolve(base, medium, tmp_path, seed=3)
    by_name = {c.name: c.choice for c in survivors}
    first, later = names[:4], names[4:]
    for name in later:
        seen = [by_name[n] for n in names[:names.index(name)]]
        assert any(by_name[name] in sp.neighbours(p) for p in seen)


def test_evolve_never_measures_twice_and_respects_the_budget(base, medium, tmp_path, stub_nvcc):
    sp, survivors = medium
    measurer = StubMeasurer()
    options = S.SweepOptions(CASES, search="evolve", seed=5, generations=10, top_k=2, budget=7)
    report = S.run_sweep(base, sp, options, arch="sm_90", measurer=measurer, cache=S.RecordCache(tmp_path),
                         survivors=survivors)
    assert len(report.results) == 7 and len(measurer.calls) == 7 * len(CASES)


# -- output -------------------------------------------------------------------------------------------

def test_write_best_round_trips(base, tmp_path, stub_nvcc):
    report = sweep(base, MIXED, tmp_path, StubMeasurer())
    paths = S.write_best(report, tmp_path / "best", "attngen sweep specs/l4_mma_d64.yaml --shapes 1x2x256x64")
    assert [p.name for p in paths] == ["l4_mma_d64_m128n64w4s2x3q.yaml"]
    text = paths[0].read_text()
    comments = [ln for ln in text.splitlines() if ln.startswith("#")]
    assert text.startswith("# ") and "Stub GPU" in comments[0]
    assert any("1x2x256x64 fp16 causal" in ln and "x torch's flash backend (150.0 us)" in ln for ln in comments)
    assert comments[-1] == "# command: attngen sweep specs/l4_mma_d64.yaml --shapes 1x2x256x64"
    assert "null" not in text
    assert yaml.safe_load(text)["description"].startswith("sweep winner over l4_mma_d64: block_m 128, block_n 64, warps 4")
    spec = load_spec(paths[0])
    plan = make_plan(spec)
    assert spec.name == paths[0].stem and (plan.block_m, plan.block_n, plan.compute_warps) == (128, 64, 4)
    order = list(yaml.safe_load(text))
    file_order = list(yaml.safe_load(L4_D64.read_text()))
    assert [k for k in order if k in file_order] == file_order


def test_report_dict_and_table(base, tmp_path, stub_nvcc):
    report = sweep(base, MIXED, tmp_path, StubMeasurer())
    d = json.loads(json.dumps(S.report_dict(report)))
    assert d["counts"]["enumerated"] == 8 and len(d["candidates"]) == 3 and len(d["pruned"]) == 5
    assert d["space"]["warps"] == ["4", "8"]
    case = d["cases"][0]
    assert case["flash_us"] == 150.0 and case["ranking"][0]["rank"] == 1
    assert math.isclose(case["ranking"][0]["vs_flash"], 150.0 / case["ranking"][0]["median_us"])
    table = S.format_report(report)
    assert "vs flash" in table and "(base)" in table and "smem budget" in table


# -- the CLI ------------------------------------------------------------------------------------------

def run_cli(*args):
    result = CliRunner().invoke(main, ["sweep", *map(str, args)])
    out = result.output + (result.stderr if hasattr(result, "stderr") else "")
    assert "Traceback" not in out
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result, out


@pytest.fixture
def tiny_space(monkeypatch):
    """The CLI sweeps a 3-point space (block_m 64, 128 x 4 warps, and 128 x 8 warps survive)."""
    sp = space(block_m=(64, 128), warps=(W(4), W(8)))
    monkeypatch.setattr(S, "default_space", lambda base: sp)
    return sp


def test_cli_measuring_run_with_a_stub_gpu(tmp_path, monkeypatch, tiny_space, stub_nvcc):
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(S, "GpuMeasurer", lambda reps, seed: StubMeasurer(fail={"m128n64w8s2x3q"}))
    report, best = tmp_path / "sweep.json", tmp_path / "best"
    result, out = run_cli(L4_D64, "--shapes", "1x2x256x64", "--causal", "yes", "--json", report, "--write-best", best)
    assert result.exit_code == 0, out
    assert "1x2x256x64 fp16 causal: 2 ranked; torch flash 150.0 us" in out
    d = json.loads(report.read_text())
    assert d["command"].startswith("attngen sweep ") and "--causal yes" in d["command"]
    assert d["counts"] == {"enumerated": 4, S.FAILED_VERIFY: 1, "spec rule: tile.block_m": 1, S.TIMED: 2}
    [path] = best.glob("*.yaml")
    assert path.name == "l4_mma_d64_m128n64w4s2x3q.yaml" and f"wrote {path}" in out
    assert make_plan(load_spec(path)).block_m == 128
    assert (tmp_path / "cache" / "sweep").is_dir()


def test_cli_reports_are_written_atomically(tmp_path, monkeypatch, tiny_space, stub_nvcc):
    # Before: Path.write_text (a half-written file on a full disk) and a traceback for a missing
    # directory or a --write-best path under a file.
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(S, "GpuMeasurer", lambda reps, seed: StubMeasurer())
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    result, out = run_cli(L4_D64, "--shapes", "1x2x256x64", "--json", tmp_path / "no" / "sweep.json")
    assert result.exit_code == 3 and f"attngen: cannot write {tmp_path / 'no' / 'sweep.json'}" in out, out
    result, out = run_cli(L4_D64, "--shapes", "1x2x256x64", "--write-best", blocker / "best")
    assert result.exit_code == 3 and f"attngen: cannot create directory {blocker / 'best'}" in out, out


def test_write_best_on_a_full_disk_keeps_the_old_file(base, tmp_path, stub_nvcc, monkeypatch):
    from attngen import fsutil
    from attngen.errors import WriteError
    report = sweep(base, MIXED, tmp_path, StubMeasurer())
    [path] = S.write_best(report, tmp_path / "best", "attngen sweep")
    path.write_text("# an older winner\n")

    def enospc(fd, data):
        import errno, os
        os.write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(fsutil, "_write_all", enospc)
    with pytest.raises(WriteError, match="No space left on device"):
        S.write_best(report, tmp_path / "best", "attngen sweep")
    assert path.read_text() == "# an older winner\n" and [p.name for p in path.parent.iterdir()] == [path.name]


def test_record_cache_write_failure_is_an_error(base, tmp_path, stub_nvcc):
    # Before: a record that could not be written was dropped silently and the sweep measured it
    # again on every run.
    from attngen.errors import WriteError
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    options = S.SweepOptions(CASES)
    with pytest.raises(WriteError, match="cannot create directory .*ATTNGEN_CACHE_DIR"):
        S.run_sweep(base, MIXED, options, arch="sm_90", measurer=StubMeasurer(),
                    cache=S.RecordCache(blocker / "rec"))


def test_unwritable_cubin_cache_is_an_error_not_a_failed_compile(monkeypatch):
    # Before: compile_candidate took the WriteError for a compile failure of each candidate.
    from attngen import compile as compile_mod
    from attngen.errors import WriteError

    def unwritable(source, arch):
        raise WriteError("cannot write /cache/x/kernel.cubin: Read-only file system")
    monkeypatch.setattr(compile_mod, "compile_source", unwritable)
    with pytest.raises(WriteError, match="Read-only file system"):
        S.build.compile_candidate("source", "sm_90")


def test_cli_record_cache_write_failure_exits_3(tmp_path, monkeypatch, tiny_space, stub_nvcc):
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setattr(S, "GpuMeasurer", lambda reps, seed: StubMeasurer())
    result, out = run_cli(L4_D64, "--shapes", "1x2x256x64")
    assert result.exit_code == 3 and "attngen: cannot create directory" in out and "ATTNGEN_CACHE_DIR" in out, out


@pytest.mark.nvcc
def test_cli_compile_only(tmp_path, tiny_space):
    report = tmp_path / "sweep.json"
    result, out = run_cli(L4_D64, "--compile-only", "--arch", "sm_90", "--jobs", "2", "--json", report)
    assert result.exit_code == 0, out
    d = json.loads(report.read_text())
    assert d["counts"] == {"enumerated": 4, S.COMPILED: 3, "spec rule: tile.block_m": 1}
    assert all(c["compile"]["registers"] > 0 for c in d["candidates"])
    assert "compiled" in out


def test_cli_without_gpu_exits_4(monkeypatch, tiny_space):
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    else:                   # a machine with torch (and maybe a GPU): take the GPU away
        def no_gpu():
            raise NoGpuError("no CUDA GPU: torch sees none")
        monkeypatch.setattr("attngen.runtime.gpu_modules", no_gpu)
    result, out = run_cli(L4_D64, "--shapes", "1x2x256x64")
    assert result.exit_code == 4, out
    assert out.startswith("attngen: ") and ("torch" in out or "GPU" in out)


def test_cli_compile_only_without_arch_or_gpu(monkeypatch, tiny_space):
    def no_gpu():
        raise NoGpuError("no CUDA GPU: torch sees none")
    monkeypatch.setattr("attngen.runtime.gpu_modules", no_gpu)
    result, out = run_cli(L4_D64, "--compile-only")
    assert result.exit_code == 2 and "--arch" in out


@pytest.mark.parametrize("args, fragment", [
    (["--shapes", "1x2x256x128"], "head_dim 128"),
    (["--shapes", "1x2x256"], "BxHxSxD"),
    ([], "--shapes is required"),
    (["--compile-only", "--arch", "90"], "sm_89"),
    (["--compile-only", "--arch", "sm_90", "--write-best", "best"], "--write-best needs measurements"),
])
def test_cli_bad_options_exit_2(args, fragment, tiny_space):
    result, out = run_cli(L4_D64, *args)
    assert result.exit_code == 2 and fragment in out, out


def test_cli_bad_base_spec_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(L4_D64.read_text().replace("block_m: 64", "block_m: 48"))
    result, out = run_cli(bad, "--compile-only", "--arch", "sm_90")
    assert result.exit_code == 2 and "tile.block_m" in out


def test_cli_a_varlen_only_base_exits_2():
    """Sweep times padded calls: a base that serves varlen calls only (varlen: only) is refused before
    anything compiles, with what to sweep instead."""
    result, out = run_cli(ROOT / "specs" / "h100_mma_d96.yaml", "--compile-only", "--arch", "sm_90")
    assert result.exit_code == 2 and "serves varlen calls only (varlen: only)" in out, out


@pytest.mark.gpu
def test_gpu_tiny_sweep(tmp_path, tiny_space):
    report, best = tmp_path / "sweep.json", tmp_path / "best"
    result, out = run_cli(L4_D64, "--shapes", "1x4x512x64", "--reps", "5", "--json", report, "--write-best", best)
    assert result.exit_code == 0, out
    d = json.loads(report.read_text())
    assert d["counts"][S.TIMED] >= 1 and all(c["ranking"] for c in d["cases"])
    assert all(c["flash_us"] for c in d["cases"])
    for path in best.glob("*.yaml"):
        make_plan(load_spec(path))
    again, _ = run_cli(L4_D64, "--shapes", "1x4x512x64", "--reps", "5", "--json", report)
    times = [[(r["name"], r["median_us"]) for r in c["ranking"]] for c in d["cases"]]
    d2 = json.loads(report.read_text())
    assert [[(r["name"], r["median_us"]) for r in c["ranking"]] for c in d2["cases"]] == times   # from the cache


def test_a_kind_declares_its_own_axes():
    """The Hopper kind sweeps its own knobs: block_m moves with the consumer warpgroups, registers and
    schedule are axes, and its rules prune what cannot be generated."""
    base = load_spec(ROOT / "specs" / "lab" / "h100_wgmma_d128.yaml")
    sp = S.default_space(base)
    assert sp.names == ("block_n", "warpgroups", "stages", "registers", "schedule", "epilogue", "blocks",
                        "max_chains")
    assert S.choice_of(base, sp).tag == "n128c2ps3r24x240o"
    one = (False, 1)   # a block per query block: no tag, so earlier candidates keep their names
    survivors, pruned = S.prune(base, sp, [sp.choice(176, (0, 2), 2, None, "overlap", "registers", one, 1),
                                           sp.choice(128, (0, 2), 2, None, "pingpong", "registers", one, 1),
                                           sp.choice(176, (1, 2), 3, (24, 240), "overlap", "tma", one, 1),
                                           sp.choice(128, (1, 2), 2, (24, 240), "pingpong", "tma", one, 1)])
    first, tma = survivors
    assert first.name == "h100_wgmma_d128_n176c2hs2o"
    assert (first.plan.block_m, first.plan.producer_warps, first.plan.fragments.has_producer) == (128, 0, False)
    assert first.spec.registers is None and first.spec.schedule.overlap and not first.spec.schedule.pingpong
    assert tma.name == "h100_wgmma_d128_n128c2ps2r24x240ppet" and tma.spec.epilogue == "tma"
    assert [p.reason for p in pruned] == ["spec rule: schedule.pingpong", S.BUDGET]


def test_the_wgmma_space_scans_the_row_max_in_four_chains():
    """softmax.max_chains 4 is a point of its own (tag mc4); the kind's rule prunes it where a thread's
    part of a row is under 32 scores."""
    base = load_spec(ROOT / "specs" / "lab" / "h100_wgmma_d128.yaml")
    sp = S.default_space(base)
    kept, pruned = S.prune(base, sp, [sp.choice(128, (1, 2), 2, (24, 240), "pingpong", "tma", (False, 1), 4),
                                      sp.choice(64, (1, 2), 2, (24, 240), "pingpong", "tma", (False, 1), 4)])
    assert [c.name for c in kept] == ["h100_wgmma_d128_n128c2ps2r24x240ppetmc4"]
    assert kept[0].spec.softmax.max_chains == 4 and kept[0].plan.fragments.max_chains == 4
    assert [p.reason for p in pruned] == ["spec rule: softmax.max_chains"]


def test_a_base_with_the_softmax_in_its_own_block_keeps_its_sequential_points():
    """schedule.softmax_block needs the overlapped schedule: from a base that sets it, the sequential
    candidates drop it (rather than being refused), the overlapped ones keep it."""
    base = load_spec(ROOT / "specs" / "h100_wgmma_d64_n128c1ps3opb.yaml")
    assert base.schedule.softmax_block and base.schedule.overlap
    sp = S.default_space(base)
    blocks = (True, 1)
    kept, pruned = S.prune(base, sp, [sp.choice(128, (1, 1), 3, None, "seq", "registers", blocks, 1),
                                      sp.choice(128, (1, 1), 3, None, "overlap", "registers", blocks, 1)])
    assert not pruned and [c.spec.schedule.softmax_block for c in kept] == [False, True]
    assert [c.spec.schedule.overlap for c in kept] == [False, True]


def test_the_wgmma_space_has_persistent_blocks():
    """The blocks axis makes persistent candidates (one or two Q tiles) from a base without them, and
    the kind's rules refuse a persistent block without a producer warpgroup; a persistent base
    sits at its own point."""
    base = load_spec(ROOT / "specs" / "lab" / "h100_wgmma_d128.yaml")
    sp = S.default_space(base)
    assert sp.blocks == ((False, 1), (True, 1), (True, 2))
    kept, pruned = S.prune(base, sp, [sp.choice(128, (1, 2), 2, (24, 240), "pingpong", "tma", (True, 2), 1),
                                      sp.choice(128, (1, 2), 2, (24, 240), "pingpong", "tma", (True, 1), 1),
                                      sp.choice(128, (0, 2), 2, None, "overlap", "tma", (True, 1), 1)])
    assert [c.name for c in kept] == ["h100_wgmma_d128_n128c2ps2r24x240ppetpbq2",
                                      "h100_wgmma_d128_n128c2ps2r24x240ppetpb"]
    assert [(c.spec.schedule.persistent, c.spec.schedule.q_tiles) for c in kept] == [(True, 2), (True, 1)]
    assert [p.reason for p in pruned] == ["spec rule: schedule.persistent"]
    persistent = load_spec(ROOT / "specs" / "h100_wgmma_d128_persistent_q2.yaml")
    at = S.choice_of(persistent, S.default_space(persistent))
    assert at.blocks == (True, 2) and at.tag.endswith("pbq2")
    assert S.default_space(persistent).shown(at)["blocks"] == "persistent, 2 Q tiles"


def test_sweep_cases_of_a_base_whose_v_has_its_own_head_dim():
    """An MLA base (192 / 128): a 4-number shape takes the base's V head dim, a 5-number one must
    match it, and the cases (and the cache's shape records) keep it."""
    from attngen.eval.sweep.space import parse_cases, shape_of
    from attngen.spec import load_spec
    base = load_spec(Path(__file__).resolve().parent.parent / "specs" / "h100_wgmma_d192_v128.yaml")
    cases = parse_cases("4x16x2048x192,2x16x8192x192x128", base, "both")
    assert {(c.head_dim, c.head_dim_v) for c in cases} == {(192, 128)} and len(cases) == 4
    assert shape_of(cases[0]) == (4, 16, 2048, 192, 128)
    with pytest.raises(ValueError, match="V head dim 64, the base spec h100_wgmma_d192_v128 128"):
        parse_cases("4x16x2048x192x64", base, "no")


# -- backward specs ----------------------------------------------------------------------------------

WGMMA_BWD_D64 = ROOT / "specs" / "h100_bwd_d64_wgmma.yaml"
WGMMA_BWD_D128 = ROOT / "specs" / "h100_bwd_d128_wgmma.yaml"
MMA_BWD_D64 = ROOT / "specs" / "lab" / "h100_bwd_d64.yaml"


SHARED_KEYS = {"m64n128s2": "spec rule: warps.compute", "m128n128s2": "spec rule: warps.compute"}   # 4 warpgroups


@pytest.mark.parametrize("path, survivors, refused", [
    (WGMMA_BWD_D64, {"m64n64", "m64n128", "m128n128", "m64n64s2", "m128n64s2"},
     {"m128n64": "spec rule: tile.block_m", **SHARED_KEYS}),                                      # 64 rows / warpgroup
    (WGMMA_BWD_D128, {"m64n64", "m64n128", "m64n64s2", "m128n64s2"},
     {"m128n64": "spec rule: tile.block_m", "m128n128": "spec rule: tile.block_m", **SHARED_KEYS}),   # 296 registers
    (ROOT / "specs" / "h100_bwd_d256_wgmma.yaml", {"m64n64s2"},
     {"m64n64": "spec rule: tile.block_m", "m64n128": "spec rule: tile.block_m",
      "m128n64": "spec rule: tile.block_m", "m128n128": "spec rule: tile.block_m",
      "m128n64s2": "smem budget", **SHARED_KEYS}),   # dK and dV split by columns only; 128 queries: two
                                                                  # stages of Q and dO past the budget
])
def test_wgmma_backward_space(path, survivors, refused):
    base = load_spec(path)
    sp = S.default_space(base)
    assert sp.names == ("block_m", "block_n", "key_sharing") and sp.block_m == (64, 128) and sp.block_n == (64, 128)
    assert sp.key_sharing == (1, 2)
    kept, pruned = S.prune(base, sp)
    assert {c.choice.tag for c in kept} == survivors
    assert {p.choice.tag: p.reason for p in pruned} == refused
    for tag, warps in (("m64n64", 4), ("m64n64s2", 8)):
        one = next((c for c in kept if c.choice.tag == tag), None)
        assert one is None or (one.spec.compute_warps == warps and len(one.sources) == 3)   # main, preprocess, convert
    assert S.choice_of(base) in {c.choice for c in kept}


def test_mma_backward_space_moves_warps_with_keys():
    base = load_spec(MMA_BWD_D64)
    sp = S.default_space(base)
    assert sp.names == ("block_m", "block_n", "query_stages", "query_chunk", "warp_keys") and sp.size == 48
    kept, _ = S.prune(base, sp)
    by_tag = {c.choice.tag: c for c in kept}
    assert by_tag["m64n64s1c32k16"].spec.compute_warps == 4 and by_tag["m128n128s2c64k16"].spec.compute_warps == 8
    # 32 keys per warp: split by queries (k32) or by columns (k32c), chunks of 32 (64 would hold 256 fp32
    # accumulators), each warp's share of the block in whole chunks
    k32, k32c = by_tag["m128n128s2c32k32"].spec, by_tag["m128n128s2c32k32c"].spec
    assert (k32.warp_keys, k32.warp_split, k32c.warp_split) == (32, "queries", "columns")
    assert "m128n128s2c64k32" not in by_tag and "m64n128s2c64k32" not in by_tag
    assert S.choice_of(base).tag == "m128n128s2c64k16"
    # at d128 the space around the 16-key spec reaches the column split, and back
    d128 = S.default_space(load_spec(ROOT / "specs" / "h100_bwd_d128.yaml"))
    kept128 = {c.choice.tag for c in S.prune(load_spec(ROOT / "specs" / "h100_bwd_d128.yaml"), d128)[0]}
    assert "m128n128s1c32k32c" in kept128 and "m128n128s1c32k16" in kept128 and "m128n128s1c32k32" not in kept128
    assert S.choice_of(load_spec(ROOT / "specs" / "lab" / "h100_bwd_d128_k32.yaml")).tag == "m128n128s1c32k32c"


class BackwardStub(StubMeasurer):
    """The stub GPU, recording what a backward sweep hands it."""

    def __init__(self):
        super().__init__()
        self.parts, self.flash_calls = [], []

    def measure(self, plan, sources, shape, causal):
        self.parts.append(len(sources))
        return S.Measurement("ok", 1000.0 / plan.block_m + (5 if causal else 0))

    def flash_time(self, shape, dtype, causal, call):
        self.flash_calls.append(call)
        return 100.0


def test_backward_sweep_times_the_backward_call(tmp_path, stub_nvcc):
    base = load_spec(WGMMA_BWD_D64)
    cases = S.parse_cases("1x2x256x64", base, "both")
    assert [type(c).__name__ for c in cases] == ["BackwardCase", "BackwardCase"]
    stub = BackwardStub()
    report = S.run_sweep(base, S.default_space(base), S.SweepOptions(cases), arch="sm_90", measurer=stub,
                         cache=S.RecordCache(tmp_path / "rec"))
    assert set(stub.parts) == {3} and stub.flash_calls == ["backward", "backward"]
    data = S.report_dict(report)
    assert data["call"] == "backward"
    best = data["cases"][0]["ranking"][0]
    assert best["name"] == "h100_bwd_d64_wgmma_m128n128" and best["median_us"] == pytest.approx(1000 / 128)
    assert cases[0].flops == 2.5 * Case(1, 2, 256, 64, "fp16", False).flops     # the backward's five products
    assert best["tflops"] == pytest.approx(cases[0].tflops(1000 / 128))


def test_backward_sweep_reports_make_backward_entries():
    from attngen.eval.dispatch_table import backward_entries, forward_entries
    report = {"base": "h100_bwd_d64_wgmma", "call": "backward", "gpu": "NVIDIA H200", "arch": "sm_90a",
              "cases": [{"shape": [4, 16, 2048, 64], "dtype": "fp16", "causal": True, "label": "4x16x2048x64 fp16 causal",
                         "ranking": [{"name": "h100_bwd_d64_wgmma", "median_us": 350.0},
                                     {"name": "h100_bwd_d64_wgmma_m64n128", "median_us": 390.0}]}]}
    assert forward_entries([("s.json", report)]) == []
    (entry,) = backward_entries([("s.json", report)])
    assert (entry.call, entry.arch, entry.mask, entry.spec, entry.us, entry.runner_up) == \
        ("backward", "sm_90", "causal", "h100_bwd_d64_wgmma", 350.0, "h100_bwd_d64_wgmma_m64n128")


# -- e4m3 specs ----------------------------------------------------------------------------------

WGMMA_FP8_D128 = ROOT / "specs" / "h100_wgmma_d128_fp8.yaml"


def test_e4m3_sweep_keeps_the_kinds_rules_and_times_its_call(tmp_path, stub_nvcc):
    """An e4m3 base sweeps the wgmma axes under its own kind's rules (O from the registers, k32 key
    steps), times candidates on the e4m3 call beside flash in fp16, and reports the call so that
    `attngen dispatch --from` makes forward_fp8 entries. (Two of the kind's axes, a few values each:
    the full space takes minutes to prune.)"""
    from attngen.core.search_space import SearchSpace
    base = load_spec(WGMMA_FP8_D128)
    full = S.default_space(base)
    axes = {a.name: a for a in full.axes}
    sp = SearchSpace((replace(axes["block_n"], values=(128, 176, 192)),
                      replace(axes["epilogue"], values=("registers", "tma"))))
    kept, pruned = S.prune(base, sp)
    assert {c.spec.tile.block_n for c in kept} == {128, 192} and {c.spec.epilogue for c in kept} == {"registers"}
    assert {p.reason for p in pruned} == {"spec rule: epilogue", "spec rule: tile.block_n"}   # tma; 176 keys
    cases = S.parse_cases("1x2x256x128", base, "no")
    assert [type(c).__name__ for c in cases] == ["Fp8Case"]
    stub = BackwardStub()
    report = S.run_sweep(base, sp, S.SweepOptions(cases), arch="sm_90", measurer=stub,
                         cache=S.RecordCache(tmp_path / "rec"))
    assert stub.flash_calls == ["forward_fp8"]
    data = S.report_dict(report)
    assert data["call"] == "forward_fp8" and data["cases"][0]["dtype"] == "e4m3"
    from attngen.eval.dispatch_table import call_entries
    (entry,) = call_entries([("s.json", {**data, "gpu": "NVIDIA H200"})], "forward_fp8")
    assert (entry.call, entry.dtype, entry.head_dim, entry.mask) == ("forward_fp8", "e4m3", 128, "none")


def test_an_e4m3_base_sweeps_k_rows_and_an_fp16_base_does_not():
    """K's row order is an axis of e4m3 bases alone: in_order names no tag, even_odd "keo", and each
    candidate's spec and plan carry its order."""
    from attngen.core.search_space import SearchSpace
    base = load_spec(WGMMA_FP8_D128)
    axes = {a.name: a for a in S.default_space(base).axes}
    assert S.default_space(base).names[-1] == "k_rows" and axes["k_rows"].values == ("in_order", "even_odd")
    kept, pruned = S.prune(base, SearchSpace((replace(axes["block_n"], values=(192,)), axes["k_rows"])))
    assert not pruned
    assert [(c.name, c.spec.k_rows, c.plan.fragments.k_even_odd) for c in kept] == [
        ("h100_wgmma_d128_fp8_n192", "in_order", False), ("h100_wgmma_d128_fp8_n192keo", "even_odd", True)]
    fp16 = load_spec(ROOT / "specs" / "lab" / "h100_wgmma_d128.yaml")
    assert "k_rows" not in S.default_space(fp16).names
