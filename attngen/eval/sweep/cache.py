"""The record cache: one JSON record per (spec hash, GPU, shape, dtype, causal), so an interrupted
sweep resumes without measuring anything twice."""
from __future__ import annotations

import json
import re
from pathlib import Path

from ... import fsutil
from ...errors import WriteError
from ..bench.report import Case
from .build import Candidate
from .measure import Measurement, Measurer
from .space import shape_of

class RecordCache:
    """One JSON file per (spec hash, GPU, shape, dtype, causal) under <compile.cache_dir()>/sweep/.

    A record also holds the code hash it was measured with: after a template change the same
    spec renders other code, and its old record no longer counts.
    """

    def __init__(self, root: Path | None = None):
        if root is None:
            from ...compile import cache_dir
            root = cache_dir() / "sweep"
        self.root = Path(root)

    def path(self, spec_hash: str, gpu: str, case: Case) -> Path:
        gpu_slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
        shape = "x".join(map(str, shape_of(case)))
        return self.root / spec_hash[:32] / f"{gpu_slug}_{shape}_{case.dtype}_{'causal' if case.causal else 'full'}.json"

    def get(self, cand: Candidate, gpu: str, case: Case) -> dict | None:
        try:
            rec = json.loads(self.path(cand.spec_hash, gpu, case).read_text())
        except (OSError, ValueError):
            return None
        same = (rec.get("spec_hash") == cand.spec_hash and rec.get("code_hash") == cand.code_hash
                and rec.get("gpu") == gpu and tuple(rec.get("shape", ())) == shape_of(case)
                and rec.get("dtype") == case.dtype and rec.get("causal") == case.causal)
        return rec if same else None

    def put(self, record: dict) -> None:
        """Write atomically, so an interrupted sweep never leaves half a record. A record that
        cannot be written is a WriteError, as a cubin is: the cache is part of the job."""
        case = Case(*record["shape"][:4], record["dtype"], record["causal"], *record["shape"][4:])
        path = self.path(record["spec_hash"], record["gpu"], case)
        try:
            fsutil.ensure_dir(path.parent)
            fsutil.atomic_write_text(path, json.dumps(record, indent=1) + "\n")
        except WriteError as exc:
            from ...compile import CACHE_ENV
            raise WriteError(f"{exc}; the sweep's record cache must be writable: fix it or set {CACHE_ENV} to "
                             "another directory") from None


def make_record(cand: Candidate, measurer: Measurer, case: Case, m: Measurement) -> dict:
    return {"spec_hash": cand.spec_hash, "code_hash": cand.code_hash, "name": cand.name, "gpu": measurer.gpu,
            "shape": list(shape_of(case)), "dtype": case.dtype, "causal": case.causal, "status": m.status,
            "median_us": m.median_us, "note": m.note, "torch": measurer.torch_version}
