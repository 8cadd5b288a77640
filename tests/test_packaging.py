"""The wheel's package list holds every package under attngen/ (it is listed, not found, because
specs/ and generated/ ship inside it as attngen/specs and attngen/generated)."""
from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")

ROOT = Path(__file__).resolve().parent.parent


def test_package_list_holds_every_package():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = {".".join(p.relative_to(ROOT).parts[:-1]) for p in (ROOT / "attngen").rglob("__init__.py")}
    assert found <= listed, f"add to pyproject's packages: {sorted(found - listed)}"
    assert listed - found == {"attngen.specs", "attngen.generated"}
    assert config["package-dir"] == {"attngen.specs": "specs", "attngen.generated": "generated"}
