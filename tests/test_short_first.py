"""schedule.short_first: a persistent walk's unit takes its shorter query block first, so the longer one reads the
head's first K/V tiles again while they are in L2 (d256's short causal member read 1.17-1.22x the inputs from DRAM
without it, 1.02-1.03x with it: docs/hopper-h200/short_first/README.md). The key changes the walk's one line and its
comments, nothing else; the host test of the walk (test_persistent_walk_host.py) checks that every query block is
still taken once."""
from __future__ import annotations

import difflib
from pathlib import Path

import pytest
import yaml

from attngen.render import render_bundle
from attngen.spec import load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[1]


def rendered(name: str, short_first: bool) -> str:
    """The committed spec `name` with schedule.short_first set as given, renamed so both renders share one name."""
    data = load_spec(ROOT / "specs" / f"{name}.yaml").model_dump(mode="json", exclude_defaults=True, by_alias=True)
    data["schedule"]["short_first"] = short_first
    data["name"] = "t_walk"
    return render_bundle(parse_spec(yaml.safe_dump(data), "t_walk.yaml"))[1][0]


def code_changes(before: str, after: str) -> list[str]:
    """Lines added or removed between two renders, comments left out."""
    strip = lambda text: [l.strip() for l in text.splitlines() if not l.lstrip().startswith("//")]  # noqa: E731
    return [l for l in difflib.unified_diff(strip(before), strip(after), lineterm="", n=0)
            if l[:1] in "+-" and l[:3] not in ("+++", "---")]


@pytest.mark.parametrize("name", ["h100_wgmma_d256_persistent_n64_pm_ot_sf",   # the middle_pairs walk
                                  "h100_wgmma_d128_persistent_q2_sf"])          # the walk without it
def test_short_first_changes_only_the_order_of_a_units_blocks(name):
    before, after = rendered(name, False), rendered(name, True)
    assert code_changes(before, after) == ["-m_block = second ? k : ramp - 1 - k;",
                                           "+m_block = second ? ramp - 1 - k : k;"]
