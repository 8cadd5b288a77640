"""`attngen bench --serving` without a GPU: its options parsed and refused with the reason before any GPU
check, and its table; on the GPU (marked) a small step runs through the command and is checked."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from attngen.cli import main
from attngen.eval.bench.serving import ServingStep, format_serving, parse_context, step_problems


def test_context_is_lo_colon_hi():
    assert parse_context("512:8192") == (512, 8192)
    assert parse_context(" 1:1 ") == (1, 1)


@pytest.mark.parametrize("text, words", [("512", "LO:HI"), ("a:b", "LO:HI"), ("0:5", "1 <= LO <= HI"),
                                         ("9:8", "1 <= LO <= HI"), ("1:2:3", "LO:HI")])
def test_a_bad_context_says_what_is_wrong(text, words):
    with pytest.raises(ValueError, match=words):
        parse_context(text)


def test_step_problems_name_each_option_and_its_fix():
    assert step_problems(ServingStep(), 512, 1 << 17) == []
    problems = step_problems(ServingStep(prefill=65, page_size=12, heads=32, kv_heads=5, context=(1, 1 << 18)),
                             512, 1 << 17)
    assert any("--prefill 65" in p and "0 to --sequences (64)" in p for p in problems)
    assert any("--page-size 12" in p and "power of two" in p for p in problems)
    assert any("--heads 32/5" in p and "multiple" in p for p in problems)
    assert any("--context 1:262144" in p for p in problems)


def test_the_table_gives_each_timing_and_the_ratio():
    row = {"attngen": {"gpu_us": 1000.0, "eager_us": 1100.0, "graph_us": 990.0},
           "sdpa_per_sequence": {"gpu_us": 3000.0, "eager_us": 3300.0, "graph_error": "capture refused"},
           "ratio_gpu": 3.0, "ratio_eager": 3.0, "ratio_graph": None, "max_err": 1e-3, "bound": 2e-3,
           "kv_bytes": 5e8, "query_tokens": 4152}
    text = format_serving({"gpu": "NVIDIA H200", "step": ServingStep().label, "rows": [row]})
    assert "64 sequences (8 x 512-token chunks, 56 decoding), 32/8 heads, d128, pages of 16, bf16" in text
    lines = text.splitlines()
    assert [ln.split() for ln in lines if ln.startswith("attngen")] == [["attngen", "1000.0", "1100.0", "990.0"]]
    assert [ln.split()[-3:] for ln in lines if ln.startswith("SDPA / attngen")] == [["3.00", "3.00", "-"]]
    assert "graph not captured: capture refused" in text


@pytest.mark.parametrize("args, words", [
    (["--serving", "specs/phase4.yaml"], "name no SPECS"),
    (["--prefill", "3"], "--prefill goes with --serving"),
    (["--chunk", "8", "--page-size", "4"], "--chunk, --page-size go with --serving"),
    (["--serving", "--page-size", "12"], "power of two"),
    (["--serving", "--prefill", "70"], "0 to --sequences (64)"),
    (["--serving", "--context", "9:8"], "1 <= LO <= HI"),
    (["--serving", "--heads", "32/5"], "multiple"),
    (["--serving", "--dtype", "fp16", "--dtype", "bf16"], "give --dtype once"),
])
def test_bench_serving_refuses_bad_options_before_the_gpu(args, words):
    run = CliRunner().invoke(main, ["bench", *args])
    assert run.exit_code == 2, run.output
    assert words in run.output and "Traceback" not in run.output


@pytest.mark.gpu
def test_bench_serving_runs_a_small_step(tmp_path):
    out = tmp_path / "serving.json"
    run = CliRunner().invoke(main, ["bench", "--serving", "--sequences", "8", "--prefill", "2", "--chunk", "64",
                                    "--context", "128:1024", "--reps", "3", "--json", str(out)])
    assert run.exit_code == 0, run.output
    report = json.loads(out.read_text())
    row, = report["rows"]
    assert row["passed"] and row["max_err"] <= row["bound"]
    assert row["query_tokens"] == 2 * 64 + 6 and row["sequences"] == 8
    for side in ("attngen", "sdpa_per_sequence"):
        assert row[side]["gpu_us"] > 0 and row[side]["eager_us"] > 0
    assert "SDPA / attngen" in run.output
