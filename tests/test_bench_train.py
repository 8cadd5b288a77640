"""`attngen bench --train` without a GPU: its cells parsed (and refused with the reason), the default
grid, and the command-line refusals that come before any GPU check."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from attngen.cli import main
from attngen.eval.bench.train import GRID_TOKENS, TrainCell, grid_cells, parse_train_cell


def test_a_train_cell_is_b_hq_hkv_s_d():
    assert parse_train_cell("4x32/8x2048x128") == TrainCell(4, 32, 8, 2048, 128)
    assert parse_train_cell(" 2x16x512x64 ") == TrainCell(2, 16, 16, 512, 64)
    assert parse_train_cell("4x32/8x2048x128").label == "4x32/8x2048x128"
    assert parse_train_cell("2x16x512x64").label == "2x16x512x64"
    cell = parse_train_cell("1x8x1024x64")
    assert cell.flops(False) == 3.5 * 4 * 8 * 1024 ** 2 * 64 and cell.flops(True) == cell.flops(False) / 2


@pytest.mark.parametrize("text, words", [("4x32x2048", "BxHq/HkvxSxD"), ("4x32/8x2048x", "BxHq/HkvxSxD"),
                                         ("4xax2048x64", "BxHq/HkvxSxD"), ("0x8x128x64", "at least 1"),
                                         ("1x32/5x128x64", "multiple of the KV heads")])
def test_a_bad_train_cell_says_what_is_wrong(text, words):
    with pytest.raises(ValueError, match=words):
        parse_train_cell(text)


def test_the_default_grid_spans_head_dims_lengths_and_groups():
    cells = grid_cells()
    assert len(cells) == 3 * 4 * 3
    assert {c.head_dim for c in cells} == {64, 128, 256}
    assert {c.seqlen for c in cells} == {512, 2048, 8192, 16384}
    assert {c.heads // c.kv_heads for c in cells} == {1, 4, 8}
    assert all(c.batch * c.seqlen == GRID_TOKENS for c in cells)


@pytest.mark.parametrize("args, words", [
    (["--train", "specs/phase4.yaml"], "name no SPECS"),
    (["--train-cells", "1x4x128x64"], "--train-cells goes with --train"),
    (["--train", "--train-cells", "1x32/5x128x64"], "multiple of the KV heads"),
    (["--train", "--train-cells", ""], "at least one cell"),
    (["--train", "--rounds", "0"], "0"),
])
def test_bench_train_refuses_bad_options_before_the_gpu(args, words):
    run = CliRunner().invoke(main, ["bench", *args])
    assert run.exit_code == 2, run.output
    assert words in run.output and "Traceback" not in run.output


def test_the_gpu_sleep_covers_the_host_time_of_the_queued_calls():
    """time_calls queues its calls behind a GPU sleep; a call whose host time times the count would
    outlast the least sleep gets a longer one (twice that host time), up to about 2 s."""
    from attngen.eval.bench.timing import SLEEP_CYCLES, SLEEP_CYCLES_MOST, sleep_cycles
    assert sleep_cycles(20e-6, 30) == SLEEP_CYCLES                    # a forward call: the least sleep covers it
    assert sleep_cycles(600e-6, 30) == int(600e-6 * 30 * 2 * 2e9)     # a training step: 36 ms of sleep
    assert sleep_cycles(600e-6, 30) > 2 * 600e-6 * 30 * 1.98e9        # still twice the host time at 1.98 GHz
    assert sleep_cycles(0.5, 1000) == SLEEP_CYCLES_MOST


def test_time_calls_queues_again_where_the_host_outlasted_the_sleep_and_says_when_it_still_does(monkeypatch):
    """time_calls compares the host's time to queue its calls with the GPU's sleep ahead of them: covered,
    it times once; not covered, it queues again behind a sleep sized from that queuing time (twice it);
    still not covered (a full launch queue keeps the host waiting on the GPU), it warns."""
    import types
    import warnings
    from attngen.eval.bench import timing
    torch = types.SimpleNamespace(cuda=types.SimpleNamespace(synchronize=lambda: None))
    for script, tries, warns in (
            ([([10.0] * 30, 5.0, 10.0)], 1, False),                               # covered
            ([([99.0] * 30, 50.0, 10.0), ([10.0] * 30, 50.0, 200.0)], 2, False),  # covered the second time
            ([([99.0] * 30, 50.0, 10.0), ([99.0] * 30, 400.0, 200.0)], 2, True)):  # never covered
        cycles = []

        def queue(torch, fn, sets, reps, c, script=script):
            cycles.append(c)
            return script.pop(0)
        monkeypatch.setattr(timing, "queue_behind_sleep", queue)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            med, _ = timing.time_calls(torch, lambda: None, [()], reps=30)
        assert len(cycles) == tries and med == (99.0 if warns else 10.0)
        if tries == 2:
            assert cycles[1] == timing.sleep_cycles(50.0e-3 / 30, 30)
        assert bool([w for w in caught if "launch queue" in str(w.message)]) == warns


def test_back_to_back_timing_queues_again_where_the_host_outlasted_the_sleep_and_keeps_the_median(monkeypatch):
    """time_back_to_back: each run's calls queue behind a sleep; a run whose queuing outlasted it runs again
    behind a longer one (twice that queuing time), a warning where that still did not cover it; the median
    of the runs' per-call times is kept."""
    import types
    import warnings
    from attngen.eval.bench import timing
    torch = types.SimpleNamespace(cuda=types.SimpleNamespace(synchronize=lambda: None))
    script = [(5.0, 1.0, 10.0), (99.0, 50.0, 10.0), (7.0, 50.0, 200.0), (6.0, 1.0, 10.0)]
    cycles = []

    def run(torch, fn, sets, reps, c):
        cycles.append(c)
        return script.pop(0)
    monkeypatch.setattr(timing, "run_behind_sleep", run)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        us = timing.time_back_to_back(torch, lambda: None, [()], reps=30)
    assert us == 6.0 and not script and not caught
    assert cycles[2] == cycles[3] == timing.sleep_cycles(50.0e-3 / 30, 30) > cycles[0] == cycles[1]
    script[:] = [(99.0, 50.0, 10.0), (99.0, 400.0, 200.0)] * 3
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert timing.time_back_to_back(torch, lambda: None, [()], reps=30) == 99.0
    assert len([w for w in caught if "host's pace" in str(w.message)]) == 3


def test_a_gpt_shape_is_layers_dmodel_heads_tokens_batch():
    from attngen.eval.bench.gpt_step import DEFAULT_GPT, GptShape, parse_gpt_shape
    assert parse_gpt_shape(" 4x512x8x1024x8 ") == DEFAULT_GPT == GptShape(4, 512, 8, 1024, 8)
    assert DEFAULT_GPT.label == "4 layers, d_model 512, 8 heads of 64, 1024 tokens, batch 8"
    for text, words in (("4x512x8x1024", "LAYERSxD_MODELxHEADSxTOKENSxBATCH"), ("4x512x8x1024xb", "e.g. 4x512"),
                        ("0x512x8x1024x8", "at least 1"), ("4x500x8x1024x8", "multiple of the heads"),
                        ("4x96x8x1024x8", "multiple of 8")):
        with pytest.raises(ValueError, match=words):
            parse_gpt_shape(text)


@pytest.mark.parametrize("args, words", [
    (["--gpt-model", "4x512x8x1024x8"], "--gpt-model goes with --gpt-step"),
    (["--gpt-step", "--gpt-model", "4x500x8x64x2"], "multiple of the heads"),
    (["--gpt-step", "--gpt-model", "1x512x8x1024x100000"], "--gpt-model"),
    (["--gpt-step", "--dtype", "bf16", "--dtype", "fp16"], "one dtype"),
    (["--gpt-step", "specs/h100_bwd_d64_wgmma.yaml"], "name no SPECS"),
])
def test_bench_gpt_step_refuses_bad_options_before_the_gpu(args, words):
    result = CliRunner().invoke(main, ["bench", *args])
    assert result.exit_code == 2 and words in result.output, result.output


def _gpt_report(status="ok"):
    return {"gpu": "NVIDIA H200", "torch": "2.11", "model": {"layers": 4, "d_model": 512, "heads": 8, "seqlen": 1024,
                                                             "batch": 8},
            "dtype": "bf16", "steps": 20, "rounds": 5, "status": status,
            "first_step": {"sdpa": {"loss": 6.427386, "qkv_grad_norm": 0.5}, "attngen": {"loss": 6.427377,
                                                                                         "qkv_grad_norm": 0.5}},
            "ms_per_step": {"sdpa eager": 9.585, "attngen eager": 9.882, "sdpa compiled": 8.281},
            "gpu_ms_per_step": {"sdpa eager": 4.06, "attngen eager": 3.99, "sdpa compiled": 4.18},
            "sdpa_over_attngen": {"eager": 9.585 / 9.882}, "failed": {"attngen compiled": "BackendCompilerFailed"}}


def test_the_gpt_step_table_gives_each_mode_the_ratio_and_what_did_not_run():
    from attngen.eval.bench.gpt_step import format_gpt_step
    text = format_gpt_step(_gpt_report())
    assert "4 layers, d_model 512, 8 heads of 64" in text and "loss attngen 6.427377, SDPA 6.427386" in text
    eager = next(line for line in text.splitlines() if line.startswith("eager"))
    assert eager.split() == ["eager", "9.882", "9.585", "0.970", "nan", "3.990", "4.060"]
    compiled = next(line for line in text.splitlines() if line.startswith("compiled"))
    assert compiled.split() == ["compiled", "nan", "8.281", "nan", "nan", "nan", "4.180"]
    with_pairs = _gpt_report() | {"paired": {"eager": {"median": 0.99, "min": 0.8, "max": 1.107, "attngen_faster": 3,
                                                       "rounds": 7}}}
    text = format_gpt_step(with_pairs)
    eager = next(line for line in text.splitlines() if line.startswith("eager "))
    assert eager.split()[4:6] == ["0.990", "(0.80-1.11)"] and "eager: attngen faster in 3 of 7 rounds" in text
    assert "interval" not in text     # a report without one (as earlier JSONs) prints none
    with_pairs["paired"]["eager"] |= {"low": 0.951, "high": 1.0404}
    assert ("eager: attngen faster in 3 of 7 rounds; a 95% interval for the median round's SDPA / attngen: "
            "0.951-1.040 (distribution-free)") in format_gpt_step(with_pairs)
    assert "attngen compiled: not run (BackendCompilerFailed)" in text
    assert "native library's kernels" not in text     # said only where they ran
    assert ("attngen's training ops ran with the native library's kernels in front of their Python ones"
            in format_gpt_step(with_pairs | {"native_op_kernels": True}))
    counted = with_pairs | {"native_op_kernels": True, "native_op_counts": {"train_replayed": 4, "train_below": 1}}
    assert "in front of their Python ones: train_replayed 4, train_below 1" in format_gpt_step(counted)
    wrong = _gpt_report("wrong: first-step loss differs from SDPA's by 0.1 (> 0.001)")
    for key in ("ms_per_step", "gpu_ms_per_step", "sdpa_over_attngen", "failed"):   # the check failed: no timing
        del wrong[key]
    text = format_gpt_step(wrong)
    assert text.splitlines()[-1].startswith("wrong: first-step loss") and "eager" not in text.split("\n", 2)[-1]
    failed = _gpt_report("failed: attngen eager: CUDA out of memory")
    assert format_gpt_step(failed).splitlines()[-1] == "failed: attngen eager: CUDA out of memory"
    refused = {key: value for key, value in _gpt_report("not served: attngen: no backward at d12").items()
               if key in ("gpu", "torch", "model", "dtype", "steps", "rounds", "status")}
    assert format_gpt_step(refused).splitlines()[1:] == ["not served: attngen: no backward at d12"]


def test_the_gpt_step_pairs_each_rounds_two_attentions():
    """round_order: mode by mode, the two attentions back to back, SDPA first in even rounds; paired_ratios:
    each round's SDPA / attngen, the median and range over the rounds (a mode missing a side is left out)."""
    from attngen.eval.bench.gpt_step import paired_ratios, round_order
    names = ["sdpa eager", "attngen eager", "sdpa compiled", "attngen compiled"]
    assert round_order(names, 0) == names
    assert round_order(names, 1) == ["attngen eager", "sdpa eager", "attngen compiled", "sdpa compiled"]
    assert round_order(["sdpa eager", "attngen eager", "sdpa compiled"], 1) == \
        ["attngen eager", "sdpa eager", "sdpa compiled"]
    rounds = {"sdpa eager": [11.31, 10.72, 10.15, 8.54, 8.48], "attngen eager": [11.39, 10.81, 9.17, 10.62, 9.63],
              "sdpa compiled": [8.0]}
    got = paired_ratios(rounds)
    assert list(got) == ["eager"] and got["eager"]["rounds"] == 5 and got["eager"]["attngen_faster"] == 1
    assert got["eager"]["median"] == pytest.approx(10.72 / 10.81)
    assert (got["eager"]["min"], got["eager"]["max"]) == (pytest.approx(8.54 / 10.62), pytest.approx(10.15 / 9.17))


def test_the_paired_medians_interval_is_the_order_statistics_binomial_coverage_gives():
    """median_interval: the j-th smallest and largest of n values, j the largest rank whose interval covers the
    median with probability >= 0.95 under Bin(n, 1/2) (n = 6: the extremes, 1 - 2/64; n = 20: ranks 6 and 15,
    0.9586, where ranks 7 and 14 would cover 0.8847); none below 6 values; the paired report carries it."""
    import math
    from attngen.eval.bench.gpt_step import median_interval, paired_ratios
    assert median_interval([1.0, 2.0, 3.0, 4.0, 5.0]) is None
    assert median_interval([3.0, 1.0, 6.0, 2.0, 5.0, 4.0]) == (1.0, 6.0)
    values = [float(v) for v in range(20, 0, -1)]
    assert median_interval(values) == (6.0, 15.0)

    def coverage(n, j):
        return 1 - 2 * sum(math.comb(n, i) for i in range(j)) / 2 ** n
    assert coverage(20, 6) >= 0.95 > coverage(20, 7)
    for n in (6, 7, 30, 101, 300, 1000):   # the widest rank that keeps 0.95, never one more
        low, high = median_interval([float(v) for v in range(n)])
        j = int(low) + 1
        assert high == n - j and coverage(n, j) >= 0.95 and (j == n // 2 or coverage(n, j + 1) < 0.95), n
    rounds = {"sdpa eager": [10.0 + i for i in range(8)], "attngen eager": [10.0] * 8}
    pair = paired_ratios(rounds)["eager"]
    assert (pair["low"], pair["high"]) == (1.0, 1.7) and pair["median"] == pytest.approx(1.35)
    assert paired_ratios({"sdpa eager": [9.0], "attngen eager": [10.0]})["eager"]["low"] is None


def test_a_steps_gpu_time_is_not_taken_where_the_host_waited_on_the_gpu():
    """step_gpu_ms queues one step behind a GPU sleep; a host that took longer to queue it than the sleep
    lasts waited on the GPU (a full launch queue, a synchronization), so that step has no GPU time."""
    import time
    from types import SimpleNamespace
    from attngen.eval.bench.gpt_step import step_gpu_ms
    slept = []

    class Event:
        def __init__(self, enable_timing):
            pass

        def record(self):
            pass

        def elapsed_time(self, other):
            return 3.5
    fake = SimpleNamespace(cuda=SimpleNamespace(Event=Event, synchronize=lambda: None, _sleep=slept.append))
    assert step_gpu_ms(fake, lambda x: None, None, 1e-4) == 3.5
    assert step_gpu_ms(fake, lambda x: time.sleep(0.03), None, 1e-4) is None     # 30 ms against a 10 ms sleep
    assert step_gpu_ms(fake, lambda x: time.sleep(0.03), None, 0.02) == 3.5      # a sleep of 40 ms covers it
    assert slept[0] == 20_000_000 and slept[2] == int(0.02 * 2 * 2e9)


def test_a_stopped_train_run_keeps_the_rows_it_measured(monkeypatch, tmp_path):
    """bench --train --json rewrites the report after each timing (marked partial, with the timings left), so a
    run stopped by a time limit leaves what it measured; the finished run's report has no mark."""
    import json
    import types
    from attngen.eval.bench import train
    import attngen.runtime as runtime
    torch = types.SimpleNamespace(float16="fp16", bfloat16="bf16", __version__="stand-in",
                                  cuda=types.SimpleNamespace(get_device_name=lambda i: "stand-in GPU",
                                                             empty_cache=lambda: None))
    monkeypatch.setattr(runtime, "gpu_modules", lambda: (torch,))
    seen = []

    def cell_row(torch_, attngen, cell, dtype, causal, *, reps, rounds):
        if len(seen) == 2:
            raise KeyboardInterrupt   # the run stops before its third timing
        seen.append((cell.label, causal))
        return {"cell": cell.label, "causal": causal, "us": {"attngen": 1.0}}
    monkeypatch.setattr(train, "bench_cell", cell_row)
    out = tmp_path / "grid.json"
    run = CliRunner().invoke(main, ["bench", "--train", "--train-cells", "1x4x128x64,1x4x256x64", "--json", str(out)])
    assert run.exit_code != 0
    partial = json.loads(out.read_text())
    assert [(r["cell"], r["causal"]) for r in partial["rows"]] == seen == [("1x4x128x64", False), ("1x4x128x64", True)]
    assert partial["partial"] == {"timings_left": 2}
    assert partial["command"] == ("attngen bench --train --train-cells 1x4x128x64,1x4x256x64 --causal both --rounds 3 "
                                  "--reps 30")
    seen.clear()
    monkeypatch.setattr(train, "bench_cell", lambda *a, **k: {"cell": a[2].label, "causal": a[4], "status": "ok",
                                                               "us": {"attngen": 1.0}})
    monkeypatch.setattr(train, "format_train", lambda report: "table")
    run = CliRunner().invoke(main, ["bench", "--train", "--train-cells", "1x4x128x64", "--json", str(out)])
    assert run.exit_code == 0, run.output
    done = json.loads(out.read_text())
    assert "partial" not in done and len(done["rows"]) == 2
    assert done["command"].startswith("attngen bench --train --train-cells 1x4x128x64 ")


def test_the_train_table_gives_per_step_and_back_to_back_times_and_their_ratios():
    """bench --train's table: per cell attngen's GPU time per step, the peers', the ratio to the fastest, the same
    back to back (a training loop's steps: the backward's kernels may start before the step ahead ends) and
    eager; a summary line for each ratio, naming the cells below 1.0x; a row without b2b (an older report) prints
    '-' there."""
    from attngen.eval.bench.train import format_train
    row = {"cell": "1x8x512x64", "dtype": "bf16", "causal": True, "status": "ok", "tflops": 50.0, "ratio": 1.05,
           "ratio_b2b": 0.98, "us": {"attngen": 100.0, "sdpa:cudnn": 105.0, "sdpa:flash": 150.0},
           "b2b_us": {"attngen": 96.0, "sdpa:cudnn": 94.1, "sdpa:flash": 140.0},
           "eager_us": {"attngen": 300.0, "sdpa:cudnn": 320.0}}
    old = {k: v for k, v in row.items() if k not in ("b2b_us", "ratio_b2b")} | {"cell": "1x8x1024x64", "causal": False}
    lines = format_train({"gpu": "stand-in", "torch": "t", "rounds": 3, "rows": [row, old]}).splitlines()
    assert lines[1].split()[3:] == ["attngen", "us", "TFLOP/s", "cudnn", "us", "flash", "us", "x", "best", "b2b", "us",
                                    "x", "b2b", "eager", "us", "cudnn", "eager"]
    assert lines[3].split()[3:] == ["100.0", "50.0", "105.0", "150.0", "1.05", "96.0", "0.98", "300.0", "320.0"]
    assert lines[4].split()[3:] == ["100.0", "50.0", "105.0", "150.0", "1.05", "-", "-", "300.0", "320.0"]
    assert lines[-2] == "2 cells timed; geometric mean 1.05x the fastest SDPA backend; none below 1.0x"
    assert lines[-1] == ("back to back: geometric mean 0.98x the fastest SDPA backend; below 1.0x: "
                         "1x8x512x64 causal bf16 0.98x")
