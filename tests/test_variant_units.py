"""Each built-in variant is one unit: its Python entry (attngen/core/variants.py) and its template,
templates/variants/<name>.j2. The shared hooks loop over the plan's variants and name none of them
(templates/lib/variant_hooks.j2), so a new variant touches its own files."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from attngen.core.variants import MASKS, SCORES

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "templates"
VARIANTS = tuple(MASKS.values()) + tuple(SCORES.values())
NAMES = {v.name for v in VARIANTS}
JINJA_TAG = re.compile(r"\{[{%](.*?)[%}]\}", re.S)
QUOTED = re.compile(r"""(['"])([A-Za-z_]+)\1""")


def quoted_names(path: Path) -> list[tuple[int, str]]:
    """(line, name) of every variant name quoted inside a Jinja tag of a template."""
    text = path.read_text()
    found = []
    for tag in JINJA_TAG.finditer(text):
        for q in QUOTED.finditer(tag.group(1)):
            if q.group(2) in NAMES:
                found.append((text.count("\n", 0, tag.start()) + 1, q.group(2)))
    return found


def test_no_template_outside_a_unit_switches_on_a_variant_name():
    units = {TEMPLATES / v.unit for v in VARIANTS if v.unit}
    found = [f"{p.relative_to(ROOT)}:{line}: {name!r}"
             for p in sorted(TEMPLATES.rglob("*.j2")) if p not in units for line, name in quoted_names(p)]
    assert not found, "shared templates name variants; move the code into the variant's unit:\n" + "\n".join(found)


def test_the_scan_finds_a_quoted_name(tmp_path):
    """The check above can fail: a tag that asks for a variant by name is found."""
    p = tmp_path / "t.j2"
    p.write_text('{% if "softcap" in names %}\nx\n{% endif %}\n{{ "alibi" }}\n')
    assert quoted_names(p) == [(1, "softcap"), (4, "alibi")]


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v.unit], ids=lambda v: v.name)
def test_each_unit_is_its_own_file(variant):
    assert variant.unit == f"variants/{variant.name}.j2"
    assert (TEMPLATES / variant.unit).is_file()


def test_every_unit_file_belongs_to_a_variant():
    assert {p.name for p in (TEMPLATES / "variants").glob("*.j2")} == {Path(v.unit).name for v in VARIANTS if v.unit}
