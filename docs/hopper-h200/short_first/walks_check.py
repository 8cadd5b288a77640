"""The persistent walks' GPU check (tests/test_gpu_verify.py, PERSISTENT_WALKS: grids with more query blocks than
SMs, odd and even ramps, GQA, bshd) on named specs that the test's list does not hold yet: every case within the
error rule, or exit 1. Usage (GPU machine, repository root): python3 docs/hopper-h200/short_first/walks_check.py SPEC..."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))

import attngen  # noqa: E402
from attngen.eval import verify  # noqa: E402
from test_gpu_verify import PERSISTENT_WALKS  # noqa: E402

failed = 0
for path in sys.argv[1:]:
    kernel = attngen.load(path)
    results = verify.verify_kernel(kernel, PERSISTENT_WALKS, spec_label=kernel.name)
    bad = [r for r in results if not r.passed]
    failed += len(bad)
    print(f"{kernel.name}: {len(results) - len(bad)} passed, {len(bad)} failed", flush=True)
    for r in bad[:5]:
        print(f"  {r}")
sys.exit(1 if failed else 0)
