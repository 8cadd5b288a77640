"""Launch records: the dispatcher's first call loads a served spec's kernel from
generated/<name>.launch.json (a LaunchPlan) instead of parsing the spec and building its plan.

A LaunchPlan must answer every question the runtime asks of a plan as the full plan does; a record
is used only while it is provably current (the manifest, the spec file, the cell, the sources), and
anything else falls back to the full plan with the same sources."""
from __future__ import annotations

import functools
import hashlib
import json
import shutil
from pathlib import Path

import pytest

import attngen.compile as compile_mod
import attngen.shipped
from attngen.core.calls import call_named
from attngen.core.launch_plan import LaunchPlan, has_launch_record, launch_record
from attngen.core.launch_rules import accum_rows, varlen_accum_rows
from attngen.core.spec_cells import cell_at
from attngen.ops.dispatch import DISPATCH, SPECS_DIR
from attngen.plan import make_plan
from attngen.runtime.calls import kernel_class
from attngen.runtime.calls.shared import mask_fields
from attngen.runtime.kernel import bundle_of, launch_bundle
from attngen.shipped import committed_launch, launch_name
from attngen.spec import parse_cell
from spec_sample import sampled

ROOT = Path(__file__).resolve().parent.parent
SERVED = sorted({e.spec for e in DISPATCH.entries})
# The default run checks the first served spec of each kind and call convention (every convention's
# arithmetic, every kind's plan); CI's exhaustive run checks the rest (tests/spec_sample.py says why).
_FIRST = {}
for _name in SERVED:
    _plan = make_plan(parse_cell(cell_at(SPECS_DIR / f"{_name}.yaml"), _name))
    _FIRST.setdefault((_plan.kind.name, _plan.kind.calls), _name)
SERVED_SAMPLE = frozenset(_FIRST.values())
SERVED_PARAMS = sampled(SERVED, SERVED_SAMPLE.__contains__, SERVED)
ARCHES = ("sm_80", "sm_89", "sm_90", "sm_90a")
SHAPES = [(1, 1, 1), (2, 8, 4096), (3, 32, 129), (16, 16, 1000), (1, 128, 65536)]
SM_COUNTS = (None, 1, 132)


@functools.cache
def full_plan(name: str):
    cell = cell_at(SPECS_DIR / f"{name}.yaml")
    return make_plan(parse_cell(cell, str(cell.file)))


def recorded(plan) -> LaunchPlan:
    """The plan through its record and back, as the committed file holds it (JSON text)."""
    return LaunchPlan.from_record(json.loads(json.dumps(launch_record(plan))))


def arch_answer(plan, arch: str):
    try:
        return plan.compile_arch(arch)
    except ValueError as exc:
        return ("refused", str(exc))


def runtime_view(plan) -> dict:
    """Every attribute and method result a Kernel and its call conventions read of a plan."""
    view = {
        "spec": (plan.spec.name, plan.spec.dtype, plan.spec.out_dtype),
        "kind": (plan.kind.name, plan.kind.calls), "convention": kernel_class(plan),
        "target": plan.target, "masks": plan.masks,
        "mask_variants": tuple(map(id, plan.mask_variants)), "score_variants": tuple(map(id, plan.score_variants)),
        "mask_fields": mask_fields(plan),
        "parts": tuple((p.name, p.file_name, p.functions, p.threads, p.awaits_predecessor, p.awaiting_twins)
                       for p in plan.parts),
        "functions": plan.functions, "entry_functions": plan.entry_functions,
        "awaiting_entry_functions": plan.awaiting_entry_functions,
        "abi": plan.abi, "abi_size": plan.abi.size,
        "numbers": (plan.head_dim, plan.v_dim, plan.block_m, plan.block_n, plan.threads, plan.smem_bytes,
                    plan.smem_dynamic, plan.arch_suffix, plan.persistent),
        "tensor_maps": plan.tensor_maps, "map_fields": tuple(m.abi_field for m in plan.tensor_maps),
        "compile_arch": tuple(arch_answer(plan, a) for a in ARCHES),
        "grid": tuple(plan.grid(b, h, s, n) for b, h, s in SHAPES for n in SM_COUNTS),
        "varlen_grid": tuple(plan.varlen_grid(b, h, s) for b, h, s in SHAPES),
    }
    convention = call_named(plan.kind.calls)
    if convention.name == "decode":
        combine = plan.combine_part
        view["decode"] = (plan.max_splits, plan.paged, plan.unsplit_in_flight, plan.kv_dtype, plan.append,
                          tuple(plan.split_key(m, s) for m in plan.masks for s in (1, 2, 7, 128)),
                          tuple(plan.merges_in_kernel(s) for s in (1, 2, 7)),
                          None if combine is None else (combine.name, combine.functions, combine.threads))
    if convention.gradients:
        view["backward"] = (tuple(accum_rows(plan, n) for n in (1, 63, 64, 65, 4097)),
                            tuple(varlen_accum_rows(plan, n, b) for n in (1, 100, 4097) for b in (1, 3)),
                            tuple(plan.dq_convert(key) for key in plan.entry_functions))
    return view


@pytest.mark.parametrize("name", SERVED_PARAMS)
def test_a_launch_plan_answers_as_the_full_plan(name):
    plan = full_plan(name)
    if not has_launch_record(plan):
        pytest.skip(f"{name} has expression variants: no record, loaded through its full plan")
    assert runtime_view(recorded(plan)) == runtime_view(plan)


@pytest.mark.parametrize("name", SERVED_PARAMS)
def test_the_dispatcher_loads_the_committed_record(name):
    """Every served spec with a record loads through it, as what the full plan records now."""
    plan = full_plan(name)
    path = SPECS_DIR / f"{name}.yaml"
    got, sources, label = launch_bundle(path)
    assert sources == bundle_of(path)[1] and label == bundle_of(path)[2]
    if has_launch_record(plan):
        assert isinstance(got, LaunchPlan) and got == recorded(plan)
    else:
        assert not isinstance(got, LaunchPlan) and committed_launch(path) is None


def test_most_served_specs_have_a_record():
    assert sum(has_launch_record(full_plan(n)) for n in SERVED) > 0.9 * len(SERVED)


def test_a_record_is_plain_json_of_registry_names():
    plan = full_plan("h100_fwd_d128_wgmma") if "h100_fwd_d128_wgmma" in SERVED else full_plan(SERVED[0])
    record = launch_record(plan)
    assert json.loads(json.dumps(record)) == record
    assert record["mask_variants"] == list(plan.masks)


# -- stale and tampered records ------------------------------------------------------------------

BUNDLE = "l4_bwd_d64"           # a served spec of three parts
TWIN = "h100_bwd_d128_wgmma_bf16"     # a dtype cell of h100_bwd_d128_wgmma.yaml


def full_path_taken(spec: Path) -> None:
    """No record: launch_bundle gives the full plan, with the sources rendering gives."""
    assert committed_launch(spec) is None
    plan, sources, _ = launch_bundle(spec)
    assert not isinstance(plan, LaunchPlan) and sources == bundle_of(spec)[1]


def relisted(folder: Path, name: str, data: bytes) -> None:
    """Write `data` as generated/`name` and list its hash in the manifest, as a build would."""
    (folder / name).write_bytes(data)
    manifest = json.loads((folder / attngen.shipped.MANIFEST).read_text())
    manifest["files"][name] = hashlib.sha256(data).hexdigest()
    (folder / attngen.shipped.MANIFEST).write_text(attngen.shipped.manifest_text(manifest))


def test_a_current_record_is_used(shipped_copy):
    for name in (BUNDLE, TWIN):
        assert isinstance(committed_launch(shipped_copy / "specs" / f"{name}.yaml")[0], LaunchPlan)


def test_a_hand_edited_record_is_refused(shipped_copy):
    spec = shipped_copy / "specs" / f"{BUNDLE}.yaml"
    record = shipped_copy / "generated" / launch_name(BUNDLE)
    record.write_text(record.read_text().replace('"block_n": ', '"block_n": 1'))
    full_path_taken(spec)


def test_a_spec_edited_since_build_has_no_record(shipped_copy):
    for name, file in ((BUNDLE, BUNDLE), (TWIN, "h100_bwd_d128_wgmma")):
        spec_file = shipped_copy / "specs" / f"{file}.yaml"
        spec_file.write_text(spec_file.read_text() + "# edited after the build\n")
        full_path_taken(shipped_copy / "specs" / f"{name}.yaml")


def test_changed_templates_or_code_mean_no_record(shipped_copy, monkeypatch):
    monkeypatch.setattr(attngen.shipped, "render_inputs", lambda: "0" * 64)
    full_path_taken(shipped_copy / "specs" / f"{BUNDLE}.yaml")


def test_a_file_that_also_names_the_cell_means_no_record(shipped_copy):
    twin = shipped_copy / "specs" / f"{TWIN}.yaml"
    twin.write_text((shipped_copy / "specs" / "h100_bwd_d128_wgmma.yaml").read_text())
    assert committed_launch(twin) is None


def test_a_record_listed_but_not_a_record_is_refused(shipped_copy):
    """A record the manifest lists (a build's own bytes) that is nonetheless no record of this format
    is refused without an exception, and the full plan is used."""
    spec = shipped_copy / "specs" / f"{BUNDLE}.yaml"
    gen = shipped_copy / "generated"
    good = json.loads((gen / launch_name(BUNDLE)).read_text())
    spec_file = {k: good["served_from"][k] for k in ("file", "file_sha256")}
    hostile = {"garbage": b"\x00not json", "not utf-8": b"\xff\xfe", "deep": b"[" * 5000 + b"]" * 5000,
               "a list": b"[]", "other format": json.dumps({**good, "format": 99}).encode(),
               "no abi": json.dumps({k: v for k, v in good.items() if k != "abi"}).encode(),
               "unknown mask": json.dumps({**good, "mask_variants": ["rm -rf /"]}).encode(),
               "spec outside the folder": json.dumps({**good, "served_from": {**good["served_from"],
                                                      "file": "../specs/l4_bwd_d64.yaml"}}).encode(),
               "another spec's plan": json.dumps({**good, "spec": {**good["spec"], "name": "phase4"}}).encode(),
               "no spec file": json.dumps({k: v for k, v in good.items() if k != "served_from"}).encode(),
               "no cell hash": json.dumps({**good, "served_from": spec_file}).encode(),
               "a number for a file": json.dumps({**good, "served_from": {**good["served_from"], "file": 7}}).encode()}
    for why, data in hostile.items():
        relisted(gen, launch_name(BUNDLE), data)
        assert committed_launch(spec) is None, why
    full_path_taken(spec)


def test_a_record_outside_the_shipped_folder_is_not_read(tmp_path):
    spec = tmp_path / f"{BUNDLE}.yaml"
    shutil.copy(SPECS_DIR / spec.name, spec)
    assert committed_launch(spec) is None


# -- nvcc's release, remembered per binary -------------------------------------------------------

@pytest.fixture
def fake_nvcc(tmp_path, monkeypatch):
    """An nvcc that counts its runs, and an empty cache."""
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path / "cache"))
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text(f"#!/bin/sh\necho run >> {tmp_path / 'runs'}\n"
                    "echo 'Cuda compilation tools, release 13.0, V13.0.48'\n")
    nvcc.chmod(0o755)
    compile_mod.nvcc_version.cache_clear()
    yield nvcc
    compile_mod.nvcc_version.cache_clear()


def runs(nvcc: Path) -> int:
    counter = nvcc.parent.parent / "runs"
    return len(counter.read_text().splitlines()) if counter.exists() else 0


def test_a_later_process_knows_the_release_without_running_nvcc(fake_nvcc):
    assert compile_mod.nvcc_version(str(fake_nvcc)) == "13.0.48" and runs(fake_nvcc) == 1
    compile_mod.nvcc_version.cache_clear()      # as a new process
    assert compile_mod.nvcc_version(str(fake_nvcc)) == "13.0.48" and runs(fake_nvcc) == 1


def test_a_replaced_nvcc_is_asked_again(fake_nvcc):
    compile_mod.nvcc_version(str(fake_nvcc))
    fake_nvcc.write_text(fake_nvcc.read_text().replace("V13.0.48", "V13.1.2"))
    compile_mod.nvcc_version.cache_clear()
    assert compile_mod.nvcc_version(str(fake_nvcc)) == "13.1.2" and runs(fake_nvcc) == 2


def test_a_tampered_memo_is_not_believed(fake_nvcc):
    compile_mod.nvcc_version(str(fake_nvcc))
    memo = compile_mod.nvcc_memo_path(str(fake_nvcc))
    for text in ("not a version\n", "", "1" * 500):
        memo.write_text(text)
        compile_mod.nvcc_version.cache_clear()
        assert compile_mod.nvcc_version(str(fake_nvcc)) == "13.0.48"
    assert memo.read_text() == "13.0.48"


def test_an_unwritable_cache_only_costs_a_run(fake_nvcc, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(blocker))
    assert compile_mod.nvcc_version(str(fake_nvcc)) == "13.0.48"


def test_a_map_that_takes_every_second_row_keeps_it_through_the_record():
    """A tensor map's row_stride (e4m3 k_rows: even_odd) survives the record; at 1 the record leaves it out, so the
    records of every other plan read as before."""
    from attngen.spec import load_spec
    plan = make_plan(load_spec(ROOT / "specs" / "h100_wgmma_d128_fp8.yaml"))
    back = recorded(plan)
    assert back.tensor_maps == plan.tensor_maps
    assert [m.row_stride for m in back.tensor_maps] == [1, 2, 1]
    rows = launch_record(plan)["tensor_maps"]
    assert [len(r) for r in rows] == [6, 7, 6]


def test_a_part_launched_as_a_programmatic_dependent_waits_before_it_reads_anything():
    """A part that awaits its predecessor is launched before the kernel ahead of it on the stream has ended
    (a rotary kernel that wrote q, a copy into the cache, the split kernel whose partials a combine merges, the
    backward's preprocess whose dot products its main kernel reads), so the first statement of each of its entry
    points waits for that kernel's writes. Checked in the generated source of every such part of every spec
    (reading them takes well under a second)."""
    from spec_sample import PLANS
    generated = Path(__file__).resolve().parent.parent / "generated"
    checked = twins = 0
    for plan in PLANS.values():
        for part in plan.parts:
            if not part.awaits_predecessor and not part.awaiting_twins:
                continue
            source = (generated / part.file_name).read_text()
            # an awaiting twin waits first; the usual entry point it twins does not (its code stays as it was)
            awaiting = part.functions if part.awaits_predecessor else part.awaiting_twins
            usual = () if part.awaits_predecessor else part.functions
            for names, waits in ((awaiting, True), (usual, False)):
                for _key, name in names:
                    _, _, body = source.partition(f"\n{name}(")
                    assert body, f"{part.file_name}: no entry point {name}"
                    first = body.split("{", 1)[1].strip().splitlines()[0]
                    assert first.split("::")[-1].startswith("await_predecessor();") == waits, f"{name}: {first}"
                    checked += 1
            twins += len(part.awaiting_twins)
    assert checked > 500 and twins >= 38


def test_awaiting_twins_cover_every_mask_but_not_varlen():
    """schedule.awaiting_twins: one twin per mask function, named <function>_awaits, and none for varlen
    functions (a varlen call's work is not known on the host); without the key, no twin."""
    from attngen.core.forward_plan import awaiting_twin_functions
    functions = (("none", "f_none"), ("causal", "f_causal"), ("none_varlen", "f_none_varlen"))
    assert awaiting_twin_functions(functions) == (("none", "f_none_awaits"), ("causal", "f_causal_awaits"))
    twinned = full_plan("h100_wgmma_d128_persistent_q2_bf16")
    assert twinned.awaiting_entry_functions == {m: f"{twinned.entry_functions[m]}_awaits" for m in ("none", "causal")}
    assert recorded(twinned).awaiting_entry_functions == twinned.awaiting_entry_functions
    plain = full_plan("h100_wgmma_d128_n176c2ps2r24x240ppet_bf16")
    assert plain.awaiting_entry_functions == {} and "awaiting_twins" not in launch_record(plain)["parts"][0]


def test_short_forward_calls_launch_the_awaiting_twin():
    """launches_awaiting_twin: the twin for calls of at most the largest short cell measured faster as a
    programmatic dependent (4x16x2048x2048 scores, a causal call's halved), the usual function above it;
    a Kernel picks by that rule only where its plan has a twin for the mask."""
    from types import SimpleNamespace
    from attngen.core.launch_rules import launches_awaiting_twin
    from attngen.runtime.kernel import Kernel
    assert launches_awaiting_twin(4, 16, 2048, 2048, False) and launches_awaiting_twin(16, 16, 512, 512, False)
    assert not launches_awaiting_twin(4, 16, 2048, 2049, False)
    assert launches_awaiting_twin(8, 16, 2048, 2048, True) and not launches_awaiting_twin(8, 16, 2048, 2048, False)
    assert not launches_awaiting_twin(2, 16, 8192, 8192, True) and not launches_awaiting_twin(1, 16, 16384, 16384, False)
    kernel = SimpleNamespace(entry={"none": "f_none", "window": "f_window"}, awaiting_entry={"none": "f_none_awaits"})
    pick = Kernel._forward_entry
    assert pick(kernel, "none", 4, 16, 2048, 2048) == "f_none_awaits"
    assert pick(kernel, "none", 2, 16, 8192, 8192) == "f_none"
    assert pick(kernel, "window", 1, 1, 64, 64) == "f_window"


def test_pycuda_launches_an_awaiting_twin_as_the_function_it_twins(monkeypatch):
    """A short forward call launches its awaiting twin; verify's PyCUDA launch of the same call launches the
    usual function instead (PyCUDA launches no programmatic dependent), so the case compares the two."""
    import contextlib
    from types import SimpleNamespace
    from attngen.eval.verify import pycuda_launch
    from attngen.runtime.kernel import Function
    monkeypatch.setattr(pycuda_launch, "argument_buffer", lambda params, gap, size: params)
    launched = []
    launcher = object.__new__(pycuda_launch.PycudaLauncher)
    launcher.launches = 0
    launcher._primary = lambda index: contextlib.nullcontext()
    launcher._function = lambda kernel, index, fn: (lambda *a, **kw: launched.append(fn.name), 0, -1)
    functions = {"f_causal": Function("f_causal", 1, 128, 0), "f_none": Function("f_none", 3, 128, 0),
                 "f_causal_awaits": Function("f_causal_awaits", 2, 128, 0, True)}
    stream = SimpleNamespace(cuda_stream=0)
    kernel = SimpleNamespace(_torch=SimpleNamespace(cuda=SimpleNamespace(current_stream=lambda index: stream)),
                             entry={"causal": "f_causal", "none": "f_none"},
                             awaiting_entry={"causal": "f_causal_awaits"}, functions=functions)
    for name in ("f_causal_awaits", "f_none"):
        prepared = SimpleNamespace(info=SimpleNamespace(index=0), launches=((functions[name], None, (1, 1, 1)),))
        launcher.launch(kernel, prepared, bytes(8))
    assert launched == ["f_causal", "f_none"] and launcher.launches == 2


def test_pycuda_launches_a_split_function_with_the_shared_memory_it_was_loaded_with(monkeypatch):
    """A programmatic split launch of few blocks asks for a lone block's shared memory (launch_rules.launches_alone);
    verify's PyCUDA launch, which waits for the kernel ahead, launches the function as loaded, so its shared-memory
    limit, set once per function, always covers the launch whichever grid came first."""
    import contextlib
    from types import SimpleNamespace
    from attngen.eval.verify import pycuda_launch
    from attngen.runtime.kernel import Function
    monkeypatch.setattr(pycuda_launch, "argument_buffer", lambda params, gap, size: params)
    shared = []
    launcher = object.__new__(pycuda_launch.PycudaLauncher)
    launcher.launches = 0
    launcher._primary = lambda index: contextlib.nullcontext()
    launcher._function = lambda kernel, index, fn: (lambda *a, **kw: shared.append((fn.smem_dynamic, kw["shared"])),
                                                    0, -1)
    split = Function("split", 1, 128, 115200, True)
    stream = SimpleNamespace(cuda_stream=0)
    kernel = SimpleNamespace(_torch=SimpleNamespace(cuda=SimpleNamespace(current_stream=lambda index: stream)),
                             entry={"none": "split"}, awaiting_entry={}, functions={"split": split})
    for fn in (split, split._replace(smem_dynamic=115713)):
        prepared = SimpleNamespace(info=SimpleNamespace(index=0), launches=((fn, None, (1, 128, 1)),))
        launcher.launch(kernel, prepared, bytes(8))
    assert shared == [(115200, 115200), (115200, 115200)]
