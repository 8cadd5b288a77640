"""`attngen build` writes generated/ from specs/; `attngen check` proves generated/, its manifest and
the dispatch table in sync with specs/ and the templates."""
from __future__ import annotations

import difflib
import json
import sys
from pathlib import Path

import click

from .options import SPECS_DIR_HELP, folder_option, root_option
from .spec_files import error_dict, error_line, line_of_key, read_existing, render_specs, spec_files


@click.command()
@root_option
@click.argument("specs", nargs=-1, type=click.Path(dir_okay=False))
@click.option("--out", "out_dir", default=None, callback=folder_option, type=click.Path(file_okay=False),
              help="directory for the generated .cu files (default: the project's generated/)")
@click.option("--specs-dir", default=None, callback=folder_option, help=SPECS_DIR_HELP)
@click.option("--json", "as_json", is_flag=True,
              help="print a JSON report (files written or unchanged, errors) instead of the text lines")
def build(specs, out_dir, specs_dir, as_json):
    """Render SPECS (default: every spec in the project's specs/) to OUT/<name>.cu.

    Writes only files whose content changed, and says which; each file is written atomically
    (a temporary file renamed into place), and a spec's files (a decode bundle's split and combine)
    all or none, so an interrupted or failed build never leaves half a file or half a bundle. A
    bad spec is reported and the others are still built; two specs with the same name are refused
    (nothing written for either), and so is a spec whose description states what its plan
    contradicts ("64x64 tiles" after block_n: 32), which `attngen check` would reject. Ends with
    a summary line (files written and unchanged, specs refused) unless one spec was named. Exits 2 when any spec was refused, 3 when a
    file cannot be written.
    """
    from .. import fsutil
    errors, files = [], []

    def refuse(path, exc):
        errors.append(error_dict(path, exc))
        click.echo(error_line(exc), err=True)

    paths = spec_files(specs, specs_dir)
    rendered = _without_description_drift(render_specs(paths, refuse), refuse)
    table_specs = _table_specs(specs_dir)
    out = Path(out_dir)
    if rendered:
        fsutil.ensure_dir(out)
    for path, r in rendered:
        changed = []
        for name, source in _generated_files(path, r, table_specs):
            dest = out / name
            if read_existing(dest) == source:
                files.append({"spec": str(path), "file": str(dest), "status": "unchanged"})
                if not as_json:
                    click.echo(f"unchanged {dest}")
            else:
                changed.append((dest, source))
        fsutil.atomic_write_texts(changed)   # a bundle's files all, or none of them
        for dest, _ in changed:
            files.append({"spec": str(path), "file": str(dest), "status": "written",
                          "smem_bytes": r.plan.smem_bytes, "threads": r.plan.threads})
            if not as_json:
                click.echo(f"wrote     {dest}  ({r.plan.smem_bytes} B smem, {r.plan.threads} threads)")
    if rendered:
        _write_manifest(out, {name: source for path, r in rendered
                              for name, source in _generated_files(path, r, table_specs)})
    summary = _build_summary(files, len(paths), len(paths) - len(rendered))
    if as_json:
        click.echo(json.dumps({"ok": not errors, "files": files, "errors": errors, "summary": summary}, indent=2))
    elif not specs or len(paths) > 1:
        click.echo(f"attngen build: {_counted(summary['files'], 'file')}, {summary['written']} written, "
                   f"{summary['unchanged']} unchanged, {summary['refused']} refused "
                   f"({_counted(summary['specs'], 'spec')})")
    if errors:
        sys.exit(2)


def _without_description_drift(rendered: list, refuse) -> list:
    """The rendered specs whose descriptions agree with their plans. Each stale phrase of the others
    goes to `refuse`, and nothing is written for that spec: the description is copied into the
    generated header, so writing it would commit a file that `attngen check` rejects."""
    from ..description import description_drift
    from ..errors import SpecError
    kept = []
    for path, r in rendered:
        drift = description_drift(r.plan)
        for problem in drift:
            refuse(path, SpecError(problem, file=str(path), line=line_of_key(path, "description"),
                                   key="description", hint="edit the description to match (it is copied into "
                                                           "the generated header)"))
        if not drift:
            kept.append((path, r))
    return kept


def _takes_launch_records(specs_dir) -> bool:
    """Launch records are written and checked for the shipped specs folder alone: only its generated/
    is ever read for them. Another folder's (a copy's, a project's) are left alone."""
    from ..shipped import shipped
    return Path(specs_dir).resolve() == shipped("specs").resolve()


def _table_specs(specs_dir) -> frozenset[str]:
    """The specs the dispatch table of `specs_dir` names when it takes launch records; none for another
    folder or without a readable table (check reports a bad one)."""
    from ..errors import AttngenError
    from ..ops.table import load_table, table_path
    path = table_path(specs_dir)
    if not _takes_launch_records(specs_dir) or not path.is_file():
        return frozenset()
    try:
        return frozenset(e.spec for e in load_table(path))
    except AttngenError:
        return frozenset()


def _generated_files(path: Path, r, served: frozenset[str]) -> tuple[tuple[str, str], ...]:
    """(file name, text) of what a spec puts in generated/: its sources, then, for a spec the table
    serves (`served`) whose variants the registries name, its launch record
    (attngen.core.launch_plan), so the dispatcher's first call needs no planner."""
    from ..core.launch_plan import has_launch_record, launch_record, record_text
    from ..core.spec_cells import cell_at, in_lab
    from ..shipped import launch_name, served_from
    if r.plan.spec.name not in served or in_lab(path) or not has_launch_record(r.plan):
        return r.files
    cell = cell_at(path)
    record = {**launch_record(r.plan), "served_from": served_from(Path(cell.file), cell.text)}
    return r.files + ((launch_name(r.plan.spec.name), record_text(record)),)


def _counted(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _build_summary(files: list[dict], specs: int, refused: int) -> dict:
    """The counts build ends with: files written or unchanged, and specs seen and refused."""
    written = sum(f["status"] == "written" for f in files)
    return {"files": len(files), "written": written, "unchanged": len(files) - written, "refused": refused,
            "specs": specs}


def _write_manifest(out: Path, built: dict[str, str]) -> None:
    """Record beside the generated files what they were rendered from (attngen.shipped), so a process
    can load a shipped spec's source without rendering it; rewritten only when it changes."""
    from .. import fsutil
    from ..shipped import MANIFEST, manifest_text, updated_manifest
    text = manifest_text(updated_manifest(out, built))
    if read_existing(out / MANIFEST) != text:
        fsutil.atomic_write_text(out / MANIFEST, text)


def _manifest_problem(gen: Path, expected: dict, in_sync: list, records: bool) -> str | None:
    """Why generated/MANIFEST.json does not describe the files in sync (None when it does, or when
    the folder is not the shipped one and has none: only the shipped folder's is ever read).
    records: the folder's launch records are checked (else the manifest's entries for them are
    left alone, as the records are)."""
    from ..shipped import LAUNCH_SUFFIX, MANIFEST, manifest_of, read_manifest, shipped
    m = read_manifest(gen)
    if m is None:
        if not (gen / MANIFEST).exists() and gen.resolve() != shipped("generated").resolve():
            return None
        return "is missing or not a manifest"
    want = manifest_of({Path(f["file"]).name: expected[Path(f["file"]).name][1] for f in in_sync})
    if (m["attngen"], m["inputs"]) != (want["attngen"], want["inputs"]):
        return "records other templates or code than rendering reads now"
    listed = {name for name in m["files"] if records or not name.endswith(LAUNCH_SUFFIX)}
    if any(m["files"].get(name) != sha for name, sha in want["files"].items()) or listed - set(expected):
        return "records other files than generated/ holds"
    return None


@click.command()
@root_option
@click.option("--specs-dir", default=None, callback=folder_option, help=SPECS_DIR_HELP)
@click.option("--generated", "gen_dir", default=None, callback=folder_option,
              help="the generated sources to check (default: the project's generated/)")
@click.option("--json", "as_json", is_flag=True,
              help="print a JSON report (in sync, stale with diff, missing, orphans, errors)")
def check(specs_dir, gen_dir, as_json):
    """Check that generated/ matches what specs/ and the templates produce now.

    Regenerates every spec in memory and compares with the committed files; exits 1 with a
    unified diff when a file is stale or missing, when generated/ holds an orphan (a .cu that
    no spec produces), when a dispatch-table entry names a spec that cannot serve it, or when a
    spec's description states a number its plan contradicts ("2-stage" after stages: 1). Exits 2
    when a spec is bad or two specs produce the same file (every one is reported). Run it in CI
    and before review.
    """
    gen = Path(gen_dir)
    errors = []

    def refuse(path, exc):
        errors.append(error_dict(path, exc))
        click.echo(error_line(exc), err=True)

    paths = spec_files((), specs_dir)
    rendered = render_specs(paths, refuse)
    table_specs = _table_specs(specs_dir)
    expected = {name: (path, source) for path, r in rendered
                for name, source in _generated_files(path, r, table_specs)}
    report = {"in_sync": [], "stale": [], "missing": [], "orphans": []}
    for name, (path, source) in sorted(expected.items()):
        dest = gen / name
        current = read_existing(dest)
        if current is None:
            report["missing"].append({"file": str(dest), "spec": str(path)})
            if not as_json:
                click.echo(f"missing: {dest} (from {path}); run `attngen build`")
        elif current != source:
            diff = "".join(difflib.unified_diff(current.splitlines(True), source.splitlines(True),
                                                fromfile=f"{dest} (committed)", tofile=f"{dest} (from {path})"))
            report["stale"].append({"file": str(dest), "spec": str(path), "diff": diff})
            if not as_json:
                click.echo(f"stale: {dest} differs from what {path} renders now; run `attngen build`")
                sys.stdout.write(diff)
        else:
            report["in_sync"].append({"file": str(dest), "spec": str(path)})
    if not errors:   # with a spec refused, its files are not known: no orphan can be told apart
        from ..shipped import LAUNCH_SUFFIX
        made = ["*.cu", f"*{LAUNCH_SUFFIX}"] if _takes_launch_records(specs_dir) else ["*.cu"]
        for f in sorted(f for pattern in made for f in gen.glob(pattern)) if gen.is_dir() else []:
            if f.name not in expected:
                report["orphans"].append({"file": str(f)})
                if not as_json:
                    click.echo(f"orphan: {f} is produced by no spec in {specs_dir}/; delete it or restore its spec")
    manifest = (_manifest_problem(gen, expected, report["in_sync"], _takes_launch_records(specs_dir))
                if not errors else None)
    report["manifest"] = [{"file": str(gen / "MANIFEST.json"), "problem": manifest}] if manifest else []
    if manifest and not as_json:
        click.echo(f"manifest: {gen / 'MANIFEST.json'} {manifest}; run `attngen build`")
    from ..core.spec_cells import in_lab
    served = {Path(p).stem: r.plan for p, r in rendered if not in_lab(p)}    # a lab spec ships in no wheel
    report["dispatch"] = _check_dispatch(specs_dir, served, as_json, refuse)
    from ..description import description_drift
    report["descriptions"] = [{"spec": str(path), "problem": d}
                              for path, r in rendered for d in description_drift(r.plan)]
    for d in report["descriptions"] if not as_json else ():
        click.echo(f"description: {d['spec']}: {d['problem']}; edit the spec's description (it is copied into the "
                   f"generated header)")
    problems = (len(report["stale"]) + len(report["missing"]) + len(report["orphans"]) + len(report["manifest"])
                + sum(1 for d in report["dispatch"] if d.get("problem")) + len(report["descriptions"]))
    if as_json:
        click.echo(json.dumps({"ok": not problems and not errors, **report, "errors": errors}, indent=2))
    if errors:
        if not as_json and len(errors) + problems > 1:
            click.echo(f"attngen check: {len(errors)} spec error(s), {problems} problem(s)", err=True)
        sys.exit(2)
    if problems:
        if not as_json:
            click.echo(f"attngen check: {problems} problem(s)", err=True)
        sys.exit(1)
    if not as_json:
        click.echo(f"attngen check: {len(expected)} generated file(s) in sync, {len(report['dispatch'])} dispatch "
                   f"entries name specs that serve them")


def _check_dispatch(specs_dir, plans: dict, as_json: bool, refuse) -> list[dict]:
    """Every dispatch-table entry names a spec in specs_dir of the entry's call convention, dtype,
    head_dim and mask (varlen: a spec with varlen functions; decode: its page size). A table that
    cannot be loaded ends the text check with its one line (exit 2); with --json it goes to
    `refuse`, so the report still prints and holds it among its errors (exit 2 all the same)."""
    from ..errors import SpecError
    from ..ops.table import entry_problem, load_table, table_expected, table_path
    path = table_path(specs_dir)
    if not table_expected(specs_dir):   # a folder of specs alone; the served one must have its table
        return []
    try:
        entries = load_table(path)
    except SpecError as exc:
        if not as_json:
            raise
        refuse(path, exc)
        return []
    out = []
    for e in entries:
        plan = plans.get(e.spec)
        problem = None
        if plan is None:
            problem = f"names spec {e.spec}, which is not in {specs_dir}/"
        else:
            problem = entry_problem(e, plan)
        out.append({"entry": f"{e.call} {e.arch} {e.dtype} d{e.head_dim} {e.mask} -> {e.spec}",
                    **({"problem": problem} if problem else {})})
        if problem and not as_json:
            click.echo(f"dispatch: {path}: {e.call} {e.arch} {e.dtype} d{e.head_dim} {e.mask}: {problem}")
    return out

