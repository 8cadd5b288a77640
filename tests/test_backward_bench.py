"""`attngen bench` on backward specs without a GPU: the options it refuses before any GPU work, the
cases it plans from the options, and the no-GPU exit it shares with forward specs."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from attngen.cli import main
from attngen.errors import NoGpuError
from attngen.eval.bench.backward import BackwardCase, backward_cases, check_options
from attngen.eval.conventions import BenchOptions
from attngen.plan import make_plan
from attngen.spec import load_spec

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "specs"


def plans(*names):
    paths = [SPECS / f"{n}.yaml" for n in names]
    return paths, [make_plan(load_spec(p)) for p in paths]


def bench(*args):
    result = CliRunner().invoke(main, ["bench", *map(str, args)])
    out = result.output + (result.stderr if hasattr(result, "stderr") else "")
    assert "Traceback" not in out and (result.exception is None or isinstance(result.exception, SystemExit)), out
    return result.exit_code, out


def test_variant_specs_are_refused_with_what_checks_them():
    paths, ps = plans("h100_bwd_d64", "h100_bwd_d64_window", "h100_bwd_d128_alibi", "h100_bwd_d64_softcap")
    (problem,) = check_options(paths, ps, BenchOptions())
    assert problem.startswith("h100_bwd_d64_window, h100_bwd_d128_alibi, h100_bwd_d64_softcap take variant arguments")
    assert "`attngen verify` checks them" in problem and "docs/backward-h200/window_backward_bench.py" in problem
    assert "docs/backward-h200/score_backward_bench.py OUT.json` the softcap and ALiBi ones" in problem
    assert check_options(paths[:1], ps[:1], BenchOptions()) == []
    code, out = bench(SPECS / "lab" / "h100_bwd_d64_window.yaml", SPECS / "lab" / "h100_bwd_d64_window_bf16.yaml")
    assert code == 2 and "h100_bwd_d64_window, h100_bwd_d64_window_bf16 take variant arguments" in out


def test_varlen_is_refused_with_the_script_that_times_it():
    paths, ps = plans("h100_bwd_d64_varlen")
    (problem,) = check_options(paths, ps, BenchOptions(varlen=True))
    assert "does not time the varlen backward (h100_bwd_d64_varlen)" in problem
    assert "python3 docs/backward-h200/varlen_backward_bench.py OUT.json" in problem
    code, out = bench("--varlen", SPECS / "lab" / "h100_bwd_d64_varlen.yaml")
    assert code == 2 and "docs/backward-h200/varlen_backward_bench.py" in out


def test_cases_follow_the_spec_head_dim_dtype_and_masks():
    _, ps = plans("h100_bwd_d64", "h100_bwd_d128_bf16")
    cases, notes = backward_cases(ps)
    assert list(cases) == [BackwardCase(b, h, s, d, dt, c) for d, dt in ((64, "fp16"), (128, "bf16"))
                           for b, h, s in ((4, 16, 2048), (1, 16, 8192)) for c in (False, True)]
    assert all(v == [0] for v in list(cases.values())[:4]) and all(v == [1] for v in list(cases.values())[4:])
    assert notes == ["h100_bwd_d64: bf16 not timed (the spec is fp16)",
                     "h100_bwd_d128_bf16: fp16 not timed (the spec is bf16)"]
    cases, notes = backward_cases(ps, shapes=((1, 4, 512, 64), "2x4x256x128x64"), dtypes=("fp16",), causals=(True,))
    assert list(cases) == [BackwardCase(1, 4, 512, 64, "fp16", True)]
    assert notes == ["h100_bwd_d64: 2x4x256x128x64 skipped (the spec's head dim is 64, for q, k and v alike)",
                     "h100_bwd_d128_bf16: not timed, it is bf16 (--dtype fp16)"]
    case = BackwardCase(4, 16, 2048, 64, "fp16", True)
    assert case.flops == 2.5 * 4 * 4 * 16 * 2048 * 2048 * 64 / 2 and case.label == "4x16x2048x64 fp16 causal"


@pytest.mark.parametrize("args", [["lab/h100_bwd_d64_bf16.yaml"], ["h100_mma_d64_bf16.yaml"],
                                  ["--shapes", "1x4x512x64", "--causal", "yes", "lab/h100_bwd_d64_bf16.yaml"]],
                         ids=["backward", "forward", "backward-shapes"])
def test_without_gpu_backward_exits_as_forward_does(args, monkeypatch):
    """No GPU: exit 4 with the same one line for a backward spec as for a forward one (--shapes is
    the backward bench's option too: it passes the option check)."""
    def no_gpu():           # whatever this machine has: no GPU
        raise NoGpuError("no CUDA GPU: torch sees none")
    monkeypatch.setattr("attngen.runtime.gpu_modules", no_gpu)
    code, out = bench(*args[:-1], SPECS / args[-1])
    assert code == 4, out
    assert out.startswith("attngen: ") and ("torch" in out or "GPU" in out)


def test_a_family_file_benches_the_cells_it_can_time_and_names_the_rest():
    # specs/h100_mma_d64.yaml stands for its plain cells and its variant members: bench leaves the
    # members out, saying which, and goes on to check the rest (a head dim no cell has: the only error,
    # before any GPU is looked for)
    code, out = bench(SPECS / "h100_mma_d64.yaml", "--shapes", "1x2x128x80")
    # every member (fp16 and bf16): variant members, and the paged ones, all serving varlen calls only
    members = len(yaml.safe_load((SPECS / "h100_mma_d64.yaml").read_text())["cells"])
    assert f"bench: leaving out {2 * members} cell(s) it cannot time here: h100_mma_d64_alibi," in out
    assert "h100_mma_d64_paged," in out
    assert code == 2 and "Error: " in out and "head dim" in out.rsplit("Error: ", 1)[1]
    # a member named by its own path is the user's choice: refused, with what times it
    code, out = bench(SPECS / "h100_mma_d64_window.yaml")
    assert code == 2 and "leaving out" not in out and "h100_mma_d64_window takes variant arguments" in out
    # a cell that serves varlen calls only: refused, with the option that times it
    code, out = bench(SPECS / "h100_mma_d64_paged.yaml")
    assert code == 2 and "h100_mma_d64_paged serves varlen calls only" in out and "--varlen" in out
    code, out = bench(SPECS / "h100_bwd_d64_wgmma_varlen.yaml")
    assert code == 2 and "h100_bwd_d64_wgmma_varlen: varlen calls only" in out and "varlen_backward_bench.py" in out


def test_a_decode_family_file_benches_the_cells_it_can_time_and_names_the_rest():
    """specs/h200_decode_d128.yaml stands for its plain cells and members whose calls take what the bench's
    cells do not carry: score modifiers' arguments, e4m3 caches, an append's new tokens. bench leaves those out
    (the append cells too: timing one without its new tokens stopped the run), saying which; a member named by
    its own path is refused with the script that times it."""
    members = yaml.safe_load((SPECS / "h200_decode_d128.yaml").read_text())["cells"]
    taking = [m for m, c in members.items() if c.get("append") or c.get("kv_dtype") or c.get("scores")]
    code, out = bench(SPECS / "h200_decode_d128.yaml", "--cells", "1x8/2x512x1")
    left = out.split("bench: leaving out ", 1)[1].split(" cell(s)", 1)[0]
    assert int(left) == 2 * len(taking) and "h200_decode_d128_append," in out and "h200_decode_d128_append_alibi," in out
    assert code == 4, out          # no GPU here: the cells it can time were kept for the run
    for member, words in (("append", "the new tokens it appends (k=, v=)"), ("kv_e4m3", "e4m3 caches"),
                          ("alibi", "its score modifiers' arguments")):
        code, out = bench(SPECS / f"h200_decode_d128_{member}.yaml")
        assert code == 2 and "leaving out" not in out and f"h200_decode_d128_{member} takes {words}" in out, out
