"""The wheel's package list holds every package under attngen/ (it is listed, not found, because
templates/, specs/ and generated/ ship inside it as attngen/templates, attngen/specs and
attngen/generated), and the top level is the design card's."""
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
    shipped = {"templates", "specs", "generated"}
    assert listed - found == {f"attngen.{name}" for name in shipped}
    assert config["package-dir"] == {f"attngen.{name}": name for name in shipped}


def test_top_level_is_the_design_card():
    """pyproject.toml, attngen, templates, specs, generated, tests, README.md (and docs, the CI
    folder and the repository's own files)."""
    import shutil
    import subprocess
    if not shutil.which("git") or not (ROOT / ".git").exists():
        pytest.skip("needs the git checkout to list the tracked files")
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    tracked = {f.split("/")[0] for f in files if not f.startswith(".")}
    card = {"pyproject.toml", "attngen", "templates", "specs", "generated", "tests", "README.md"}
    assert card <= tracked
    assert tracked - card <= {"docs"}, tracked - card


def test_a_stale_package_folder_does_not_shadow_the_repository(tmp_path, monkeypatch):
    """An attngen/templates/ left holding only __pycache__ (a checkout from before the move) is not
    taken for an installed copy: the shipped folders are recognised by a file they hold."""
    from attngen import shipped
    package = tmp_path / "attngen"
    (package / "templates" / "__pycache__").mkdir(parents=True)
    (tmp_path / "templates" / "lib").mkdir(parents=True)
    (tmp_path / "templates" / "lib" / "prelude.j2").write_text("")
    monkeypatch.setattr(shipped, "PACKAGE", package)
    assert shipped.shipped("templates") == tmp_path / "templates"
    (package / "templates" / "lib").mkdir()
    (package / "templates" / "lib" / "prelude.j2").write_text("")
    assert shipped.shipped("templates") == package / "templates"
