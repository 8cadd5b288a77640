"""Hostile command lines: every option is checked before any GPU check (a bad option is one line
whatever the machine), every count option has an upper bound its --help states, a report path
that cannot be written is refused before the run, a renamed spec key says its new name, and
--root is taken after the command's name as the README writes it.

None of these tests needs nvcc or a GPU: the GPU checks are replaced by stubs that fail the test
when they are reached.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

import click
import pytest

from attngen.cli import main, options
from attngen.errors import NoGpuError
from spec_sample import spec_text
from hostile_helpers import assert_clean, invoke, mini_project

ROOT = Path(__file__).resolve().parents[1]


def _spec(name: str) -> str:
    return str(ROOT / "specs" / f"{name}.yaml")


PHASE4, L4_D64, DECODE, BWD = (_spec(n) for n in ("phase4", "l4_mma_d64", "h200_decode_d128", "h100_bwd_d128"))


@pytest.fixture
def no_gpu_reached(monkeypatch):
    """Reaching a GPU check fails the test: every refusal must come before it (on a machine
    without a GPU it used to exit 4 there, before the option was ever looked at)."""
    def reached(*a, **kw):
        raise AssertionError("the GPU check ran before the options were refused")
    monkeypatch.setattr("attngen.runtime.gpu_modules", reached)
    from attngen.eval import sweep as S
    monkeypatch.setattr(S, "GpuMeasurer", reached)
    from attngen.eval import verify as V
    monkeypatch.setattr(V, "load_kernels", reached)


# -- option checks before the GPU check ------------------------------------------------------------

BEFORE_THE_GPU = {
    "bench_head_dim_no_spec_has": (["bench", "--shapes", "1x8x512x63", PHASE4],
                                   "--shapes 1x8x512x63: no given spec has that head dim"),
    "bench_one_of_two_shapes": (["bench", "--shapes", "1x8x512x64,2x16x1024x128", PHASE4],
                                "--shapes 2x16x1024x128: no given spec has"),
    "bench_dv_no_spec_has": (["bench", "--shapes", "1x8x512x64x32", PHASE4], "1x8x512x64x32"),
    "bench_backward_head_dim": (["bench", "--shapes", "1x8x512x64", BWD], "(the specs' D or DxDv: 128)"),
    "bench_batch_too_large": (["bench", "--shapes", "65536x1x128x64", PHASE4], "B must be at most 65535"),
    "bench_heads_too_large": (["bench", "--shapes", "1x1025x128x64", PHASE4], "H must be at most 1024"),
    "bench_seqlen_too_large": (["bench", "--shapes", "1x1x999999999x64", PHASE4], "S must be at most 4194304"),
    "bench_varlen_too_many_sequences": (["bench", "--varlen", "--lengths", ",".join(["1"] * 65536), PHASE4],
                                        "65536 sequences"),
    "bench_varlen_too_many_tokens": (["bench", "--varlen", "--lengths", "4194304,1", PHASE4],
                                     "4194305 tokens in all"),
    "bench_varlen_too_many_heads": (["bench", "--varlen", "--heads", "2048/8", PHASE4], "at most 1024 query heads"),
    "sweep_seqlen_too_large": (["sweep", L4_D64, "--shapes", "1x2x99999999x64"], "S must be at most 4194304"),
    "sweep_head_dim": (["sweep", L4_D64, "--shapes", "1x2x256x63"], "head_dim 63"),
    "verify_negative_seed": (["verify", PHASE4, "--seed", "-1"], "'--seed'"),
}


@pytest.mark.parametrize("name", sorted(BEFORE_THE_GPU))
def test_bad_option_is_refused_before_the_gpu_check(name, no_gpu_reached):
    args, fragment = BEFORE_THE_GPU[name]
    line = assert_clean(*invoke(args))
    assert fragment in line, line


def test_shapes_of_a_given_spec_reach_the_gpu_check(monkeypatch):
    # The head-dim check refuses only shapes no given spec runs: a spec's own shape goes on.
    def no_gpu(*a, **kw):
        raise NoGpuError("no CUDA GPU: stub")
    monkeypatch.setattr("attngen.runtime.gpu_modules", no_gpu)
    line = assert_clean(*invoke(["bench", "--shapes", "1x8x512x64", PHASE4]), exit_code=4)
    assert "no CUDA GPU" in line


# -- upper bounds of every count option ----------------------------------------------------------

def _int_options():
    """(command, option) for every integer option of every command."""
    return [(name, p) for name, command in sorted(main.commands.items()) for p in command.params
            if isinstance(p, click.Option) and isinstance(p.type, (click.IntRange, type(click.INT)))]


def test_every_int_option_has_an_upper_bound_its_help_states():
    options = _int_options()
    assert {("sweep", "reps"), ("bench", "reps"), ("sweep", "generations"), ("sweep", "top_k")} <= {
        (c, p.name) for c, p in options}
    for command, p in options:
        assert isinstance(p.type, click.IntRange) and p.type.max is not None, f"{command} {p.opts[0]} is unbounded"
        ctx = click.Context(main.commands[command], info_name=command)
        assert f"<={p.type.max}" in p.get_help_record(ctx)[1], f"{command} {p.opts[0]}: --help hides its bound"


@pytest.mark.parametrize("command, option", [(c, p) for c, p in _int_options()],
                         ids=[f"{c}-{p.name}" for c, p in _int_options()])
def test_a_count_over_its_bound_is_one_line(command, option, no_gpu_reached):
    args = {"bench": [PHASE4], "sweep": [L4_D64, "--shapes", "1x2x256x64"], "verify": [PHASE4]}.get(command, [])
    line = assert_clean(*invoke([command, *args, option.opts[0], option.type.max + 1]))
    assert option.opts[0] in line and f"{option.type.max + 1} is not in the range" in line, line


def test_a_count_at_its_bound_is_taken():
    code, out, err, *_ = invoke(["dispatch", "--head-dim", options.MAX_HEAD_DIM, "--seqlen", options.MAX_INT32])
    assert "is not in the range" not in err, err


# -- report paths: refused before the run, with the write's own line -----------------------------------

def test_sweep_write_best_into_a_read_only_folder(tmp_path, monkeypatch, no_gpu_reached):
    best = tmp_path / "best"
    best.mkdir()
    real = os.access
    monkeypatch.setattr(options.os, "access", lambda p, mode, **kw: (  # read, not write: as a read-only mount
        not (Path(p) == best and mode & os.W_OK) and real(p, mode, **kw)))
    line = assert_clean(*invoke(["sweep", L4_D64, "--shapes", "1x2x256x64", "--write-best", best]), exit_code=3)
    assert line == f"attngen: cannot write into {best}: Permission denied", line
    new = best / "new"         # a folder made on the way: its existing parent must take it
    line = assert_clean(*invoke(["sweep", L4_D64, "--shapes", "1x2x256x64", "--write-best", new]), exit_code=3)
    assert line == f"attngen: cannot create directory {new}: Permission denied", line
    assert not new.exists()


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes into read-only directories")
def test_sweep_write_best_into_a_chmod_read_only_folder(tmp_path, no_gpu_reached):
    best = tmp_path / "best"
    best.mkdir()
    best.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        line = assert_clean(*invoke(["sweep", L4_D64, "--shapes", "1x2x256x64", "--write-best", best]),
                            exit_code=3)
        assert "Permission denied" in line
    finally:
        best.chmod(stat.S_IRWXU)


@pytest.mark.parametrize("args", [
    ["sweep", L4_D64, "--shapes", "1x2x256x64", "--json", "{blocker}/sweep.json"],
    ["sweep", L4_D64, "--shapes", "1x2x256x64", "--write-best", "{blocker}/best"],
    ["bench", PHASE4, "--json", "{blocker}/bench.json"],
    ["bench", PHASE4, "--plot", "{blocker}/bench.png"],
    ["bench", PHASE4, "--json", "{missing}/bench.json"],
    ["verify", PHASE4, "--json", "{blocker}/verify.json"],
], ids=["sweep-json", "sweep-write-best", "bench-json", "bench-plot", "bench-json-missing", "verify-json"])
def test_a_report_path_that_cannot_be_written_is_refused_first(tmp_path, args, no_gpu_reached):
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    args = [a.format(blocker=blocker, missing=tmp_path / "missing") for a in args]
    line = assert_clean(*invoke(args), exit_code=3)
    assert line.startswith("attngen: cannot ") and (str(blocker) in line or "missing" in line), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocker"]


# -- renamed spec keys ----------------------------------------------------------------------------

def test_a_renamed_key_names_its_new_name(tmp_path):
    text = spec_text(ROOT / "specs" / "h100_wgmma_d128_pp_bf16.yaml")
    assert "schedule: {overlap: true, pingpong: true}" in text
    p = tmp_path / "old.yaml"
    p.write_text(text.replace("schedule: {overlap: true, pingpong: true}", "schedule: {overlap: true, split_kv: true}"))
    line_no = next(i for i, ln in enumerate(p.read_text().splitlines(), 1) if ln.startswith("schedule:"))
    for command in (["explain", p], ["build", p, "--out", tmp_path / "gen"]):
        line = assert_clean(*invoke(command))
        assert line.startswith(f"{p}:{line_no}: schedule.split_kv: is now schedule.separate_kv_barriers"), line
        assert "decode: split_kv" in line


def _section_keys(kind, section: str) -> set:
    """The keys a kind's spec takes under a top-level section ("" for the top level)."""
    if not section:
        return set(kind.spec_model.model_fields)
    field = kind.spec_model.model_fields.get(section)
    if field is None:
        return set()
    model = getattr(field.annotation, "__args__", (field.annotation,))[0]     # Optional[M] -> M
    return set(getattr(model, "model_fields", {}))


def test_every_renamed_key_is_unknown_and_its_new_name_known():
    # A key still read under its old name is not renamed (the registry would hide its real
    # refusals); a new name no kind reads would send the user to another refusal.
    from attngen.kinds import KINDS
    from attngen.spec import RENAMED_KEYS
    for old, (new, _what) in RENAMED_KEYS.items():
        section, _, key = old.rpartition(".")
        assert not any(key in _section_keys(kind, section) for kind in KINDS), old
        new_section, _, new_key = new.rpartition(".")
        assert any(new_key in _section_keys(kind, new_section) for kind in KINDS), new


# -- --root after the command's name -----------------------------------------------------------------

def test_root_is_taken_after_the_command_name(tmp_path, monkeypatch):
    root = mini_project(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, out, err, *_ = invoke(["check"])
    assert code == 2 and "pass --root PROJECT" in err, err        # the error text names the option ...
    for args in (["check", "--root", root], ["--root", root, "check"]):   # ... and it works where written
        code, out, err, *_ = invoke(args)
        assert code == 0 and "1 generated file(s) in sync" in out, (args, out, err)
    code, out, err, *_ = invoke(["build", "--root", root])
    assert code == 0 and "unchanged" in out and not (elsewhere / "generated").exists(), (out, err)


def test_root_is_documented_on_the_commands_that_take_it():
    readme = (ROOT / "README.md").read_text()
    assert "pass `--root PROJECT`" in readme
    for name in ("build", "check", "compile", "verify", "bench"):
        assert any(p.name == "root" for p in main.commands[name].params), name
    code, out, err, *_ = invoke(["check", "--help"])
    assert "--root" in out


def test_root_must_be_a_folder(tmp_path):
    line = assert_clean(*invoke(["check", "--root", tmp_path / "absent"]))
    assert "'--root'" in line
