"""The verify report formats every case type: the table (`format_verify`) and the `--json` writer
take a report holding one case of each type the call conventions bring (padded forward, varlen,
decode), passing and failing. No GPU: the cases are built by hand, as verify builds them."""
from __future__ import annotations

import dataclasses
import json

import pytest

from attngen.cli.verify import format_verify, write_verify_json
from attngen.eval.verify.decode import DecodeCase
from attngen.eval.verify.varlen import VarlenCase
from attngen.eval.verify import CaseResult, CaseShape, Shape, VerifyReport

CASE_SHAPES = (
    Shape(2, 4, 2, 113, 300, "bshd"),
    VarlenCase(8, 2, (5, 100, 1, 77), (300, 64, 0, 77), give_max=True),
    DecodeCase(3, 32, 8, 4, 165, (31, 32, 33), causal=True, page_size=16),
)


def report_of_every_type() -> VerifyReport:
    cases = []
    for shape in CASE_SHAPES:
        cases.append(CaseResult("spec_a", "attngen_spec_a_none", "none", shape, passed=True, max_err=1e-3,
                                lowprec_err=9e-4, bound=1.8e-3, lse_err=2e-6, lse_excess=0.01))
        cases.append(CaseResult("spec_a", "attngen_spec_a_causal", "causal:bottom_right", shape, passed=False,
                                max_err=float("nan"), lowprec_err=1e-3, bound=2e-3, lse_err=None,
                                problems=["3 of 40 output elements are NaN/inf (unwritten or overflowed)"]))
    return VerifyReport("Stub GPU", "sm_90", "stub", "quick", cases)


@pytest.mark.parametrize("shape", CASE_SHAPES, ids=lambda s: type(s).__name__)
def test_every_case_type_says_its_shape_and_layout(shape):
    assert isinstance(shape, CaseShape)
    assert dataclasses.is_dataclass(shape)
    assert shape.label and shape.layout in ("bhsd", "bshd", "thd")


def test_format_verify_has_one_row_per_case_of_every_type():
    report = report_of_every_type()
    lines = format_verify(report).splitlines()
    assert len(lines) == 2 + len(report.cases)
    for line, case in zip(lines[2:], report.cases):
        assert case.shape.label in line and f" {case.shape.layout} " in line
        assert line.endswith("pass") == case.passed
    failing = format_verify(report, failures_only=True).splitlines()
    assert len(failing) == 2 + len(report.failed)
    assert all("FAIL: 3 of 40" in line for line in failing[2:])


def test_json_writer_keeps_every_case(tmp_path):
    report = report_of_every_type()
    path = tmp_path / "verify.json"
    write_verify_json(report, path)
    data = json.loads(path.read_text())
    assert (data["passed"], data["failed"]) == (3, 3)
    assert [c["shape"]["layout"] for c in data["cases"]] == [c.shape.layout for c in report.cases]
    assert [c["shape"]["label"] for c in data["cases"]] == [c.shape.label for c in report.cases]
    assert data["cases"][1]["max_err"] == "nan"          # JSON has no NaN


def test_bench_tables_format_gpu_and_eager_columns():
    """The decode and varlen bench tables print GPU and eager times for attngen and torch (decode's also the
    GPU time back to back), and a missing torch time as '-' (no GPU: rows as the benches build them)."""
    from attngen.eval.bench.decode import format_decode
    from attngen.eval.bench.varlen import format_varlen
    decode = {"gpu": "Stub", "copy_gbps": 4000.0, "paged": False, "rows": [
        {"cell": "B8 32/8 Sk8192 Sq1", "spec": "d", "attngen_us": 70.0, "attngen_b2b_us": 68.0,
         "attngen_eager_us": 71.0, "splits": 2, "gbps": 3800.0, "pct_of_copy": 90.0, "flash_us": 75.0,
         "flash_b2b_us": 74.0, "flash_eager_us": 76.0, "cudnn_us": None, "vs_fastest": 1.07}]}
    text = format_decode(decode, ("flash", "cudnn"))
    assert "75.0/74.0/76.0" in text and "-/-/-" in text
    assert text.splitlines()[-1].split()[5:8] == ["70.0", "68.0", "71.0"]
    assert text.splitlines()[1].split()[2:6] == ["us", "b2b", "us", "eager"]
    varlen = {"gpu": "Stub", "torch": "t", "lengths": [1, 2], "heads": [16, 16], "rows": [
        {"spec": "v", "head_dim": 64, "causal": False, "status": "ok", "attngen_us": 650.0, "attngen_eager_us": 652.0,
         "tflops": 336.0, "flash_us": 790.0, "flash_eager_us": None, "vs_flash": 1.21}]}
    text = format_varlen(varlen)
    assert "652.0" in text and "790.0" in text and text.splitlines()[-1].split()[-2] == "-"


def backward_report() -> dict:
    """A backward bench report as `attngen bench --json` writes it for backward specs (no GPU)."""
    def timing(impl, us=None, status="ok", note=""):
        return {"impl": impl, "median_us": us, "tflops": None if us is None else 100.0,
                "spread_pct": None if us is None else 1.0, "status": status, "note": note,
                "eager_us": None if us is None else us + 20.0,
                "back_to_back_us": None if us is None else us - 100.0}
    case = {"batch": 4, "heads": 16, "seqlen": 2048, "head_dim": 64, "dtype": "fp16", "causal": True,
            "head_dim_v": 0, "call": "backward"}
    return {"gpu": "NVIDIA H200", "environment": {"torch": "2.11", "cuda": "13.0", "driver": "580"}, "call": "backward",
            "results": [{"case": case, "label": "4x16x2048x64 fp16 causal", "flops": 1.0,
                         "timings": [timing("h100_bwd_d64", 1000.0), timing("h100_bwd_d64_varlen", status="wrong",
                                                                             note="dk: max error 0.3 exceeds 0.02"),
                                     timing("sdpa:flash", 800.0), timing("sdpa:cudnn", status="unsupported",
                                                                         note="No available kernel")]}],
            "notes": ["h100_bwd_d64: bf16 not timed (the spec is fp16)"]}


def test_backward_bench_table():
    """The backward bench's table: GPU and eager time, TFLOP/s and the ratio against each SDPA
    backend per spec, a failed check and an unsupported backend with their notes, then the notes."""
    from attngen.eval.bench.backward import format_backward
    lines = format_backward(backward_report()).splitlines()
    assert lines[0].startswith("backward: ") and "2.5 x the forward's" in lines[1]
    assert lines[2] == "GPU: NVIDIA H200; torch 2.11, CUDA 13.0, driver 580"
    assert lines[3].startswith("(time: GPU per call") and lines[4].split()[-2:] == ["/flash", "/cudnn"]
    row = {ln.split()[3]: ln.split()[4:] for ln in lines[5:9]}
    assert row["h100_bwd_d64"][:6] == ["1000.0", "900.0", "1020.0", "100.0", "1.0%", "0.80"]
    assert row["h100_bwd_d64_varlen"][:2] == ["wrong", "dk:"] and row["sdpa:cudnn"][0] == "unsupported"
    assert "  h100_bwd_d64             flash 0.80 (b2b 0.78), cudnn -" in lines
    assert lines[-2:] == ["not timed:", "  h100_bwd_d64: bf16 not timed (the spec is fp16)"]


def test_time_by_call_sums_each_convention_largest_first():
    """Where a run's time went: each case's call convention and wall time (Runner sets both), summed per
    call, the largest first; a case that did not run (no call) is left out; the JSON keeps each case's call."""
    report = report_of_every_type()
    for case, (call, seconds) in zip(report.cases, [("forward", 0.5), ("forward", 0.25), ("backward", 2.0),
                                                    ("backward", 1.0), ("decode", 0.1), (None, None)]):
        case.call, case.seconds = call, seconds
    assert report.time_by_call() == {"backward": (2, 3.0), "forward": (2, 0.75), "decode": (1, 0.1)}
    assert report.as_dict()["cases"][2]["call"] == "backward"


def test_the_runner_records_each_run_case_s_call_and_none_for_cases_not_run():
    """Runner: a case that ran carries its kernel's convention and time; one not run (the context lost
    before it) carries no call, so time_by_call leaves it out."""
    import types
    from attngen.eval.verify.runner import Runner
    kernel = types.SimpleNamespace(convention="backward", label="stub", device=types.SimpleNamespace(type="cpu"))
    shape = CASE_SHAPES[0]
    cases = [("none", "fn", shape, 0, lambda seed, label: CaseResult(label, "fn", "none", shape, passed=True))]
    ran = Runner(0, None).run(kernel, cases, 0, None)
    assert ran[0].call == "backward" and ran[0].seconds is not None
    lost = Runner(0, None)
    lost.context_lost = "after a fault"
    skipped = lost.run(kernel, cases, 0, None)
    assert skipped[0].call is None and not skipped[0].passed
    assert VerifyReport("Stub GPU", "sm_90", "stub", "full", ran + skipped).time_by_call()["backward"][0] == 1
