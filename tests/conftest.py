# -- nvcc: tests marked `nvcc` compile generated kernels; without nvcc on PATH they skip with a reason.
import os as _os
import shutil as _shutil
from pathlib import Path as _Path

import pytest as _pytest


@_pytest.fixture(autouse=True)
def _skip_without_nvcc(request):
    # An autouse fixture rather than a collection hook, so that other skips in this file can
    # define their own hooks without one silently replacing another.
    if request.node.get_closest_marker("nvcc") and _shutil.which("nvcc") is None:
        _pytest.skip("nvcc not on PATH: install the CUDA toolkit and put its bin/ on PATH to run compile tests")


@_pytest.fixture(scope="session", autouse=True)
def _attngen_cache_dir(tmp_path_factory):
    # Compile tests measure fresh nvcc runs, not a user's cache; an explicit ATTNGEN_CACHE_DIR wins.
    if _os.environ.get("ATTNGEN_CACHE_DIR"):
        yield
        return
    with _pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNGEN_CACHE_DIR", str(tmp_path_factory.mktemp("attngen-cache")))
        yield


# -- gpu: tests marked `gpu` run kernels; without torch (CUDA build), a GPU, the CUDA driver or nvcc they skip
# with a reason. Also an autouse fixture, for the reason given above.
import functools as _functools


@_functools.lru_cache(maxsize=None)
def _gpu_skip_reason():
    try:
        import torch
    except ImportError:
        return "torch is not installed: pip install -e '.[gpu]'"
    if not torch.cuda.is_available():
        return f"no CUDA GPU visible to torch {torch.__version__}"
    from attngen.errors import NoGpuError
    from attngen.runtime import driver
    try:
        driver.lib()
    except NoGpuError as exc:
        return str(exc)
    from attngen.compile import find_nvcc
    from attngen.errors import ToolError
    try:
        find_nvcc()
    except ToolError as exc:
        return f"GPU tests compile kernels: {exc}"
    return None


@_pytest.fixture(autouse=True)
def _skip_without_gpu(request):
    if request.node.get_closest_marker("gpu"):
        reason = _gpu_skip_reason()
        if reason:
            _pytest.skip(reason)


# -- shipped_copy: specs/ and generated/ copied to a temporary folder and served as the shipped ones (the
# committed sources and launch records of tests/test_first_call.py and tests/test_launch_record.py).
@_pytest.fixture
def shipped_copy(tmp_path, monkeypatch):
    import attngen.shipped
    root = _Path(__file__).resolve().parent.parent
    for name in ("specs", "generated"):
        _shutil.copytree(root / name, tmp_path / name)
    real = attngen.shipped.shipped
    monkeypatch.setattr(attngen.shipped, "shipped",
                        lambda name: tmp_path / name if name in ("specs", "generated") else real(name))
    return tmp_path
