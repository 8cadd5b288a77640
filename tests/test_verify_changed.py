"""`attngen verify --changed-since REV`: the specs whose rendered sources differ from those committed at REV."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from attngen.cli import main

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="--changed-since reads commits with git")


def _project(tmp_path: Path) -> Path:
    """A project of two specs, built and committed."""
    project = tmp_path / "project"
    (project / "specs").mkdir(parents=True)
    for name in ("phase4.yaml", "phase5_wmma.yaml"):
        shutil.copy(ROOT / "specs" / name, project / "specs" / name)
    result = CliRunner().invoke(main, ["--root", str(project), "build"])
    assert result.exit_code == 0, result.output
    git = ["git", "-C", str(project), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "specs"], check=True)
    return project


def test_only_the_specs_whose_sources_changed(tmp_path):
    from attngen.cli.changed import changed_since
    project = _project(tmp_path)
    specs = sorted((project / "specs").glob("*.yaml"))
    assert changed_since(specs, project, "HEAD") == []
    result = CliRunner().invoke(main, ["--root", str(project), "verify", "--changed-since", "HEAD"])
    assert result.exit_code == 0 and "nothing to run: no spec's sources changed since HEAD" in result.output
    edited = project / "specs" / "phase4.yaml"
    edited.write_text(edited.read_text().replace("description: ", "description: edited ", 1))
    assert changed_since(specs, project, "HEAD") == [edited]
    listed = CliRunner().invoke(main, ["--root", str(project), "verify", "--changed-since", "HEAD", "--list"])
    assert listed.exit_code == 0 and [Path(p).resolve() for p in listed.stdout.split()] == [edited.resolve()], \
        listed.output


def test_a_revision_git_does_not_know_is_named(tmp_path):
    project = _project(tmp_path)
    result = CliRunner().invoke(main, ["--root", str(project), "verify", "--changed-since", "no-such-rev"])
    assert result.exit_code == 2 and "no-such-rev" in result.output and "Traceback" not in result.output
