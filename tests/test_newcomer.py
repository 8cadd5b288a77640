"""What a new user meets first: `build` refuses a spec whose description its plan contradicts (as
`check` would) and writes nothing for it, `build` of every spec ends with one summary line, and a
call the dispatch table has no entry for is answered in a few lines naming the nearest entries."""
from __future__ import annotations

import json
import shutil

import pytest

from attngen.ops.table import Entry, NEAREST_SHOWN, miss_message, select
from spec_sample import SPEC_PATHS
from hostile_helpers import ROOT, error_lines, invoke, mini_project

SUMMARY = "attngen build: "


def _narrowed_phase4(tmp_path):
    """The project copy with phase4's block_n halved: its description still says "32x64 tiles"."""
    root = mini_project(tmp_path)
    spec = root / "specs" / "phase4.yaml"
    text = spec.read_text()
    assert "block_n: 64" in text and "32x64 tiles" in text
    spec.write_text(text.replace("block_n: 64", "block_n: 32"))
    return root


def test_build_refuses_a_description_its_plan_contradicts(tmp_path):
    root = _narrowed_phase4(tmp_path)
    committed = (root / "generated" / "phase4.cu").read_bytes()
    out_dir = tmp_path / "fresh"
    code, out, err, *_ = invoke(["build", "--root", root, "--out", out_dir])
    assert code == 2, (out, err)
    [line] = error_lines(err)
    assert "phase4.yaml" in line and "'32x64 tiles'" in line and "the plan has 32x32" in line, line
    assert not out_dir.exists()
    assert out.splitlines()[-1] == f"{SUMMARY}0 files, 0 written, 0 unchanged, 1 refused (1 spec)"
    code, out, err, *_ = invoke(["build", "--root", root])
    assert code == 2 and (root / "generated" / "phase4.cu").read_bytes() == committed
    code, out, err, *_ = invoke(["check", "--root", root])
    assert code == 1 and "'32x64 tiles'" in out, (out, err)   # check agrees: the description is what is stale


def test_build_refuses_a_named_spec_in_json_too(tmp_path):
    root = _narrowed_phase4(tmp_path)
    code, out, err, *_ = invoke(["build", root / "specs" / "phase4.yaml", "--out", tmp_path / "fresh", "--json"])
    report = json.loads(out)
    assert code == 2 and not report["ok"] and report["files"] == []
    [error] = report["errors"]
    assert error["key"] == "description" and error["line"] == 6 and "32x64 tiles" in error["message"]
    assert report["summary"] == {"files": 0, "written": 0, "unchanged": 0, "refused": 1, "specs": 1}


def test_a_description_that_agrees_is_built(tmp_path):
    root = _narrowed_phase4(tmp_path)
    spec = root / "specs" / "phase4.yaml"
    spec.write_text(spec.read_text().replace("32x64 tiles", "32x32 tiles"))
    code, out, err, *_ = invoke(["build", "--root", root])
    assert code == 0 and out.splitlines()[-1] == f"{SUMMARY}1 file, 1 written, 0 unchanged, 0 refused (1 spec)"


@pytest.mark.exhaustive     # renders every spec (13 s on 2 cores); the summary of a small folder is above
def test_build_of_every_spec_ends_with_its_summary(tmp_path):
    specs = SPEC_PATHS
    shutil.copytree(ROOT / "generated", tmp_path / "gen")
    (tmp_path / "gen" / "phase4.cu").unlink()
    code, out, err, *_ = invoke(["build", "--specs-dir", ROOT / "specs", "--out", tmp_path / "gen"])
    assert code == 0, err
    # every source, and the launch record of each spec the dispatch table serves
    files = len(list((ROOT / "generated").glob("*.cu"))) + len(list((ROOT / "generated").glob("*.launch.json")))
    assert out.splitlines()[-1] == (f"{SUMMARY}{files} files, 1 written, {files - 1} unchanged, 0 refused "
                                    f"({len(specs)} specs)")
    code, out, err, *_ = invoke(["build", "--specs-dir", ROOT / "specs", "--out", tmp_path / "gen", "--json"])
    assert json.loads(out)["summary"] == {"files": files, "written": 0, "unchanged": files, "refused": 0,
                                          "specs": len(specs)}


def test_one_named_spec_needs_no_summary(tmp_path):
    code, out, err, *_ = invoke(["build", ROOT / "specs" / "phase4.yaml", "--out", tmp_path])
    assert code == 0 and SUMMARY not in out and out.startswith("wrote"), out


# -- a dispatch miss ------------------------------------------------------------------------------

def _table() -> list[Entry]:
    """Two arches, two dtypes, four head dims, two masks: more keys than a miss shows."""
    return [Entry("forward", arch, dtype, d, mask, f"{arch}_{dtype}_d{d}_{mask}")
            for arch in ("sm_89", "sm_90") for dtype in ("fp16", "bf16") for d in (32, 64, 128, 256)
            for mask in ("none", "causal")]


def test_a_miss_names_the_nearest_entries_first():
    message = miss_message(_table(), "forward", "sm_90", "bf16", 96, "causal")
    lines = message.splitlines()
    assert lines[0] == "attngen has no forward kernel for sm_90 bf16 head_dim 96 mask causal."
    listed = [ln.strip() for ln in lines if ln.startswith("  ") and "head_dim" in ln]
    assert len(listed) == NEAREST_SHOWN
    # the same arch and dtype, the closer head dim, then the same mask
    assert listed[:4] == ["sm_90 bf16 head_dim 64 mask causal", "sm_90 bf16 head_dim 64 mask none",
                          "sm_90 bf16 head_dim 128 mask causal", "sm_90 bf16 head_dim 128 mask none"]
    assert f"and {len(_table()) - NEAREST_SHOWN} more" in message
    assert lines[-1].startswith("Add one:") and "attngen dispatch --from REPORT.json --write" in lines[-1]


def test_a_miss_with_no_entries_of_its_call_says_so():
    message = miss_message(_table(), "decode", "sm_90", "fp16", 128, "none", paged=True)
    assert "has no decode entries" in message and "more" not in message


def test_a_miss_on_the_committed_table_is_short():
    # (a head dim below a served one would run padded to it: 200 on the L4's table has none above)
    code, out, err, *_ = invoke(["dispatch", "--head-dim", "200", "--dtype", "fp16", "--causal", "--arch", "sm_89"])
    assert code == 2, (out, err)
    message = err[err.index("Error: "):]
    assert len(message.splitlines()) <= 12, message
    assert "sm_89 fp16 head_dim 128 mask causal" in message and "more in the dispatch table" in message
    assert "bf16" not in message.split("Add one")[0].split("\n", 1)[1]   # same dtype fills the few lines


def test_select_raises_the_short_message():
    with pytest.raises(LookupError) as info:
        select(_table(), "forward", "sm_90", "fp16", 80, "none", 2048)
    assert len(str(info.value).splitlines()) <= 12 and "sm_90 fp16 head_dim 64 mask none" in str(info.value)
