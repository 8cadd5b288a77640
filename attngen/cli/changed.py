"""The specs a change touches: those whose rendered files differ from the ones committed at a git
revision. `attngen verify --changed-since REV` runs only these, so a template edit is checked on the
kernels it changed before the whole suite."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import click

from .spec_files import error_line, render_specs

MANIFEST_AT = "generated/MANIFEST.json"


def _git(folder: Path, *args: str) -> str:
    """`git -C folder ARGS`'s output; a UsageError that says what is missing when git cannot answer."""
    try:
        done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise click.UsageError("--changed-since reads the committed sources with git, and git is not on PATH") from None
    if done.returncode != 0:
        raise click.UsageError(f"git {' '.join(args)}: {done.stderr.strip() or 'failed'}")
    return done.stdout


def committed_hashes(project: Path, rev: str) -> dict[str, str]:
    """File name -> sha256 of the generated sources committed at `rev` (its generated/MANIFEST.json)."""
    top = Path(_git(project, "rev-parse", "--show-toplevel").strip())
    where = Path(os.path.relpath(project.resolve() / MANIFEST_AT, top.resolve())).as_posix()
    try:
        files = json.loads(_git(top, "show", f"{rev}:{where}"))["files"]
    except (ValueError, KeyError, TypeError):
        raise click.UsageError(f"{rev}:{where} is not an attngen manifest") from None
    if not isinstance(files, dict):
        raise click.UsageError(f"{rev}:{where} is not an attngen manifest")
    return files


def changed_since(paths: list[Path], project: Path, rev: str) -> list[Path]:
    """The specs of `paths` that render a file other than, or absent from, the one committed at `rev`. A
    spec that does not render is kept: the run reports it."""
    committed = committed_hashes(project, rev)
    rendered = dict(render_specs(paths, lambda path, exc: click.echo(error_line(exc), err=True)))
    return [path for path in paths if path not in rendered or any(
        committed.get(name) != hashlib.sha256(source.encode()).hexdigest() for name, source in rendered[path].files)]
