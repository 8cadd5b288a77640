"""nvcc: every spec compiles for its target's arch (L4 specs for sm_90 too) without spills, and ptxas's
shared memory equals the planner's. The ptxas parser is tested on a literal log and needs no nvcc."""
from __future__ import annotations

import json
import re
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from click.testing import CliRunner

from attngen import compile as compile_mod
from attngen.cli import main
from attngen.compile import compile_source, parse_ptxas
from attngen.errors import ToolError
from attngen.plan import make_plan
from attngen.render import render_spec_file
from attngen.spec import load_spec
from attngen.core.spec_cells import cell_at
from spec_sample import PLANS, SAMPLE, SPEC_PATHS, sampled, spec_text

ROOT = Path(__file__).resolve().parents[1]
SPEC_FILES = SPEC_PATHS
# The first spec that renders one file (a bundle, decode or backward, renders several), alone in its file.
ONE_PART = next(p for p in SPEC_FILES if "\ndecode:" not in spec_text(p) and "\nbackward:" not in spec_text(p)
                and cell_at(p).alone)
L4_ARCH, HOPPER_ARCH = "sm_89", "sm_90"


def _archs(path) -> list[str]:
    """The archs a spec compiles for: its target's (sm_90a for wgmma), and sm_90 too for an L4 spec, since
    H100/H200 machines load L4 specs (verify runs every spec there). An H100/H200 spec is not compiled
    for sm_89: no dispatch entry serves it on an L4 (tests/test_dispatch.py keeps entries on their
    specs' targets), and leaving those 246 compiles out keeps CI's exhaustive run inside its budget."""
    plan = PLANS[path]
    if plan.arch_suffix:
        return [plan.compile_arch(plan.target.arch)]
    return [L4_ARCH, HOPPER_ARCH] if plan.target.arch == L4_ARCH else [plan.target.arch]


CASES = [(p, a) for p in SPEC_FILES for a in _archs(p)]


PTXAS_LOG = """\
/tmp/attngen-x/kernel.cu(40): warning #177-D: variable "attngen_t::kHeadDim" was declared but never referenced
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'attngen_t_causal' for 'sm_90'
ptxas info    : Function properties for attngen_t_causal
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 40960 bytes smem
ptxas info    : Compile time = 50.090 ms
ptxas info    : Compiling entry function 'attngen_t_none' for 'sm_90'
ptxas info    : Function properties for attngen_t_none
    48 bytes stack frame, 44 bytes spill stores, 40 bytes spill loads
ptxas info    : Used 255 registers, used 5 barriers, 29312 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function 'attngen_t_dyn' for 'sm_89'
ptxas info    : Function properties for attngen_t_dyn
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 96 registers, 384 bytes cmem[0]
"""


def test_parse_ptxas():
    fs = parse_ptxas(PTXAS_LOG)
    assert [f.name for f in fs] == ["attngen_t_causal", "attngen_t_none", "attngen_t_dyn"]
    a, b, c = fs
    assert (a.registers, a.spill_stores, a.spill_loads, a.stack_bytes, a.smem_bytes, a.barriers) == (168, 0, 0, 0, 40960, 1)
    assert not a.spills
    assert (b.registers, b.spill_stores, b.spill_loads, b.stack_bytes, b.smem_bytes, b.barriers) == (255, 44, 40, 48, 29312, 5)
    assert b.spills
    # dynamic shared memory only: ptxas prints no smem and no barriers
    assert (c.registers, c.smem_bytes, c.barriers, c.spills) == (96, 0, 0, False)
    assert b.as_dict()["spill_stores"] == 44


def test_parse_ptxas_empty():
    assert parse_ptxas("") == ()
    assert parse_ptxas("nvcc warning : something unrelated\n") == ()


class _Lazy(dict):
    """A dict whose missing entries are made on first use."""

    def __init__(self, make):
        super().__init__()
        self._make = make

    def __missing__(self, key):
        value = self[key] = self._make(key)
        return value


@pytest.fixture(scope="session")
def compiled(request):
    """(spec, arch) compiled in parallel, nvcc runs being subprocesses, so threads suffice. Only the
    cases this session selected compile, each as soon as a thread is free, and each test waits for
    its own: the run shows progress test by test, not after one long silent setup. Under xdist every
    worker collects every case, so there a case compiles when its test asks, and the workers are the
    parallelism."""
    def render(path):
        cwd = os.getcwd()
        os.chdir(ROOT)  # headers name specs relative to the repository root, as in generated/
        try:
            return render_spec_file(path.relative_to(ROOT))
        finally:
            os.chdir(cwd)

    rendered = _Lazy(render)

    def one(parts, arch):
        try:   # one result per part of the spec's bundle
            return tuple(compile_source(src, arch) for src in parts)
        except Exception as exc:  # reported by the test of that case
            return exc

    pool = ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2))

    def submit(case):
        path, arch = case   # rendered here, on the session's thread: rendering changes directory
        return pool.submit(one, [src for _, src in rendered[path].files], arch)

    futures = _Lazy(submit)
    futures[(ONE_PART, "sm_89")].result()      # test_cache_hit expects it cached, whatever was selected
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        for item in request.session.items:
            params = getattr(getattr(item, "callspec", None), "params", {})
            if "compiled" in item.fixturenames and {"path", "arch"} <= params.keys():
                futures[(params["path"], params["arch"])]      # submits it

    class Results:
        def __getitem__(self, case):
            return futures[case].result()

    yield rendered, Results()
    pool.shutdown(cancel_futures=True)


@pytest.mark.nvcc
@pytest.mark.parametrize("path, arch", sampled(CASES, lambda case: case[0] in SAMPLE, [f"{p.stem}-{a}" for p, a in CASES]))
def test_compiles_without_spills_and_smem_matches_plan(compiled, path, arch):
    rendered, results = compiled
    res = results[(path, arch)]
    if isinstance(res, Exception):
        pytest.fail(f"{path.name} for {arch}: {res}")
    plan = rendered[path].plan
    assert len(res) == len(plan.parts)
    for part, part_res in zip(plan.parts, res):
        assert sorted(f.name for f in part_res.functions) == sorted(fn for _, fn in part.functions + part.awaiting_twins)
        registers = {f.name: f.registers for f in part_res.functions}
        for key, twin in part.awaiting_twins:   # the same kernel with a wait first: the same registers
            assert registers[twin] == registers[dict(part.functions)[key]], f"{twin} ({arch})"
        want = part.static_smem if part.static_smem is not None else 0 if plan.smem_dynamic else plan.smem_bytes
        for f in part_res.functions:
            assert not f.spills, f"{f.name} ({arch}) spills: {f.spill_stores} B stored, {f.spill_loads} B loaded"
            assert f.smem_bytes == want, (f"{f.name} ({arch}): ptxas static smem {f.smem_bytes} B, plan {want} B"
                                          f" ({'dynamic' if plan.smem_dynamic else 'static'})")
            assert f.registers <= 255
        assert part_res.cubin[:4] == b"\x7fELF"
        # setmaxnreg ignored, a wgmma serialized or an arrive injected (`attngen compile` exits 1 on them too)
        assert not part_res.wgmma_warnings, f"{path.name} ({arch}): {part_res.wgmma_warnings[0]}"


@pytest.mark.nvcc
def test_cache_hit(compiled):
    rendered, _ = compiled
    path = ONE_PART
    res = compile_source(rendered[path].source, "sm_89")
    assert res.cached


@pytest.mark.nvcc
def test_compile_command(compiled, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    spec = str(ONE_PART.relative_to(ROOT))
    result = CliRunner().invoke(main, ["compile", spec, "--arch", "sm_89", "--json", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output[result.output.index("["):])
    assert report and all(e["smem_matches_plan"] and e["arch"] == "sm_89" for e in report)
    assert list(tmp_path.glob("*.sm_89.cubin"))


def test_find_nvcc_uses_cuda_home(monkeypatch, tmp_path):
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text("")
    monkeypatch.setattr(compile_mod.shutil, "which", lambda name: None)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert compile_mod.find_nvcc() == str(nvcc)


def test_compile_without_nvcc_exits_3(monkeypatch):
    # A missing tool is one message and exit 3, not a traceback.
    def no_nvcc():
        raise ToolError("nvcc not found: install the CUDA toolkit and put its bin/ on PATH (or set CUDA_HOME)")
    monkeypatch.setattr(compile_mod, "find_nvcc", no_nvcc)
    monkeypatch.chdir(ROOT)
    result = CliRunner().invoke(main, ["compile", str(ONE_PART.relative_to(ROOT)), "--arch", "sm_89"])
    assert result.exit_code == 3, result.output
    assert "attngen: nvcc not found" in result.output and "Traceback" not in result.output


def test_bad_arch_exits_2(monkeypatch):
    # A malformed --arch is a bad option (exit 2), refused before nvcc is looked for.
    monkeypatch.chdir(ROOT)
    result = CliRunner().invoke(main, ["compile", str(ONE_PART.relative_to(ROOT)), "--arch", "89"])
    assert result.exit_code == 2 and "sm_89 or sm_90a" in result.output


def test_compile_source_refuses_a_malformed_arch():
    with pytest.raises(ToolError, match="sm_89 or sm_90a"):
        compile_source("", "89")


def _row(name, smem, plan, dynamic, arch="sm_89"):
    return {"spec": "s.yaml", "arch": arch, "name": name, "registers": 128, "spill_stores": 0, "spill_loads": 0,
            "stack_bytes": 0, "smem_bytes": smem, "barriers": 1, "plan_smem_bytes": plan,
            "plan_smem_dynamic": dynamic, "smem_matches_plan": True}


def test_compile_table_long_names_and_dynamic_smem():
    from attngen.cli.compile import format_compile
    long_name = "attngen_l4_mma_d128_optin_m128n32w4s4x3_causal"      # 47 characters
    text = format_compile([_row(long_name, 0, 98304, True), _row("attngen_phase4_none", 29312, 29312, False),
                           _row("attngen_phase4_none", 29312, 29312, False, arch="sm_100f")])
    header, dyn, static, wide_arch, note = text.splitlines()
    # every column starts at the same offset in every row, however long the name or arch
    for col in ("regs", "smem", "plan"):
        end = header.index(col) + len(col)
        for row in (dyn, static, wide_arch):
            assert row[end - 1] != " " and row[end:end + 1] in ("", " "), (col, row)
    assert dyn.split()[-2:] == ["98304", "dyn"] and dyn.split()[-3] == "0"
    assert static.split()[-2:] == ["29312", "29312"]
    assert note.startswith("smem: static shared memory") and "dynamic" in note and "0 static" in note
    assert all(line == line.rstrip() for line in text.splitlines())


def test_compile_table_without_dynamic_smem_has_no_note():
    from attngen.cli.compile import format_compile
    assert len(format_compile([_row("attngen_phase4_none", 29312, 29312, False)]).splitlines()) == 2


@pytest.mark.nvcc
def test_same_cubin_from_two_builds():
    # nvcc records the source path (and seeds internal symbol names with it): two builds in two
    # temporary directories used to differ in 28 bytes.
    source = render_spec_file(ONE_PART).source
    nvcc = compile_mod.find_nvcc()
    a = compile_mod.run_nvcc(source, "sm_89", nvcc)
    b = compile_mod.run_nvcc(source, "sm_89", nvcc)
    assert a.cubin == b.cubin
    assert b"attngen-" not in a.cubin            # no temporary directory name inside


@pytest.mark.nvcc
def test_damaged_cache_entry_is_rebuilt_to_the_same_bytes(monkeypatch, tmp_path):
    # A truncated cubin and an empty ptxas.log used to be returned as a cache hit (exit 0, empty table).
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path))
    source = render_spec_file(ONE_PART).source
    first = compile_source(source, "sm_89")
    entry = tmp_path / compile_mod.cache_key(source, "sm_89", compile_mod.find_nvcc())
    (entry / "kernel.cubin").write_bytes(first.cubin[: len(first.cubin) // 2])
    (entry / "ptxas.log").write_text("")
    warnings = []
    again = compile_source(source, "sm_89", on_warning=warnings.append)
    assert not again.cached and len(warnings) == 1 and "damaged cache entry" in warnings[0]
    assert again.cubin == first.cubin and again.functions == first.functions
    assert compile_source(source, "sm_89").cached


@pytest.mark.nvcc
def test_compile_command_dynamic_smem(monkeypatch):
    # Chosen from the plans, not the rendered specs (rendering all of them took 20 s), an L4 spec first.
    dynamic = [p for p in SPEC_FILES if PLANS[p].smem_dynamic and len(PLANS[p].parts) == 1]
    assert dynamic, "no spec in specs/ uses dynamic shared memory"
    spec = next((p for p in dynamic if PLANS[p].target.arch == L4_ARCH), dynamic[0])
    monkeypatch.chdir(ROOT)
    result = CliRunner().invoke(main, ["compile", str(spec.relative_to(ROOT)), "--arch", L4_ARCH])
    assert result.exit_code == 0, result.output
    rows = [ln for ln in result.output.splitlines() if ln.startswith("attngen_")]
    plan = PLANS[spec].smem_bytes
    assert rows and all(ln.split()[-3:] == ["0", str(plan), "dyn"] for ln in rows), result.output
    assert "dyn: the plan's shared memory is dynamic" in result.output


@pytest.mark.nvcc
def test_explain_arch_adds_registers(compiled, monkeypatch):
    monkeypatch.chdir(ROOT)
    spec = str(ONE_PART.relative_to(ROOT))
    arch = compiled[0][ONE_PART].plan.target.arch
    result = CliRunner().invoke(main, ["explain", spec, "--arch", arch, "--json"])
    assert result.exit_code == 0, result.output
    d = json.loads(result.output)
    assert d["registers"] > 0 and d["registers_arch"] == arch and d["blocks_per_sm_by_registers"] >= 1


@pytest.mark.nvcc
def test_param_offsets_from_the_cubin():
    """A Params struct with 64-byte aligned TMA maps (a __grid_constant__ parameter) starts past a
    gap in the parameter buffer; an 8-byte aligned one at 0. The runtime pads a launch by this."""
    from attngen.cubin import param_offsets
    for name, gap in (("h100_wgmma_d128", 48), ("l4_mma_d64", 0)):
        r = render_spec_file(ROOT / "specs" / f"{name}.yaml")
        res = compile_source(r.source, r.plan.compile_arch(r.plan.target.arch))
        assert param_offsets(res.cubin) == {fn: gap for _, fn in r.plan.functions}, name


@pytest.mark.nvcc
def test_ignored_setmaxnreg_is_reported():
    """Without a register cap at entry ptxas ignores setmaxnreg (C7508); `compile` must notice."""
    r = render_spec_file(ROOT / "specs" / "lab" / "h100_wgmma_d128.yaml")
    source = re.sub(r"__launch_bounds__\([^)]*\)", "", r.source)
    assert source != r.source
    res = compile_source(source, "sm_90a")
    assert any("C7508" in w for w in res.wgmma_warnings), res.log
    assert not compile_source(r.source, "sm_90a").wgmma_warnings


def test_tensor_map_strides():
    from attngen.runtime.tma import map_strides
    assert map_strides((2, 4, 100, 64), (25600, 6400, 64, 1), 2) == (128, 12800, 51200)    # bhsd
    assert map_strides((2, 4, 100, 64), (25600, 64, 256, 1), 2) == (512, 128, 51200)      # bshd
    # size-1 dimensions may carry any stride; the map gets a valid one
    assert map_strides((1, 1, 1, 64), (3, 3, 3, 1), 2) == (128, 128, 128)


def test_cubin_records_parse_whole_sections():
    """Every .nv.info record is 4 bytes, or 4 plus its size: a parse that went out of step raises."""
    from attngen.cubin import _records
    info = bytes([2, 0x4C, 1, 0]) + bytes([4, 0x17, 12, 0]) + bytes(6) + (48).to_bytes(2, "little") + bytes(4) \
        + bytes([3, 0x1B, 255, 0])
    assert [a for a, _ in _records(info)] == [0x4C, 0x17, 0x1B]
    with pytest.raises(ValueError):
        list(_records(bytes([9, 1, 0, 0])))


# One spec of each kind (the mma one with varlen functions), re-planned with a single mask: a plan's
# Params carries only its masks' fields, so a kernel must compile without the others'.
ONE_MASK_SPECS = ("phase4", "phase5_wmma", "h100_mma_d128_m128n32w4s4x3", "h100_wgmma_d128", "h200_decode_d128")


@pytest.mark.nvcc
@pytest.mark.parametrize("mask", ["none", "causal"])
@pytest.mark.parametrize("name", sampled(ONE_MASK_SPECS, "h100_mma_d128_m128n32w4s4x3".__eq__, ONE_MASK_SPECS))
def test_a_spec_with_one_mask_compiles(name, mask):
    from attngen.render import render_parts
    spec = load_spec(ROOT / "specs" / f"{name}.yaml")
    plan = make_plan(spec.model_copy(update={"name": f"{name}_{mask}_only", "masks": [mask]}))
    assert {f.name for f in plan.abi.fields} & {"causal_offset", "causal_from_end"} == set() or mask == "causal"
    arch = plan.compile_arch(plan.target.arch)
    for part in render_parts(plan, f"specs/{name}.yaml", ""):
        result = compile_source(part.source, arch)
        assert result.functions, part.file_name


@pytest.mark.nvcc
def test_item_overlap_keeps_every_wgmma_asynchronous():
    """schedule.item_overlap writes a query block's rows of O out while the next block's first S is in flight. The
    rows are packed before that S is issued, and the write-out sits on the one path from its issue to its wait, so
    ptxas serializes no wgmma and injects no wait or arrive (C7510-C7520), and nothing spills (d128 and d64 persistent
    cells with the key set here, compiled for sm_90a)."""
    from attngen.render import render_bundle
    from attngen.spec import parse_spec
    import yaml
    for name in ("h100_wgmma_d128_persistent_q2", "h100_wgmma_d64_persistent_q2"):
        spec = load_spec(ROOT / "specs" / f"{name}.yaml")
        data = spec.model_dump(mode="json", exclude_defaults=True, by_alias=True)
        data["schedule"]["item_overlap"] = True
        data["name"] = f"t_{name}_io"
        plan, sources, _ = render_bundle(parse_spec(yaml.safe_dump(data), f"t_{name}_io.yaml"))
        assert plan.fragments.item_overlap
        source = sources[0]
        issue = source.index("issue_scores(s, sQ, slot(0) + kSmem_k0, wg_row0);")
        assert issue < source.index("write_out_done();   // the item before, beside this S", issue)
        res = compile_source(source, "sm_90a")
        assert not res.wgmma_warnings, res.wgmma_warnings
        assert not any(f.spills for f in res.functions), [(f.name, f.spill_stores) for f in res.functions]


@pytest.mark.nvcc
def test_key_halves_fit_their_registers():
    """schedule.key_halves: 2 runs four consumer warpgroups beside the producer, each with about 112 registers: a d64
    block of 128 rows on 64-key tiles compiles for sm_90a with no spill and no serialized wgmma, the stage barriers
    count one half's warps, and the second half hands its part over on the merge barrier before the epilogue."""
    from attngen.render import render_bundle
    plan, sources, _ = render_bundle(load_spec(ROOT / "docs/hopper-h200/key_halves/trial_specs/h100_wgmma_d64_kh2_n64.yaml"))
    assert plan.fragments.key_halves == 2 and plan.fragments.consumer_warpgroups == 4
    source = sources[0]
    assert "mbarrier_init(smem_addr + kEmptyK + s * kBarrierBytes, kStageWarps);" in source
    assert source.index("hand_over_half(merged, o, row_max, row_sum);") < source.index("merge_half(merged, o, row_max")
    res = compile_source(source, "sm_90a")
    assert not res.wgmma_warnings, res.wgmma_warnings
    assert not any(f.spills for f in res.functions), [(f.name, f.spill_stores) for f in res.functions]
