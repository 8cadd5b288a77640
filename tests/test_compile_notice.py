"""The line a first call prints while it compiles a spec (Kernel.from_sources' default on_compile): one per
part of the spec's bundle, naming the part where there are several (a backward spec compiles three), the
spec alone where there is one. Without a GPU: the compiler, the cubin's reading and the driver are stand-ins."""
from __future__ import annotations

import types
from pathlib import Path

import pytest

from attngen.runtime import calls
from attngen.runtime import kernel as kernel_module
from attngen.runtime.kernel import _compile_notice, bundle_of

ROOT = Path(__file__).resolve().parent.parent


class _Stop(Exception):
    """Raised where the stand-ins end the load: past the parts' compiles."""


def _notices(monkeypatch, capsys, spec: str, on_compile=None) -> list[str]:
    plan, sources, _ = bundle_of(ROOT / "specs" / f"{spec}.yaml")
    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(current_device=lambda: 0),
                                       device=lambda kind, index: (kind, index))
    monkeypatch.setattr(kernel_module, "gpu_modules", lambda: (fake_torch, None))
    monkeypatch.setattr(kernel_module, "device_info", lambda index: types.SimpleNamespace(arch=plan.target.arch))

    def compile_source(source, arch, on_compile=None):
        on_compile(arch)
        return types.SimpleNamespace(cubin=b"")
    layout = {name: (0, plan.abi.size) for part in plan.parts for _key, name in part.functions + part.awaiting_twins}
    monkeypatch.setattr(kernel_module, "compile_source", compile_source)
    monkeypatch.setattr(kernel_module, "param_layout", lambda cubin: layout)
    monkeypatch.setattr(kernel_module.driver, "load_library", lambda cubin: object())
    monkeypatch.setattr(kernel_module.driver, "library_kernel", lambda library, name: name)
    cls = calls.kernel_class(plan)

    def stop(*args, **kwargs):
        raise _Stop
    monkeypatch.setattr(cls, "__init__", stop)
    capsys.readouterr()
    with pytest.raises(_Stop):
        cls.from_sources(plan, sources, on_compile=on_compile)
    return capsys.readouterr().err.splitlines()


def test_a_backward_spec_names_each_of_its_three_parts(monkeypatch, capsys):
    plan, _, _ = bundle_of(ROOT / "specs" / "l4_bwd_d64.yaml")
    assert [p.name for p in plan.parts] == ["main", "preprocess", "convert"]
    arch = plan.compile_arch(plan.target.arch)
    assert _notices(monkeypatch, capsys, "l4_bwd_d64") == [
        f"compiling l4_bwd_d64 (main, part 1 of 3) for {arch} ...",
        f"compiling l4_bwd_d64 (preprocess, part 2 of 3) for {arch} ...",
        f"compiling l4_bwd_d64 (convert, part 3 of 3) for {arch} ..."]


def test_a_one_part_spec_is_named_alone_and_a_callers_notice_replaces_the_line(monkeypatch, capsys):
    assert _notices(monkeypatch, capsys, "phase4") == ["compiling phase4 for sm_89 ..."]
    seen = []
    assert _notices(monkeypatch, capsys, "l4_bwd_d64", on_compile=seen.append) == [] and len(seen) == 3


def test_the_notice_prints_one_line_to_stderr(capsys):
    _compile_notice("h100_bwd", "convert", 3, 3)("sm_90a")
    _compile_notice("phase4", "fwd", 1, 1)("sm_89")
    out = capsys.readouterr()
    assert out.out == "" and out.err.splitlines() == ["compiling h100_bwd (convert, part 3 of 3) for sm_90a ...",
                                                      "compiling phase4 for sm_89 ..."]
