"""The native training step's build and bookkeeping without torch or a GPU (a stand-in torch module):
where its library lives (per source and torch build), the compiler's command line, `attngen doctor`'s
line about it, and ATTNGEN_NATIVE=0. The step itself runs in tests/test_gpu_native_step.py."""
from __future__ import annotations

import types
from pathlib import Path

import pytest

from attngen.doctor import native_step_finding
from attngen.runtime import native


def _torch(version="2.11.0+cu130", git="abc123", abi=True, root="/opt/torch/torch"):
    return types.SimpleNamespace(__version__=version, version=types.SimpleNamespace(git_version=git),
                                 _C=types.SimpleNamespace(_GLIBCXX_USE_CXX11_ABI=abi), __file__=f"{root}/__init__.py")


def test_the_library_is_keyed_by_source_and_torch_build(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path))
    a = native.library_path(_torch())
    assert a.parent == tmp_path / "native" and a.name.startswith("train_step-") and a.suffix == ".so"
    assert native.library_path(_torch()) == a
    assert native.library_path(_torch(version="2.12.0+cu130")) != a
    assert native.library_path(_torch(git="def456")) != a
    assert native.library_path(_torch(abi=False)) != a


def test_the_build_command_names_torch_and_cuda_headers(monkeypatch, tmp_path):
    include = tmp_path / "cuda" / "include"
    include.mkdir(parents=True)
    (include / "cuda.h").write_text("")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    monkeypatch.setenv("PATH", "")                     # no nvcc: CUDA_HOME's headers
    monkeypatch.setenv("CXX", "g++")
    cmd = native.build_command(_torch(abi=False), tmp_path / "out.so")
    assert cmd[0] == "g++" and "-D_GLIBCXX_USE_CXX11_ABI=0" in cmd and "-shared" in cmd
    assert "-I/opt/torch/torch/include" in cmd and f"-I{include}" in cmd and str(native.SOURCE) in cmd
    assert {"-lc10", "-lc10_cuda", "-ltorch_cpu"} <= set(cmd) and "-Wl,-rpath,/opt/torch/torch/lib" in cmd


def test_the_library_links_the_libstdcxx_this_process_runs(monkeypatch, tmp_path):
    (tmp_path / "cuda.h").write_text("")
    monkeypatch.setattr(native, "_cuda_include", lambda: tmp_path)
    monkeypatch.setenv("CXX", "g++")
    monkeypatch.setattr(native, "loaded_libstdcxx", lambda: "/usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.33")
    cmd = native.build_command(_torch(), tmp_path / "out.so")
    assert cmd.index("/usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.33") < cmd.index("-o")
    keyed = native.library_path(_torch())
    monkeypatch.setattr(native, "loaded_libstdcxx", lambda: None)
    assert "-o" in native.build_command(_torch(), tmp_path / "out.so") and native.library_path(_torch()) != keyed


def test_a_library_whose_error_ends_its_process_fails_the_self_test(monkeypatch, tmp_path):
    from attngen.errors import ToolError
    child = tmp_path / "python"
    for body, ok in (("kill -SEGV $$\n", False), ("exit 3\n", False), ("exit 0\n", True)):
        child.write_text("#!/bin/sh\n" + body)
        child.chmod(0o755)
        monkeypatch.setattr(native.sys, "executable", str(child))
        if ok:
            native.self_test(tmp_path / "lib.so", "g++")
        else:
            with pytest.raises(ToolError, match="self-test .*(signal 11|exit 3).*g\\+\\+ built it"):
                native.self_test(tmp_path / "lib.so", "g++")


def test_no_compiler_is_a_tool_error_that_says_so(monkeypatch, tmp_path):
    from attngen.errors import ToolError
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(ToolError, match="C\\+\\+ compiler"):
        native.build_command(_torch(), tmp_path / "out.so")



def test_doctor_says_whether_it_is_built_or_turned_off(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(native.ENV, raising=False)
    torch = _torch()
    missing = native_step_finding(torch)
    assert not missing.ok and missing.note and "attngen warm" in missing.detail
    path = native.library_path(torch)
    path.parent.mkdir(parents=True)
    native.failure_note(path).write_text("the native training step did not compile (g++ exited 1):\nerror: x\n")
    failed = native_step_finding(torch)
    assert not failed.ok and "did not compile" in failed.detail and "attngen warm" in failed.detail
    path.write_bytes(b"")
    monkeypatch.delenv(native.OPS_ENV, raising=False)
    built = native_step_finding(torch)
    assert built.ok and str(path) in built.detail and "kernels serve torch.compile's" in built.detail
    monkeypatch.setenv(native.OPS_ENV, "0")
    assert "do not serve torch.compile's attngen training ops (ATTNGEN_NATIVE_OPS=0)" in native_step_finding(torch).detail
    monkeypatch.setenv(native.ENV, "0")
    off = native_step_finding(torch)
    assert not off.ok and off.note and "ATTNGEN_NATIVE=0" in off.detail
    assert native.unavailable() and not native.enabled()


def _compiler_script(tmp_path, body: str, name: str = "cxx.sh"):
    """A stand-in C++ compiler: a shell script run with the build's arguments; it counts its runs."""
    script = tmp_path / name
    script.write_text("#!/bin/sh\necho run >> " + str(tmp_path / "runs") + "\n" + body)
    script.chmod(0o755)
    return str(script)


def _runs(tmp_path) -> int:
    f = tmp_path / "runs"
    return len(f.read_text().splitlines()) if f.exists() else 0


@pytest.fixture
def fresh_state(monkeypatch, tmp_path):
    """A cache of its own, native turned on, and this process's bookkeeping as a new process has it."""
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(native.ENV, raising=False)
    monkeypatch.setattr(native, "_state", {"loaded": False, "failed": None, "building": None, "next_look": 0.0})
    monkeypatch.setattr(native, "_cuda_include", lambda: tmp_path)
    monkeypatch.setattr(native, "self_test", lambda path, compiler="": None)   # a stand-in library loads nowhere


def test_a_build_compiles_once_and_a_failed_one_leaves_its_message(fresh_state, tmp_path, monkeypatch, capsys):
    from attngen.errors import ToolError
    torch = _torch()
    # a compiler that writes its -o file: built once, then found
    monkeypatch.setenv("CXX", _compiler_script(tmp_path, 'while [ "$1" != "-o" ]; do shift; done; echo lib > "$2"\n'))
    path = native.build(torch)
    assert path.read_text() == "lib\n" and _runs(tmp_path) == 1 and native.build(torch) == path and _runs(tmp_path) == 1
    assert not list(path.parent.glob("*.tmp.so"))
    # another compiler (another key) that fails: its message is kept and raised again without compiling
    monkeypatch.setenv("CXX", _compiler_script(tmp_path, 'echo "error: no such header" >&2; exit 1\n', "bad.sh"))
    with pytest.raises(ToolError, match="no such header"):
        native.build(torch)
    failed = native.library_path(torch)
    assert "no such header" in native.failure_note(failed).read_text() and _runs(tmp_path) == 2
    with pytest.raises(ToolError, match="no such header"):
        native.build(torch, retry=False)
    assert _runs(tmp_path) == 2
    # a training process finds the note: it says why once and keeps the Python node, building nothing
    assert not native.ready(torch) and native.unavailable()
    assert "no such header" in capsys.readouterr().err and _runs(tmp_path) == 2


def test_ready_loads_a_built_library_and_moves_aside_one_that_does_not_load(fresh_state, tmp_path, capsys):
    loaded = []

    class Ops:
        @staticmethod
        def load_library(p):
            loaded.append(p)
            if "bad" in Path(p).read_text():
                raise OSError("undefined symbol: _ZN3c10")
    torch = _torch()
    torch.ops = Ops()
    path = native.library_path(torch)
    path.parent.mkdir(parents=True)
    path.write_text("good")
    assert native.ready(torch) and loaded == [str(path)] and native.ready(torch) and len(loaded) == 1
    native._state.update(loaded=False, next_look=0.0)
    path.write_text("bad")
    assert not native.ready(torch) and not path.exists() and path.with_suffix(".bad").exists()
    assert "undefined symbol" in capsys.readouterr().err and native.unavailable()



def test_a_training_process_starts_one_build_and_looks_for_it_again_later(fresh_state, monkeypatch, capsys):
    class Build:
        code = None

        def poll(self):
            return self.code
    build, started = Build(), []

    def start():
        started.append(1)
        native._state["building"] = build
    monkeypatch.setattr(native, "_start_build", start)
    torch = _torch()
    assert not native.ready(torch) and started == [1]
    assert not native.ready(torch) and started == [1]          # within POLL_SECONDS: not even looked
    native._state["next_look"] = 0.0
    assert not native.ready(torch) and started == [1] and not native.unavailable()   # still building
    build.code, native._state["next_look"] = 1, 0.0             # it ended, leaving neither library nor note
    assert not native.ready(torch) and native.unavailable()
    assert "ended without a library" in capsys.readouterr().err



def test_an_imports_load_loads_a_built_library_and_builds_nothing(fresh_state, monkeypatch):
    """load_built (attngen.ops's import unless ATTNGEN_NATIVE_OPS=0): a library that is built is loaded and
    takes the ops; none built starts no build (a process that never trains)."""
    started, loaded, taken = [], [], []
    monkeypatch.setattr(native, "_start_build", lambda: started.append(1))
    monkeypatch.setattr(native, "take_ops", lambda torch: taken.append(1))

    class Ops:
        @staticmethod
        def load_library(p):
            loaded.append(p)
    torch = _torch()
    torch.ops = Ops()
    assert not native.load_built(torch) and started == [] and loaded == []
    path = native.library_path(torch)
    path.parent.mkdir(parents=True)
    path.write_text("built")
    assert native.load_built(torch) and loaded == [str(path)] and taken == [1] and started == []
    assert native.load_built(torch) and len(loaded) == 1
