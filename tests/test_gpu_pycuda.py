"""GPU tests: `attngen verify` launches every case a second time through PyCUDA and requires the
two launches to agree bit for bit (atomics-based outputs under the error rule); a launcher that
gets a kernel wrong fails the case. Skipped with a reason where there is no GPU."""
from __future__ import annotations

from pathlib import Path

import pytest

from attngen.eval import verify
from attngen.eval.verify import pycuda_launch

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
# One spec per call convention and kind: scalar, mma, wgmma (TMA maps in Params, over 48 KiB of
# shared memory), mma with varlen functions, decode (two parts), fp8, the backward of both kinds
# (dq by atomics; padded and varlen) and an expression.
SPECS = ["phase4", "h100_mma_d64", "h100_wgmma_d128", "h100_mma_d128_alibi", "h200_decode_d128",
         "h100_wgmma_d128_fp8", "h100_bwd_d64_varlen", "h100_bwd_d128_wgmma", "h100_wgmma_d128_expr_prefix_lm"]


def spec_path(name: str) -> Path:
    """A spec by name, as spec_paths names the cells of specs/ and of its lab (a cell of a family
    file has a path of its own name beside the file)."""
    from attngen.core.spec_cells import folder_spec_files, spec_paths
    paths = [p for p in spec_paths(folder_spec_files(ROOT / "specs")) if p.stem == name]
    assert len(paths) == 1, (name, paths)
    return paths[0]


def verify_quick(name: str):
    """`attngen verify --quick SPEC`'s report: the spec loaded, then every case of the quick suite."""
    kernels = verify.load_kernels([spec_path(name)])
    return verify.verify_kernels(kernels, verify.suite(True), suite_name="quick")


@pytest.mark.parametrize("name", SPECS)
def test_every_case_agrees_through_pycuda(name):
    report = verify_quick(name)
    assert report.cases and report.ok, [(c.variant, c.shape.label, c.problems) for c in report.failed]
    counts = report.pycuda_counts()
    assert counts["differs"] == 0 and counts["not run"] == 0, counts
    assert counts["bitwise"] + counts["bitwise but atomics"] == len(report.cases)
    assert pycuda_launch.launcher().launches >= len(report.cases)


class SkippingLauncher(pycuda_launch.PycudaLauncher):
    """Launches all but the last of a call's kernels: a decode's combine, a forward's only one."""

    def launch(self, kernel, prepared, params):
        prepared = type(prepared)(prepared.info, prepared.launches[:-1], prepared.template, prepared.patch,
                                  prepared.extra)
        super().launch(kernel, prepared, params)


class WrongGridLauncher(pycuda_launch.PycudaLauncher):
    """Launches the kernel with one block too few along x: the last query block is never written."""

    def launch(self, kernel, prepared, params):
        launches = tuple((fn, h, (max(1, g[0] - 1), g[1], g[2])) for fn, h, g in prepared.launches)
        prepared = type(prepared)(prepared.info, launches, prepared.template, prepared.patch, prepared.extra)
        super().launch(kernel, prepared, params)


@pytest.mark.parametrize("broken", [SkippingLauncher, WrongGridLauncher])
def test_a_launcher_that_gets_the_kernel_wrong_fails_the_case(broken, monkeypatch):
    monkeypatch.setattr(pycuda_launch, "_LAUNCHER", [broken()])
    report = verify_quick("h100_mma_d64")
    big = [c for c in report.cases if c.shape.seqlen_q > 128]
    assert big and all(not c.passed and c.pycuda == "differs" for c in big), \
        [(c.shape.label, c.pycuda, c.problems) for c in big]
    assert all("through PyCUDA differs" in "; ".join(c.problems) for c in big)
