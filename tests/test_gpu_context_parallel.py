"""Context parallelism over NCCL with attngen as SDPA's flash backend (#62, docs/integrations.md):
torch's context_parallel shards a causal (and a full) attention's sequence over two GPUs, each ring
block runs attngen's kernels through aten's flash ops, and the forward and gradients match an fp32
reference of the whole sequence under the error rule. The ranks run
docs/measurements/context_parallel.py under torch.distributed.run; this test reads its report."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "docs" / "measurements" / "context_parallel.py"


def test_context_parallel_over_two_gpus_runs_attngen_and_matches_the_reference(tmp_path):
    import torch
    import torch.distributed as dist
    if torch.cuda.device_count() < 2:
        pytest.skip(f"context parallelism needs two GPUs ({torch.cuda.device_count()} visible)")
    if not dist.is_nccl_available():
        pytest.skip("torch was built without NCCL")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the committed dispatch table measures sm_90 (H100/H200) for every call")
    try:
        from torch.distributed.tensor.experimental import context_parallel  # noqa: F401
        from attngen.integrations import sdpa
        sdpa.register()
    except ImportError as exc:
        pytest.skip(str(exc))
    report = tmp_path / "cp.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(SCRIPT),
                          "--json", str(report), "--seq", "4096", "--iters", "3"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    cases = json.loads(report.read_text())["cases"]
    assert {c["causal"] for c in cases} == {True, False}
    for case in cases:
        assert case["ranks"] == 2
        assert case["passed"], case
        assert case["attngen_ran_every_block"], case
