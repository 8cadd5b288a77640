"""The judges read their values in one copy of the device (cases.read_back) and still find every fault:
NaN outputs, LSE rows that should be -inf, guards written, errors over the bound, a PyCUDA launch that
differs. Runs on torch's CPU tensors (skips where torch is not installed)."""
from __future__ import annotations

import contextlib

import pytest

torch = pytest.importorskip("torch", reason="the judges are torch code; the base and dev installs have no torch")

from attngen.eval.verify import cases, pycuda_launch  # noqa: E402
from attngen.eval.verify.backward import judge_gradients  # noqa: E402


class _Shape:
    label, layout = "B1 H2 Sq5 Sk5", "bhsd"


def _result():
    return cases.CaseResult("spec", "fn", "none", _Shape(), passed=False)


def _rows(seed=0):
    g = torch.Generator().manual_seed(seed)
    ref = torch.randn(1, 2, 5, 8, generator=g)
    low = (ref + 1e-3 * torch.randn(ref.shape, generator=g)).half().float()
    out = (ref + 1e-3 * torch.randn(ref.shape, generator=g)).half()
    ref_lse = torch.randn(1, 2, 5, generator=g)
    return out, ref, low, ref_lse + 1e-5, ref_lse


def test_read_back_reads_tensors_and_keeps_numbers():
    got = cases.read_back(torch, {"a": torch.tensor(3), "b": 0.5, "c": torch.tensor(True), "d": torch.tensor(2.5)})
    assert got == {"a": 3.0, "b": 0.5, "c": 1.0, "d": 2.5}
    assert cases.read_back(torch, {"x": 1}) == {"x": 1}


def test_judge_rows_passes_a_good_case_and_finds_each_fault():
    out, ref, low, lse, ref_lse = _rows()
    r = _result()
    cases.judge_rows(r, torch, out, ref, low, lse, ref_lse, "fp16")
    assert r.passed and r.max_err <= r.bound, r.problems

    bad = out.clone()
    bad[0, 0, 0, 0] = float("nan")
    r = _result()
    cases.judge_rows(r, torch, bad, ref, low, lse, ref_lse, "fp16")
    assert not r.passed and "NaN/inf" in r.problems[0]

    r = _result()
    cases.judge_rows(r, torch, out * 1.5, ref, low, lse, ref_lse, "fp16")
    assert not r.passed and "exceeds" in r.problems[0]

    hidden = ref_lse.clone()
    hidden[0, 1, 2] = float("-inf")       # the reference sees no key there; the kernel's LSE is finite
    r = _result()
    cases.judge_rows(r, torch, out, ref, low, lse, hidden, "fp16")
    assert not r.passed and any("LSE" in p for p in r.problems)


def test_judge_lse_finds_a_written_guard_and_a_far_lse():
    _, _, _, lse, ref_lse = _rows(1)
    guard = torch.full((8,), float("nan"))
    r = _result()
    cases.judge_lse(r, torch, lse, ref_lse, guard)
    assert not r.problems
    guard[5] = 0.0
    r = _result()
    cases.judge_lse(r, torch, lse + 0.5, ref_lse, guard)
    assert any("past" in p for p in r.problems) and any("lse error" in p for p in r.problems)


def test_judge_gradients_names_the_bad_gradient_and_reads_extras():
    out, ref, low, _, _ = _rows(2)
    grads, refs, lows = [out, out, out], [ref, ref, ref], [low.half()] * 3
    r = _result()
    extra = judge_gradients(torch, r, grads, refs, lows, "fp16", extra={"dq": torch.tensor(False),
                                                                        "dv": torch.tensor(True)})
    assert r.passed, r.problems
    assert extra == {"dq": 0.0, "dv": 1.0}
    r = _result()
    judge_gradients(torch, r, [out, out * 2, out], refs, lows, "fp16")
    assert not r.passed and r.problems[0].startswith("dk:")


class _Kernel:
    _torch = torch
    device = torch.device("cpu")

    @contextlib.contextmanager
    def launching_through(self, _launcher):
        yield self


@pytest.mark.parametrize("change, atomic, expect", [
    (0.0, (), "bitwise"),
    (1e-3, (), "differs"),
    (1e-3, ("o",), "bitwise but atomics"),
    (1.0, ("o",), "differs"),
])
def test_pycuda_agreement_compares_in_one_read(monkeypatch, change, atomic, expect):
    monkeypatch.setattr(pycuda_launch, "launcher", lambda: None)
    o, lse = torch.randn(4, 8), torch.randn(4)

    def launch(o2, lse2):
        o2.copy_(o)
        o2[1, 2] += change
        lse2.copy_(lse)
    r = _result()
    pycuda_launch.pycuda_agreement(r, _Kernel(), launch, ("o", "lse"), (o, lse), atomic=atomic,
                                   tolerance={"o": torch.tensor(0.01), "lse": 0.0})
    assert r.pycuda == expect
    assert bool(r.problems) == (expect == "differs")
