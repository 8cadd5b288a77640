"""The spec files a command works on, each once; rendering them with every clash reported; an
error as the CLI prints it (one line) and as a JSON report holds it."""
from __future__ import annotations

from pathlib import Path

import click

from ..errors import AttngenError


def same_file_key(path: Path) -> Path:
    """What tells two spellings of one spec file apart from two files: its resolved path."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):          # a symlink loop: compare as written, made absolute
        return Path.cwd() / path


def spec_files(paths: tuple[str, ...], specs_dir: str) -> list[Path]:
    """The specs to work on, each once, by path: every dtype cell of a file that lists dtypes
    (attngen.core.spec_cells), and with no paths every spec of the folder and of its lab.
    `p.yaml ./p.yaml` (or a symlink to p.yaml) is one spec, not two specs of one name."""
    from ..core.spec_cells import folder_spec_files, spec_paths
    if paths:
        files = spec_paths(paths)
    else:
        d = Path(specs_dir)
        files = spec_paths(folder_spec_files(d))
        if not files:
            raise click.UsageError(f"no spec files given and none found in {d}/ (run inside an attngen project, "
                                   f"pass --root PROJECT or --specs-dir, or name the specs)")
    seen: set[Path] = set()
    unique = []
    for f in files:
        key = same_file_key(f)
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique


def error_line(exc: AttngenError) -> str:
    """An error as the CLI prints it: a spec error names its file; others start with `attngen:`."""
    return f"attngen: {exc}" if not getattr(exc, "file", None) else str(exc)


def error_dict(path: Path, exc: AttngenError) -> dict:
    first, _, detail = str(exc).partition("\n")
    d = {"spec": str(path), "line": getattr(exc, "line", None), "key": getattr(exc, "key", None),
         "message": getattr(exc, "message", first), "error": first}
    if detail:
        d["detail"] = detail
    return d


def render_specs(paths: list[Path], report_error) -> list[tuple[Path, object]]:
    """Render every spec; each one that fails goes to `report_error(path, exc)` and the rest go on.

    Specs whose output files clash (two specs with one `name:`) are reported once per file, naming
    every spec involved, and left out of the result: nothing is written or compared for them.
    """
    from ..errors import SpecError
    from ..render import render_spec_file
    rendered = []
    for path in paths:
        try:
            rendered.append((path, render_spec_file(path)))
        except AttngenError as exc:
            report_error(path, exc)
    owners: dict[str, list[Path]] = {}
    for path, r in rendered:
        for name, _source in r.files:
            owners.setdefault(name, []).append(path)
    clashing: set[Path] = set()
    reported: set[tuple] = set()
    for name, specs in owners.items():
        if len(specs) > 1:
            clashing.update(specs)
            if tuple(specs) in reported:
                continue
            reported.add(tuple(specs))
            spec_name = next(r.plan.spec.name for p, r in rendered if p == specs[0])
            others = ", ".join(str(p) for p in specs[1:])
            report_error(specs[0], SpecError(
                f"{spec_name!r} is also the name of {others} (each would write {name}); nothing is written "
                f"for {'either' if len(specs) == 2 else 'any of them'}", file=str(specs[0]),
                line=line_of_key(specs[0], "name"), key="name", hint="give each spec its own name"))
    return [(p, r) for p, r in rendered if p not in clashing]


def line_of_key(path: Path, key: str) -> int | None:
    """The line of a top-level key in a spec file that has already been read once (a dtype cell's: the
    line in its file)."""
    from ..core.spec_cells import cell_at
    from ..core.specio import line_of, load_yaml
    try:
        cell = cell_at(path)
        line = line_of(load_yaml(cell.text, str(path))[1], (key,))
    except AttngenError:
        return None
    return cell.lines[line - 1] if line else None


def read_existing(path: Path) -> str | None:
    """The text of a file already on disk (undecodable bytes replaced), None if there is none."""
    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    except OSError as exc:
        from ..errors import WriteError
        raise WriteError(f"cannot read {path}: {exc.strerror or exc}") from None

