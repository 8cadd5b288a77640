"""The wheel's package list holds every package under attngen/ and nothing else; templates/, specs/ and
generated/ ship inside the wheel as attngen/templates, attngen/specs and attngen/generated, copied by
the build backend's build_py (not mapped: a package-dir mapping makes every editable install print
setuptools' note); and the top level is the design card's."""
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
    assert listed == found, f"not packages under attngen/: {sorted(listed - found)}"
    assert config["package-dir"] == {"": "."}
    assert config["cmdclass"]["build_py"] == config["cmdclass"]["sdist"].replace("sdist", "build_py")


def test_the_backend_ships_the_folders_a_wheel_needs(tmp_path):
    """build_py's copy: every template, spec (the dispatch table too), generated source, launch record
    and the manifest, at the paths attngen.shipped looks for in an installed package."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("wheel_backend", ROOT / "attngen" / "runtime" / "wheel_backend.py")
    backend = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(backend)
    package = tmp_path / "attngen"
    (package / "specs").mkdir(parents=True)
    (package / "specs" / "deleted_since.yaml").write_text("an earlier build's spec\n")   # a kept build/ folder's
    count = backend.ship(ROOT, tmp_path)
    assert not (package / "specs" / "deleted_since.yaml").exists()
    assert count == len(backend.shipped_files(ROOT)) > 0
    assert (package / "specs" / "dispatch" / "table.yaml").read_bytes() == (ROOT / "specs" / "dispatch" / "table.yaml").read_bytes()
    assert (package / "generated" / "MANIFEST.json").is_file() and (package / "templates" / "lib").is_dir()
    for folder in ("templates", "generated"):
        want = {p.relative_to(ROOT / folder) for p in (ROOT / folder).rglob("*")
                if p.is_file() and p.suffix in (".j2", ".cu", ".json")}
        assert {p.relative_to(package / folder) for p in (package / folder).rglob("*") if p.is_file()} == want
    want_specs = {p.relative_to(ROOT / "specs") for p in (ROOT / "specs").glob("*.yaml")}
    want_specs |= {p.relative_to(ROOT / "specs") for p in (ROOT / "specs" / "dispatch").glob("*.yaml")}
    assert {p.relative_to(package / "specs") for p in (package / "specs").rglob("*") if p.is_file()} == want_specs


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
