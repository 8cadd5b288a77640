"""The default run's sample of specs/: the first spec of each kind (specs/ before its lab, by name), so that every kind's
templates are rendered, checked and compiled on every run. A test that goes over every spec or every
generated file keeps the sample in the default run and marks the rest `exhaustive`, which CI runs
(pytest -m exhaustive); the two runs together cover specs/ as one run over everything did."""
from __future__ import annotations

from pathlib import Path

import pytest

from attngen.core.spec_cells import cell_at, folder_spec_files, spec_paths
from attngen.kinds import kind_of
from attngen.plan import make_plan
from attngen.spec import load_spec

ROOT = Path(__file__).resolve().parent.parent
# Every spec, served and lab, each dtype cell of a file by its path (attngen.core.spec_cells).
SPEC_PATHS = spec_paths(folder_spec_files(ROOT / "specs"))
PLANS = {p: make_plan(load_spec(p)) for p in SPEC_PATHS}
KINDS = {kind_of(plan.spec) for plan in PLANS.values()}
SAMPLE = frozenset(next(p for p, plan in PLANS.items() if kind_of(plan.spec) is k) for k in KINDS)
# the generated files of the sample (a bundle, decode or backward, renders one per part)
SAMPLE_FILES = frozenset(part.file_name for p in SAMPLE for part in PLANS[p].parts)


def spec_text(path: Path) -> str:
    """The text a spec path names: a file's, or that of one dtype's cell of a file listing dtypes."""
    return cell_at(path).text


def sampled(values, in_sample, ids):
    """pytest.param per value, marked `exhaustive` unless in_sample(value)."""
    return [pytest.param(*(v if isinstance(v, tuple) else (v,)), id=i,
                         marks=() if in_sample(v) else pytest.mark.exhaustive) for v, i in zip(values, ids)]
