"""schedule.softmax_block: in the SASS ptxas makes, every exponential of the overlapped loop comes ahead of the wait
for the previous tile's P.V. ptxas decides that order (docs/performance/hopper.md, "Where the P.V wait sits"), so
only the compiled code shows it. Needs nvcc and cuobjdump (skipped without them); no GPU."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from attngen.compile import run_nvcc
from attngen.errors import ToolError
from attngen.render import render_for

ROOT = Path(__file__).resolve().parents[1]
S_WAIT, PV_WAIT = "WARPGROUP.DEPBAR.LE gsb0, 0x1", "WARPGROUP.DEPBAR.LE gsb0, 0x0"


def cuda_tools() -> tuple[str, str] | None:
    nvcc = shutil.which("nvcc")
    cuobjdump = shutil.which("cuobjdump") or (nvcc and str(Path(nvcc).resolve().parent / "cuobjdump"))
    return (nvcc, cuobjdump) if nvcc and cuobjdump and Path(cuobjdump).is_file() else None


def functions(sass: str) -> dict[str, list[str]]:
    """Each function's instructions (the text after the address), by name."""
    out, name = {}, None
    for line in sass.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            name = m.group(1)
            out[name] = []
        elif name and (m := re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line)):
            out[name].append(m.group(1))
    return out


def loop_exponentials(code: list[str]) -> tuple[int, int]:
    """In the overlapped loop (from the wait for S_t): exponentials before the wait for P.V of tile t-1, and after
    it up to the next wgmma."""
    start = next(i for i, ins in enumerate(code) if S_WAIT in ins)
    stop = next(i for i in range(start, len(code)) if PV_WAIT in code[i])
    end = next((i for i in range(stop, len(code)) if "GMMA" in code[i]), len(code))
    count = lambda lines: sum("MUFU.EX2" in ins for ins in lines)
    return count(code[start:stop]), count(code[stop:end])


@pytest.mark.parametrize("spec", ["h100_wgmma_d64_n128c1ps3opb", "h100_wgmma_d64_varlen"])
def test_the_softmax_runs_ahead_of_the_wait_for_pv(spec, tmp_path):
    tools = cuda_tools()
    if tools is None:
        pytest.skip("needs nvcc and cuobjdump (the CUDA toolkit's bin/ on PATH)")
    nvcc, cuobjdump = tools
    plan, source, _ = render_for(ROOT / "specs" / f"{spec}.yaml")
    assert plan.fragments.softmax_block
    try:
        result = run_nvcc(source, "sm_90a", nvcc)
    except ToolError as exc:
        pytest.skip(f"nvcc could not build for sm_90a here: {exc}")
    (tmp_path / "k.cubin").write_bytes(result.cubin)
    sass = subprocess.run([cuobjdump, "-sass", str(tmp_path / "k.cubin")], capture_output=True, text=True,
                          check=True).stdout
    found = functions(sass)
    assert found
    for name, code in found.items():
        if S_WAIT not in "\n".join(code):
            continue   # a function without the overlapped loop
        ahead, behind = loop_exponentials(code)
        assert ahead > 0 and behind == 0, f"{name}: {ahead} exponentials ahead of P.V's wait, {behind} behind it"
