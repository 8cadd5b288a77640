"""attngen command line: a thin click layer over spec -> plan -> render -> compile -> verify/bench.

Exit codes: 0 success; 1 a check failed (stale generated/, verification failure, spills);
2 bad input (spec error, over budget, bad option); 3 a tool failed or is missing (nvcc), or a
file could not be written;
4 no CUDA GPU / torch / CUDA driver on this machine.
"""
from __future__ import annotations

import difflib
import errno
import json
import os
import re
import sys
from pathlib import Path

import click

from . import __version__
from .errors import AttngenError
from .ops.table import CALLS as DISPATCH_CALLS

EXIT_CODES = """\b
Exit codes:
  0  success
  1  a check failed: generated/ stale, verification failed, register spills
  2  bad input: spec error, shared memory over budget, bad option
  3  a tool failed or is missing (nvcc), or a file could not be written
  4  no CUDA GPU, torch or CUDA driver on this machine"""


def fail(exc: AttngenError) -> None:
    click.echo(f"attngen: {exc}" if not getattr(exc, "file", None) else str(exc), err=True)
    sys.exit(exc.exit_code)


class Group(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except AttngenError as exc:
            fail(exc)


@click.group(cls=Group, epilog=EXIT_CODES, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="attngen")
@click.option("--root", type=click.Path(file_okay=False, exists=True), default=None,
              help="the attngen project whose specs/ and generated/ the commands use by default (default: the "
                   "nearest folder at or above the working directory whose pyproject.toml declares attngen)")
@click.pass_context
def main(ctx, root):
    """attngen: generate specialized FlashAttention-style CUDA kernels from YAML specs.

    \b
    A spec (specs/*.yaml) states tile sizes, warp roles, tensor-core fragment,
    shared-memory swizzle and pipeline depth. attngen plans every derived number
    (shared-memory layout, threads, fragments, budget), renders CUDA source into
    generated/, compiles it with nvcc and verifies it on the GPU against torch.

    \b
    Typical use:
      attngen explain specs/phase4.yaml     # the plan: layout, budget, bank conflicts
      attngen build specs/phase4.yaml       # write generated/phase4.cu
      attngen compile specs/phase4.yaml     # nvcc + ptxas register/spill report
      attngen check                         # is generated/ in sync with specs/?
      attngen verify                        # GPU: every spec against an fp32 reference

    \b
    Run from anywhere inside the project: specs/ and generated/ are the project's (the folder
    whose pyproject.toml declares attngen), not the working directory's, unless given.
    """
    ctx.obj = {"root": Path(root) if root else None}


PROJECT_NAME = re.compile(r'^\s*name\s*=\s*["\']attngen["\']\s*$', re.M)


def project_root(start: Path) -> Path | None:
    """The nearest folder at or above `start` whose pyproject.toml declares the attngen project."""
    for d in (start, *start.parents):
        try:
            text = (d / "pyproject.toml").read_text()
        except (OSError, UnicodeDecodeError):
            continue
        if PROJECT_NAME.search(text):
            return d
    return None


def _project_dir(name: str) -> str:
    """The project's <name>/ (relative to the working directory when it is inside the project, so
    messages read as before), else ./<name>."""
    ctx = click.get_current_context(silent=True)
    root = (ctx.find_root().obj or {}).get("root") if ctx else None
    root = root or project_root(Path.cwd().resolve())
    if root is None:
        return name
    return os.path.relpath(Path(root) / name)


SPECS_DIR_HELP = "where to find specs when none are given (default: the project's specs/)"


PROJECT_FOLDERS = {"specs_dir": "specs", "out_dir": "generated", "gen_dir": "generated"}   # option -> its default


def _folder_option(ctx, param, value):
    """A folder option: refused empty; unset, the project's folder (PROJECT_FOLDERS)."""
    if value == "":
        raise click.BadParameter("is empty; name a folder (or leave the option out for the project's)")
    return _project_dir(PROJECT_FOLDERS[param.name]) if value is None else value


ROOT_HELP = ("the attngen project whose specs/ and generated/ this command uses by default; the same as "
             "`attngen --root PROJECT COMMAND`")


def _subcommand_root(ctx, param, value):
    """--root after the command's name (`attngen check --root PROJECT`, as the README writes it):
    recorded where the group's --root goes, before the folder options read it (is_eager)."""
    if value is not None:
        top = ctx.find_root()
        top.obj = {**(top.obj or {}), "root": Path(value)}
    return value


def root_option(command):
    """The group's --root, also taken after the name of a command whose folders default to the project's."""
    return click.option("--root", type=click.Path(file_okay=False, exists=True), default=None, is_eager=True,
                        expose_value=False, callback=_subcommand_root, help=ROOT_HELP)(command)


# -- output paths, checked while the options are read -------------------------------------------------
# A report or a spec written at the end of a GPU run: a path that cannot take it is refused before
# any GPU check or measurement, with the line (and exit 3) the write itself would give.

def _unwritable_folder(folder: Path) -> str | None:
    """Why files cannot be created in an existing folder, or None."""
    if os.access(folder, os.W_OK | os.X_OK):
        return None
    try:
        read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        read_only = False
    return os.strerror(errno.EROFS if read_only else errno.EACCES)


def _report_file(ctx, param, value):
    """A file option written at the end of the run (--json, --plot): its folder exists and is writable."""
    from .errors import WriteError
    if value is None:
        return None
    path = Path(value)
    folder = path.parent
    if path.is_dir():
        why = os.strerror(errno.EISDIR)
    elif not folder.exists():
        why = os.strerror(errno.ENOTDIR if any(p.is_file() for p in folder.parents) else errno.ENOENT)
    elif not folder.is_dir():
        why = os.strerror(errno.ENOTDIR)
    else:
        why = _unwritable_folder(folder)
    if why:
        raise WriteError(f"cannot write {value}: {why}")
    return value


def _output_folder(ctx, param, value):
    """A folder option written at the end of the run (--write-best): made on the way if missing, so
    its nearest existing ancestor must be a folder that takes new entries."""
    from .errors import WriteError
    if value is None:
        return None
    folder = Path(value)
    existing = next((p for p in (folder, *folder.parents) if p.exists() or p.is_symlink()), Path("."))
    if not existing.is_dir():
        what = "a file of that name is in the way" if existing == folder else os.strerror(errno.ENOTDIR)
        raise WriteError(f"cannot create directory {value}: {what}")
    why = _unwritable_folder(existing)
    if why:
        raise WriteError(f"cannot {'write into' if existing == folder else 'create directory'} {value}: {why}")
    return value


# -- upper bounds of the count options -------------------------------------------------------------
# Past these a run takes hours or asks the GPU for more than it holds; a slipped digit
# (--reps 300000) is refused at once instead. Each option's --help shows its range.
MAX_REPS = 10_000             # timed calls per measurement: 30 is the default, 1000 already settles a median
MAX_SEED = 2 ** 32 - 1        # 32-bit seeds, well inside what Python's and torch's generators take
MAX_GENERATIONS = 100         # evolve: each generation compiles and times up to 2 x top-k candidates
MAX_TOP_K = 64
MAX_BUDGET = 100_000          # compiles; the largest search space of a committed spec has 12960 points
MAX_JOBS = 256                # parallel nvcc processes
# compile.default_jobs, named here so that --help does not import the compiler
JOBS_HELP = "nvcc processes at once [default: $ATTNGEN_JOBS, else the CPUs this process may use, at most 32]"
MAX_HEAD_DIM = 256            # a spec's head_dim and head_dim_v (core.spec_keys)
MAX_PAGE_SIZE = 256           # a decode spec's page_size
MAX_INT32 = 2 ** 31 - 1       # lengths and row counts reach the kernels as int32
MAX_GROUP_ROWS = 1024 * 256   # query heads per KV head (at most 1024) x new tokens (at most 256), as decode cells
# bench --shapes and --varlen: the sizes decode cells take (eval.decode_bench.CELL_MAX) for B, H and S;
# a varlen batch holds at most as many tokens as one sequence may.
MAX_BATCH, MAX_HEADS, MAX_SEQLEN = 65_535, 1024, 1 << 22


def _same_file_key(path: Path) -> Path:
    """What tells two spellings of one spec file apart from two files: its resolved path."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):          # a symlink loop: compare as written, made absolute
        return Path.cwd() / path


def _spec_files(paths: tuple[str, ...], specs_dir: str) -> list[Path]:
    """The specs to work on, each once, by path: every dtype cell of a file that lists dtypes
    (attngen.core.spec_cells), and with no paths every spec of the folder and of its lab.
    `p.yaml ./p.yaml` (or a symlink to p.yaml) is one spec, not two specs of one name."""
    from .core.spec_cells import folder_spec_files, spec_paths
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
        key = _same_file_key(f)
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique


def _error_line(exc: AttngenError) -> str:
    """An error as the CLI prints it: a spec error names its file; others start with `attngen:`."""
    return f"attngen: {exc}" if not getattr(exc, "file", None) else str(exc)


def _error_dict(path: Path, exc: AttngenError) -> dict:
    first, _, detail = str(exc).partition("\n")
    d = {"spec": str(path), "line": getattr(exc, "line", None), "key": getattr(exc, "key", None),
         "message": getattr(exc, "message", first), "error": first}
    if detail:
        d["detail"] = detail
    return d


def _render_specs(paths: list[Path], report_error) -> list[tuple[Path, object]]:
    """Render every spec; each one that fails goes to `report_error(path, exc)` and the rest go on.

    Specs whose output files clash (two specs with one `name:`) are reported once per file, naming
    every spec involved, and left out of the result: nothing is written or compared for them.
    """
    from .errors import SpecError
    from .render import render_spec_file
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
                line=_line_of_key(specs[0], "name"), key="name", hint="give each spec its own name"))
    return [(p, r) for p, r in rendered if p not in clashing]


def _line_of_key(path: Path, key: str) -> int | None:
    """The line of a top-level key in a spec file that has already been read once (a dtype cell's: the
    line in its file)."""
    from .core.spec_cells import cell_at
    from .core.specio import line_of, load_yaml
    try:
        cell = cell_at(path)
        line = line_of(load_yaml(cell.text, str(path))[1], (key,))
    except AttngenError:
        return None
    return cell.lines[line - 1] if line else None


def _read_existing(path: Path) -> str | None:
    """The text of a file already on disk (undecodable bytes replaced), None if there is none."""
    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    except OSError as exc:
        from .errors import WriteError
        raise WriteError(f"cannot read {path}: {exc.strerror or exc}") from None


@main.command()
@root_option
@click.argument("specs", nargs=-1, type=click.Path(dir_okay=False))
@click.option("--out", "out_dir", default=None, callback=_folder_option, type=click.Path(file_okay=False),
              help="directory for the generated .cu files (default: the project's generated/)")
@click.option("--specs-dir", default=None, callback=_folder_option, help=SPECS_DIR_HELP)
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
    from . import fsutil
    errors, files = [], []

    def refuse(path, exc):
        errors.append(_error_dict(path, exc))
        click.echo(_error_line(exc), err=True)

    paths = _spec_files(specs, specs_dir)
    rendered = _without_description_drift(_render_specs(paths, refuse), refuse)
    table_specs = _table_specs(specs_dir)
    out = Path(out_dir)
    if rendered:
        fsutil.ensure_dir(out)
    for path, r in rendered:
        changed = []
        for name, source in _generated_files(path, r, table_specs):
            dest = out / name
            if _read_existing(dest) == source:
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
    from .description import description_drift
    from .errors import SpecError
    kept = []
    for path, r in rendered:
        drift = description_drift(r.plan)
        for problem in drift:
            refuse(path, SpecError(problem, file=str(path), line=_line_of_key(path, "description"),
                                   key="description", hint="edit the description to match (it is copied into "
                                                           "the generated header)"))
        if not drift:
            kept.append((path, r))
    return kept


def _takes_launch_records(specs_dir) -> bool:
    """Launch records are written and checked for the shipped specs folder alone: only its generated/
    is ever read for them. Another folder's (a copy's, a project's) are left alone."""
    from .shipped import shipped
    return Path(specs_dir).resolve() == shipped("specs").resolve()


def _table_specs(specs_dir) -> frozenset[str]:
    """The specs the dispatch table of `specs_dir` names when it takes launch records; none for another
    folder or without a readable table (check reports a bad one)."""
    from .ops.table import load_table, table_path
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
    from .core.launch_plan import has_launch_record, launch_record, record_text
    from .core.spec_cells import cell_at, in_lab
    from .shipped import launch_name, served_from
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
    from . import fsutil
    from .shipped import MANIFEST, manifest_text, updated_manifest
    text = manifest_text(updated_manifest(out, built))
    if _read_existing(out / MANIFEST) != text:
        fsutil.atomic_write_text(out / MANIFEST, text)


def _manifest_problem(gen: Path, expected: dict, in_sync: list, records: bool) -> str | None:
    """Why generated/MANIFEST.json does not describe the files in sync (None when it does, or when
    the folder is not the shipped one and has none: only the shipped folder's is ever read).
    records: the folder's launch records are checked (else the manifest's entries for them are
    left alone, as the records are)."""
    from .shipped import LAUNCH_SUFFIX, MANIFEST, manifest_of, read_manifest, shipped
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


@main.command()
@root_option
@click.option("--specs-dir", default=None, callback=_folder_option, help=SPECS_DIR_HELP)
@click.option("--generated", "gen_dir", default=None, callback=_folder_option,
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
        errors.append(_error_dict(path, exc))
        click.echo(_error_line(exc), err=True)

    paths = _spec_files((), specs_dir)
    rendered = _render_specs(paths, refuse)
    table_specs = _table_specs(specs_dir)
    expected = {name: (path, source) for path, r in rendered
                for name, source in _generated_files(path, r, table_specs)}
    report = {"in_sync": [], "stale": [], "missing": [], "orphans": []}
    for name, (path, source) in sorted(expected.items()):
        dest = gen / name
        current = _read_existing(dest)
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
        from .shipped import LAUNCH_SUFFIX
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
    from .core.spec_cells import in_lab
    served = {Path(p).stem: r.plan for p, r in rendered if not in_lab(p)}    # a lab spec ships in no wheel
    report["dispatch"] = _check_dispatch(specs_dir, served, as_json, refuse)
    from .description import description_drift
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
    from .errors import SpecError
    from .ops.table import entry_problem, load_table, table_expected, table_path
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


@main.command()
@click.option("--call", type=click.Choice(DISPATCH_CALLS), default=DISPATCH_CALLS[0], show_default=True)
@click.option("--arch", default="sm_90", show_default=True, help="the GPU's arch (H100/H200: sm_90, L4: sm_89)")
@click.option("--dtype", type=click.Choice(["fp16", "bf16", "e4m3"]), default=None,
              help="the inputs' element type  [default: fp16; e4m3 for --call forward_fp8]")
@click.option("--head-dim", type=click.IntRange(1, MAX_HEAD_DIM), default=128, show_default=True)
@click.option("--causal", is_flag=True)
@click.option("--seqlen", type=click.IntRange(0, MAX_INT32), default=2048, show_default=True,
              help="seqlen_k (varlen: max_seqlen_k; decode: the cache's capacity)")
@click.option("--head-dim-v", type=click.IntRange(0, MAX_HEAD_DIM), default=0,
              help="V's head dim where it differs from --head-dim (DeepSeek MLA: --head-dim 192 --head-dim-v 128)")
@click.option("--window", is_flag=True, help="a sliding-window call (window=(left, right) bounding a side)")
@click.option("--scores", default="", metavar="MODS",
              help="the call's score modifiers joined by +, as the table keys them: softcap, alibi, softcap+alibi")
@click.option("--page-size", type=click.IntRange(0, MAX_PAGE_SIZE), default=0, show_default=True,
              help="decode: 0 contiguous")
@click.option("--group-rows", type=click.IntRange(1, MAX_GROUP_ROWS), default=1, show_default=True,
              help="decode: query rows per KV head (heads / kv_heads x new tokens)")
@click.option("--rows", type=click.IntRange(1, MAX_INT32), default=None,
              help="the call's query rows, batch x heads x seqlen_q, where a bucket's winner depends on the "
                   "grid's size (entries with min_rows)  [default: the entry for any size]")
@click.option("--from", "--from-bench", "bench_files", multiple=True, type=click.Path(dir_okay=False, exists=True),
              help="with --write: `attngen bench --json` or `attngen sweep --json` reports whose winners replace "
                   "the table's forward entries of their keys (backward entries from a bench of backward specs; "
                   "repeatable)")
@click.option("--write", is_flag=True, help="write the table from --from reports")
@click.option("--json", "as_json", is_flag=True, help="print the choice (or the written entries) as JSON")
@click.option("--specs-dir", default=None, help="the specs whose dispatch/table.yaml to read [default: the "
                                                  "ones attngen.attention serves: specs/ of this checkout, or "
                                                  "those installed with attngen]")
def dispatch(call, arch, dtype, head_dim, head_dim_v, causal, seqlen, window, scores, page_size, group_rows, rows,
             bench_files, write, as_json, specs_dir):
    """Show which spec attngen.attention (or attention_varlen, attention_with_kvcache) picks for a
    call, and why; or, with --from REPORT ... --write, rewrite the table from measurements.

    \b
    The table is specs/dispatch/table.yaml: per GPU arch, call, dtype, head dim and mask, the
    measured winner per sequence-length bucket with its runner-up. No GPU needed.
      attngen dispatch --head-dim 64 --causal --seqlen 4096
      attngen dispatch --head-dim 64 --seqlen 1024 --rows 262144      (batch 16 x 16 heads x 1024)
      attngen dispatch --call decode --group-rows 4 --page-size 16 --seqlen 8192
      attngen dispatch --head-dim 128 --window --seqlen 32768      (window=(4096, 0) and the like)
      attngen dispatch --head-dim 128 --causal --scores softcap --seqlen 8192
      attngen bench --json grid.json ... && attngen dispatch --from grid.json --write
      attngen bench --json bwd.json specs/h100_bwd_d64_wgmma.yaml && attngen dispatch --from bwd.json --write
      attngen sweep SPEC --shapes ... --json s.json --write-best specs && attngen dispatch --from s.json --write
      attngen dispatch --call forward_fp8 --arch sm_89 --head-dim 128 --causal   (attngen.attention_fp8)
    """
    from . import fsutil
    from .ops.dispatch import CALL_DTYPES, SPECS_DIR
    from .ops.table import call_text, candidates, dump_table, load_table, select, table_path
    dtype = dtype or CALL_DTYPES.get(call, ("fp16",))[0]
    path = table_path(specs_dir or SPECS_DIR)
    entries = load_table(path)
    if write or bench_files:
        if not (write and bench_files):
            raise click.UsageError("--write and --from go together: the reports to write the table from")
        from .eval.dispatch_table import bench_entries, entries_summary, merge, read_reports
        try:
            new = bench_entries(read_reports(bench_files))
        except (KeyError, ValueError, TypeError, json.JSONDecodeError) as exc:
            raise click.BadParameter(f"not an `attngen bench --json` or `attngen sweep --json` report: {exc}",
                                     param_hint="--from")
        from .core.spec_cells import names_spec
        where = Path(specs_dir or SPECS_DIR)
        missing = sorted({n for e in new for n in (e.spec, e.runner_up) if n and not names_spec(where, n)})
        if missing:
            raise click.UsageError(f"the reports name specs that are not in {where}/: {', '.join(missing)}; commit "
                                   f"them first (`attngen sweep ... --write-best {where}` writes a sweep's winners)")
        header = "".join(line[2:] + "\n" if line.startswith("# ") else "\n"
                         for line in path.read_text().splitlines() if line.startswith("#"))
        fsutil.atomic_write_text(path, dump_table(merge(entries, new), header.rstrip("\n")))
        click.echo(json.dumps([e.__dict__ for e in new], indent=2) if as_json else
                   f"wrote {path}: {entries_summary(new)} from {len(bench_files)} report(s)")
        return
    mask = "window" if window else "causal" if causal else "none"
    head_dim_v = 0 if head_dim_v == head_dim else head_dim_v
    try:
        e = select(entries, call, arch, dtype, head_dim, mask, seqlen, page_size=page_size, group_rows=group_rows,
                   head_dim_v=head_dim_v, scores=scores, rows=rows)
    except LookupError as exc:
        raise click.UsageError(str(exc)) from None
    others = candidates(entries, call, arch, dtype, head_dim, mask, page_size, head_dim_v, scores)
    if as_json:
        click.echo(json.dumps({"spec": e.spec, "entry": e.__dict__, "bucket": [o.__dict__ for o in others]}, indent=2))
        return
    click.echo(f"{call_text(call, arch, dtype, head_dim, mask, seqlen, page_size, group_rows, head_dim_v, scores)}"
               f"{f' rows {rows}' if rows else ''} -> {e.spec}")
    click.echo(f"  why: {e.why}")
    click.echo(f"  buckets of this key ({path}):")
    for o in others:
        limit = f"<= {o.upto}" if o.upto is not None else "longer"
        group = f", group rows <= {o.max_group_rows}" if o.max_group_rows else ""
        grid = f", rows >= {o.min_rows}" if o.min_rows else ""
        click.echo(f"    seqlen {limit:<8}{group}{grid}: {o.why}{'   <- chosen' if o is e else ''}")


def _known_arch(ctx, param, value):
    """--arch of explain: the arch of one of the targets (sm_90a for sm_90 too)."""
    if value is None:
        return None
    from .targets import TARGETS
    known = sorted({t.arch for t in TARGETS.values()}, key=lambda a: int(a[3:]))
    base = value[:-1] if value.endswith("a") else value
    if base not in known or (base != value and int(base[3:]) < 90):
        raise click.BadParameter(f"{value!r} is not the arch of any target; known: {', '.join(known)}, sm_90a")
    return value


@main.command()
@click.argument("spec", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="print the plan as JSON")
@click.option("--arch", default=None, callback=_known_arch,
              help="also compile for the spec target's arch (e.g. sm_89 for l4) to add the register limit")
def explain(spec, as_json, arch):
    """Print the plan of SPEC: shared-memory layout, budget, threads, fragments, bank conflicts.

    Nothing is compiled unless --arch is given; with --arch, ptxas registers refine the
    resident-blocks estimate. The estimate is for the spec's target, so --arch must be that
    target's arch: registers of another arch say nothing about it (`attngen compile --arch`
    reports them).
    """
    from .explain import explain as describe, plan_dict
    from .render import render_spec_file
    r = render_spec_file(spec)
    regs = None
    if arch:
        target = r.plan.target
        if arch.rstrip("a") != target.arch:
            # Point at `compile --arch` only where that compile can run: a kernel with arch-specific
            # instructions (wgmma: sm_90a) compiles for its own arch alone.
            other = (f" (or `attngen compile --arch {arch}` for the registers on {arch})" if not r.plan.arch_suffix
                     else f"; its {target.arch}{r.plan.arch_suffix} instructions do not exist on {arch}")
            raise click.BadParameter(
                f"{arch} is not the arch of the spec's target {target.name} ({target.arch}); the resident-blocks "
                f"estimate is for {target.name}, so use --arch {target.arch}{other}", param_hint="'--arch'")
        from .compile import compile_source
        from .errors import ToolError
        functions = [f for _name, source in r.files for f in compile_source(source, r.plan.compile_arch(arch)).functions]
        if not functions:
            raise ToolError(f"ptxas reported no kernel function for {spec} on {arch}; "
                            f"see `attngen compile {spec} --arch {arch}`")
        regs = max(f.registers for f in functions)
    if as_json:
        d = plan_dict(r.plan)
        if regs:
            d["registers"] = regs
            d["registers_arch"] = arch
            d["blocks_per_sm_by_registers"] = r.plan.occupancy.by_registers(regs)
        click.echo(json.dumps(d, indent=2))
    else:
        click.echo(describe(r.plan, regs))


def _archs(ctx, param, values):
    """--arch of compile: each like sm_89, sm_90a or sm_100f (nvcc says which it supports)."""
    from .compile import ARCH_RE
    for v in values:
        if not ARCH_RE.fullmatch(v):
            raise click.BadParameter(f"{v!r} is not an arch; write it like sm_89 or sm_90a")
    return values


@main.command(name="compile")
@root_option
@click.argument("specs", nargs=-1, type=click.Path(dir_okay=False))
@click.option("--arch", "archs", multiple=True, callback=_archs,
              help="target arch, repeatable (default: the spec target's)")
@click.option("--allow-spills", is_flag=True, help="do not fail when ptxas reports register spills")
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False), help="also write <name>.<arch>.cubin here")
@click.option("--json", "as_json", is_flag=True, help="print the ptxas report as JSON")
@click.option("--specs-dir", default=None, callback=_folder_option, help=SPECS_DIR_HELP)
def compile_cmd(specs, archs, allow_spills, out_dir, as_json, specs_dir):
    """Compile SPECS (default: every spec) with nvcc and report ptxas resources.

    Prints registers, spill stores/loads, stack and static shared memory per kernel function,
    and checks that ptxas's shared memory equals the planner's. A kernel whose plan uses dynamic
    shared memory (over 48 KiB, opt-in) declares none statically: ptxas reports 0 and the plan
    column says `dyn`. Exits 1 on spills (unless --allow-spills), on a shared-memory mismatch, or
    on a ptxas warning that setmaxnreg was ignored or a wgmma serialized (C7508, C7510-C7520);
    3 when nvcc is missing or fails.
    """
    from . import fsutil
    from .compile import compile_source
    from .render import render_spec_file
    report, bad = [], 0
    for path in _spec_files(specs, specs_dir):
        r = render_spec_file(path)
        for asked in archs or (r.plan.target.arch,):
            try:
                arch = r.plan.compile_arch(asked)   # sm_90 -> sm_90a for a kind that needs it
            except ValueError as e:
                raise click.UsageError(f"{path}: {e}")
            for part, (name, source) in zip(r.plan.parts, r.files):
                res = compile_source(source, arch, on_compile=lambda a, n=name: click.echo(
                    f"compiling {n} for {a} ...", err=True))
                want_static = (part.static_smem if part.static_smem is not None else
                               0 if r.plan.smem_dynamic else r.plan.smem_bytes)
                for warning in res.wgmma_warnings:
                    click.echo(f"{name} ({arch}): {warning}", err=True)
                    bad += 1
                for f in res.functions:
                    ok_smem = f.smem_bytes == want_static
                    spill = f.spills and not allow_spills
                    bad += spill or not ok_smem
                    report.append({"spec": str(path), "arch": arch, **f.as_dict(),
                                   "plan_smem_bytes": r.plan.smem_bytes if part.static_smem is None else want_static,
                                   "plan_smem_dynamic": r.plan.smem_dynamic and part.static_smem is None,
                                   "smem_matches_plan": ok_smem})
                if out_dir:
                    fsutil.ensure_dir(out_dir)
                    fsutil.atomic_write_bytes(Path(out_dir) / f"{Path(name).stem}.{arch}.cubin", res.cubin)
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(format_compile(report))
    if bad:
        sys.exit(1)


def format_compile(report: list[dict]) -> str:
    """The compile table; columns widen to the longest function name and arch."""
    nw = max([len("function")] + [len(e["name"]) for e in report])
    aw = max([len("arch")] + [len(e["arch"]) for e in report])
    lines = [f"{'function':<{nw}}  {'arch':<{aw}} {'regs':>4} {'spill st/ld':>11} {'stack':>5} "
             f"{'smem':>7} {'plan':>7}"]
    for e in report:
        plan = f"{e['plan_smem_bytes']:>7}" + (" dyn" if e.get("plan_smem_dynamic") else "")
        note = "" if e["smem_matches_plan"] else "  <- ptxas smem differs from the plan"
        if e["spill_stores"] or e["spill_loads"]:
            note += "  <- spills"
        lines.append(f"{e['name']:<{nw}}  {e['arch']:<{aw}} {e['registers']:>4} "
                     f"{e['spill_stores']:>5}/{e['spill_loads']:<5} {e['stack_bytes']:>5} {e['smem_bytes']:>7} "
                     f"{plan}{note}".rstrip())
    if any(e.get("plan_smem_dynamic") for e in report):
        lines.append("smem: static shared memory per ptxas. dyn: the plan's shared memory is dynamic (sized at "
                     "launch), so ptxas reports 0 static bytes for it")
    return "\n".join(lines)


@main.command()
@click.argument("specs", nargs=-1, type=click.Path(dir_okay=False))
@click.option("--arch", "archs", multiple=True, callback=_archs,
              help="the GPU's arch, repeatable: sm_90 (or sm_90a) for H100/H200, sm_89 for L4  [default: this "
                   "machine's GPU]")
@click.option("--jobs", type=click.IntRange(1, MAX_JOBS), default=None, help=JOBS_HELP)
@click.option("--specs-dir", default=None,
              help="the specs whose dispatch/table.yaml says what to warm [default: the ones attngen.attention "
                   "serves: specs/ of this checkout, or those installed with attngen]")
@click.option("--progress/--no-progress", default=None,
              help="draw the progress bar on stderr  [default: when stderr is a terminal, or $ATTNGEN_PROGRESS=1]")
@click.option("--json", "as_json", is_flag=True, help="print every compiled part (arch, cached, registers) as JSON")
def warm(specs, archs, jobs, specs_dir, progress, as_json):
    """Fill the cubin cache with what a GPU will load, so first calls compile nothing.

    \b
    With no SPECS: every spec the dispatch table (specs/dispatch/table.yaml) serves on the
    arch, all that attngen.attention, attention_varlen, attention_with_kvcache and
    attention_fp8 may load there. With SPECS: those specs.
      attngen warm                              # for this machine's GPU
      attngen warm --arch sm_90 --arch sm_89    # for H100/H200 and L4 machines, from any machine
      attngen warm specs/phase4.yaml --arch sm_89

    \b
    nvcc is needed, a GPU is not: without one, name the arch. Each spec compiles for the
    target its kernels are loaded as (sm_90a for wgmma kernels on sm_90), every part of every
    spec at once, --jobs at a time, with one progress bar and a summary line. The cache is
    $ATTNGEN_CACHE_DIR (default ~/.cache/attngen); what it holds already is not compiled again.
    Exits 2 when a spec is bad or cannot run on the arch, 3 when nvcc is missing or fails.
    """
    from .compile import bundle_jobs, compile_many, print_summary
    from .runtime import bundle_of
    jobs_list = []
    for arch in archs or (_gpu_arch("no GPU to take the arch from; name it: --arch sm_90 (H100/H200) or "
                                    "--arch sm_89 (L4)"),):
        gpu_arch = arch[:-1] if arch.endswith("a") else arch    # the table and the runtime key on sm_90
        for path in _spec_files(specs, "") if specs else _served_specs(specs_dir, gpu_arch):
            plan, sources, label = bundle_of(str(path))
            try:
                jobs_list += bundle_jobs(plan, sources, gpu_arch, Path(path).stem)
            except ValueError as exc:
                raise click.UsageError(f"{path}: {exc}") from None
    batch = compile_many(jobs_list, workers=jobs, progress=progress)
    if as_json:
        click.echo(json.dumps({"summary": batch.summary(), "parts": [_warmed(j, r) for j, r in
                                                                     zip(batch.jobs, batch.results)]}, indent=2))
    print_summary(batch)
    batch.raise_errors()


def _served_specs(specs_dir, gpu_arch: str) -> list[Path]:
    """The spec files the dispatch table names for `gpu_arch`, each once, in table order."""
    from .ops.dispatch import SPECS_DIR
    from .ops.table import load_table, table_path
    where = Path(specs_dir or SPECS_DIR)
    entries = load_table(table_path(where))
    names = list(dict.fromkeys(e.spec for e in entries if e.arch == gpu_arch))
    if not names:
        served = ", ".join(sorted({e.arch for e in entries})) or "no arch"
        raise click.UsageError(f"the dispatch table serves nothing on {gpu_arch} (it serves {served}); name the "
                               f"specs to warm")
    return [where / f"{name}.yaml" for name in names]


def _warmed(job, result) -> dict:
    """One part of `attngen warm --json`."""
    d = {"part": job.label, "arch": job.arch}
    if isinstance(result, AttngenError):
        return {**d, "error": str(result).partition("\n")[0]}
    return {**d, "cached": result.cached, "registers": max((f.registers for f in result.functions), default=None)}


_SHAPE_DIM = re.compile(r"[1-9][0-9]{0,8}")


def _shapes(ctx, param, value):
    """--shapes of bench: comma-separated BxHxSxD, four positive decimal integers each, or BxHxSxDxDv
    where V's head dim Dv differs from D (MLA: 4x16x2048x192x128)."""
    if value is None:
        return None
    shapes = []
    for part in value.split(","):
        dims = part.strip().lower().split("x")
        if len(dims) not in (4, 5) or not all(_SHAPE_DIM.fullmatch(d) for d in dims):
            raise click.BadParameter(f"{part.strip()!r} is not BxHxSxD: four positive integers, e.g. 4x16x2048x64 "
                                     "(or BxHxSxDxDv where V's head dim differs, e.g. 4x16x2048x192x128)")
        shape = tuple(int(d) for d in dims)
        too_large = _shape_too_large(shape)
        if too_large:
            raise click.BadParameter(f"{part.strip()!r}: {too_large}")
        shapes.append(shape[:4] if len(shape) == 5 and shape[4] == shape[3] else shape)
    return tuple(shapes)


def _shape_too_large(shape: tuple[int, ...]) -> str | None:
    """Which of B, H and S is over its bound (D has the specs' own), or None."""
    for what, value, most in (("B", shape[0], MAX_BATCH), ("H", shape[1], MAX_HEADS), ("S", shape[2], MAX_SEQLEN)):
        if value > most:
            return f"{what} must be at most {most} (got {value})"
    return None


def _sweep_shapes(ctx, param, value):
    """--shapes of sweep: checked as bench's are (the sweep parses them against its base spec), kept as written."""
    _shapes(ctx, param, value)
    return value


def _plot_file(ctx, param, value):
    """--plot of bench: a file whose suffix names an image format matplotlib writes."""
    if value is None:
        return None
    from .eval.bench import plot_format
    try:
        plot_format(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return _report_file(ctx, param, value)


def _cells(ctx, param, value):
    """--cells of bench: comma-separated decode cells."""
    if value is None:
        return None
    from .eval.decode_bench import parse_cell
    try:
        cells = tuple(parse_cell(c) for c in value.split(",") if c.strip())
    except ValueError as e:
        raise click.BadParameter(str(e))
    if not cells:
        raise click.BadParameter("name at least one cell BxHq/HkvxSkxSq (e.g. 8x32/8x8192x1)")
    return cells


def _lengths(ctx, param, value):
    """--lengths of bench --varlen: comma-separated sequence lengths."""
    if value is None:
        return None
    from .eval.varlen_bench import parse_lengths
    try:
        lengths = parse_lengths(value)
    except ValueError as e:
        raise click.BadParameter(str(e))
    if len(lengths) > MAX_BATCH:
        raise click.BadParameter(f"{len(lengths)} sequences; a varlen batch holds at most {MAX_BATCH}")
    if sum(lengths) > MAX_SEQLEN:
        raise click.BadParameter(f"{sum(lengths)} tokens in all; a varlen batch holds at most {MAX_SEQLEN}")
    return lengths


def _heads(ctx, param, value):
    """--heads of bench --varlen: H or Hq/Hkv."""
    from .eval.varlen_bench import parse_heads
    try:
        heads = parse_heads(value)
    except ValueError as e:
        raise click.BadParameter(str(e))
    if heads[0] > MAX_HEADS:
        raise click.BadParameter(f"{value!r}: at most {MAX_HEADS} query heads (got {heads[0]})")
    return heads


def _backends(ctx, param, value):
    """--backends of bench: comma-separated names of torch SDPA backends."""
    from .eval.bench import SDPA_BACKENDS
    names = tuple(b.strip() for b in value.split(",") if b.strip())
    if not names:
        raise click.BadParameter(f"name at least one of {', '.join(SDPA_BACKENDS)}")
    for b in names:
        if b not in SDPA_BACKENDS:
            raise click.BadParameter(f"unknown backend {b!r}; choose from {', '.join(SDPA_BACKENDS)}")
    return names


@main.command()
@root_option
@click.argument("specs", nargs=-1, type=click.Path(dir_okay=False))
@click.option("--shapes", default=None, metavar="BxHxSxD,...", callback=_shapes,
              help="comma-separated shapes; BxHxSxDxDv where V's head dim Dv differs (default: 1x8x512x64, 4x16x2048x64, 4x16x2048x128, 2x16x8192x64, "
                   "2x16x8192x128; backward specs: 4x16x2048 and 1x16x8192 at the spec's head dim). D (and Dv) "
                   f"must be a given spec's; B at most {MAX_BATCH}, H {MAX_HEADS}, S {MAX_SEQLEN}")
@click.option("--dtype", "dtypes", multiple=True, type=click.Choice(["fp16", "bf16"]),
              help="repeatable; default both")
@click.option("--causal", "causal", type=click.Choice(["both", "yes", "no"]), default="both", show_default=True)
@click.option("--backends", default="flash,cudnn,efficient,default", show_default=True, callback=_backends,
              help="torch SDPA backends to time beside the specs")
@click.option("--reps", type=click.IntRange(1, MAX_REPS), default=30, show_default=True,
              help="timed calls per measurement (median reported)")
@click.option("--json", "json_file", type=click.Path(dir_okay=False), callback=_report_file,
              help="write the full report here (specs of several call conventions, e.g. forward and decode: one "
                   "report each, FILE-<convention>.json)")
@click.option("--plot", "plot_file", type=click.Path(dir_okay=False), callback=_plot_file,
              help="draw TFLOP/s per shape to this PNG (or .svg, .pdf); needs matplotlib")
@click.option("--cells", default=None, metavar="BxHq/HkvxSkxSq,...", callback=_cells,
              help="decode specs: cells to time (default: B 1, 8, 64 x Hq/Hkv 32/8, 32/32, 64/8 x Sk 2k, 8k, 32k "
                   "(128k at B 1) x Sq 1, 4)")
@click.option("--paged", is_flag=True, help="decode specs: read the cache through a shuffled page table")
@click.option("--varlen", is_flag=True,
              help="forward specs with varlen: true: time one varlen batch of mixed lengths (kernel.varlen) "
                   "beside torch's varlen flash path instead of the padded shapes")
@click.option("--lengths", default=None, metavar="L1,L2,...", callback=_lengths,
              help="--varlen: sequence lengths of the batch (default: 16 from 1 to 4096: "
                   f"1,17,64,100,256,333,512,700,1000,1024,1500,2048,2500,3000,3500,4096); at most {MAX_BATCH} "
                   f"sequences and {MAX_SEQLEN} tokens in all")
@click.option("--heads", default="16", show_default=True, metavar="H|Hq/Hkv", callback=_heads,
              help=f"--varlen: query heads, or query/key-value heads (at most {MAX_HEADS} query heads)")
@click.option("--specs-dir", default=None, callback=_folder_option, help=SPECS_DIR_HELP)
def bench(specs, shapes, dtypes, causal, backends, reps, json_file, plot_file, cells, paged, varlen, lengths, heads,
          specs_dir):
    """Time SPECS (default: every spec) beside torch SDPA's backends on the GPU.

    \b
    Each spec runs only on the shapes, dtypes and mask variants it supports, and only after
    its output on those very inputs passed the verifier's error rule. GPU times are medians of
    CUDA-event-timed calls queued behind a GPU sleep (the host hidden) over inputs rotated to
    defeat L2; eager times are back-to-back calls as a user makes them, host included (wall
    clock / calls), for the specs and SDPA alike. TFLOP/s counts 4*B*H*S*S*D (halved for
    causal). Ratios are SDPA GPU time / spec GPU time: above 1.0 the spec is faster.

    \b
    Decode specs (decode: split_kv) are timed on decode cells instead (--cells): one step of
    Sq new tokens against a full cache of Sk keys, beside SDPA's flash and cuDNN backends (Sq > 1:
    causal for the spec, SDPA unmasked), with GB/s of K+V read and its percentage of the
    device-to-device copy bandwidth measured in the same run. `attngen verify` checks them.

    \b
    Backward specs (backward: dq_atomic or wgmma_dq_red) are timed on --shapes (default 4x16x2048 and
    1x16x8192 at each spec's head dim), in their own dtype: the call kernel(q, k, v, o, lse,
    dout) given attngen's forward o and lse, after checking dq, dk and dv against fp32
    gradients, beside SDPA's flash and cuDNN backward (torch.autograd.grad of its output).
    TFLOP/s counts 2.5 x the forward's FLOPs (--plot draws them). Not with --varlen, window or
    score modifiers.

    \b
    --varlen times ragged prefill: the specs' varlen call on one batch of mixed
    lengths (--lengths, --heads; causal is bottom-right, the same as top-left when each
    sequence has as many queries as keys) beside torch's varlen flash path, after checking
    the output with the verifier's error rule.
    """
    from . import fsutil
    from .eval.bench import CAUSAL_CHOICES
    from .eval.conventions import EVALS, BenchOptions, by_convention, option_problems
    from .render import render_spec_file
    all_paths = _spec_files(specs, specs_dir)
    rendered = [render_spec_file(p) for p in all_paths]
    groups = by_convention(all_paths, [r.plan for r in rendered])
    opts = BenchOptions(shapes=shapes, dtypes=dtypes or ("fp16", "bf16"), causals=CAUSAL_CHOICES[causal],
                        backends=backends, reps=reps, cells=cells, paged=paged, varlen=varlen, lengths=lengths,
                        heads=heads, plot_file=plot_file)

    ctx = click.get_current_context()
    given = {name for name in ("shapes", "cells", "paged", "varlen", "lengths", "heads", "plot_file")
             if ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE}   # BenchOptions fields

    problems = option_problems(groups, opts, given)
    if "shapes" in given and not varlen:
        problems += _shapes_no_spec_runs(groups, shapes)
    if problems:   # before any GPU check: a wrong option is the user's to fix, whatever the machine
        raise click.UsageError("; ".join(problems))

    def progress(label, length):
        return click.progressbar(length=length, label=label, file=sys.stderr, show_pos=True)

    if plot_file:   # no matplotlib: say so (exit 3) before compiling for a run that cannot plot
        from .eval.bench import pyplot
        pyplot()
    _precompile_on_gpu([(r.plan, tuple(p.source for p in r.parts), r.spec_path) for r in rendered])
    for convention, (paths, plans) in groups.items():
        try:
            run = EVALS[convention].bench(paths, plans, opts, progress,
                                          lambda a: click.echo(f"compiling for {a} ...", err=True))
        except ValueError as e:
            raise click.UsageError(str(e))
        if run is None:   # nothing of this convention runs under these options (e.g. decode specs with --varlen)
            continue
        click.echo(run.text)
        for f in run.written:
            click.echo(f"wrote {f}")
        if json_file:   # one report per convention when the specs span several: FILE-<convention>.json
            out = json_file if len(groups) == 1 else str(Path(json_file).with_name(
                f"{Path(json_file).stem}-{convention}{Path(json_file).suffix}"))
            fsutil.atomic_write_text(out, json.dumps(run.report, indent=2) + "\n")
            click.echo(f"wrote {out}")


def _precompile_on_gpu(bundles) -> None:
    """Compile every (plan, sources, label) a GPU run will load, all at once, before its first load
    (which then finds each cubin cached). Without a GPU, nothing: the run's own check says so (exit 4)."""
    from .compile import precompile, print_summary
    from .errors import NoGpuError
    from .runtime import device_arch, gpu_modules
    try:
        torch = gpu_modules()[0]
    except NoGpuError:
        return
    print_summary(precompile(bundles, device_arch(torch, torch.cuda.current_device())))


def _shapes_no_spec_runs(groups: dict, shapes: tuple) -> list[str]:
    """The --shapes whose head dims (D, and Dv where given) no given spec of a shape-taking convention
    has: each spec runs only on its own head dims, so such a shape would time nothing of attngen's."""
    from .eval.conventions import EVALS
    plans = [p for convention, (_paths, ps) in groups.items() if "shapes" in EVALS[convention].options for p in ps]
    if not plans:   # no spec takes --shapes: option_problems says so
        return []
    dims = {(p.spec.head_dim, p.spec.v_dim) for p in plans}
    unrun = [s for s in shapes if (s[3], s[4] if len(s) == 5 else s[3]) not in dims]
    if not unrun:
        return []
    theirs = ", ".join(f"{d}" if d == dv else f"{d}x{dv}" for d, dv in sorted(dims))
    listed = ", ".join("x".join(map(str, s)) for s in unrun)
    return [f"--shapes {listed}: no given spec has {'that head dim' if len(unrun) == 1 else 'those head dims'} "
            f"(the specs' D or DxDv: {theirs})"]


@main.command()
@click.option("--json", "as_json", is_flag=True, help="print the findings as JSON")
def doctor(as_json):
    """Check what this machine has for compiling and running kernels, before installing the gpu
    extra: nvcc and the toolkit it belongs to (a wrapper nvcc on PATH hides the headers pycuda's
    build needs), the CUDA headers, a C++ compiler, the Python headers, the CUDA driver, torch.
    Prints the install command that fits this machine. Exits 1 when something is missing (a
    machine without a GPU lacks the driver and torch: it compiles, it does not run).
    """
    from .doctor import findings, install_hint
    found = findings()
    if as_json:
        click.echo(json.dumps({"findings": [{**f.__dict__, "label": f.label} for f in found],
                               "install": install_hint()}, indent=2))
    else:
        for f in found:
            click.echo(f"{f.label:<7} {f.what}: {f.detail}  [{f.needed_for}]")
        click.echo(f"\ninstall the gpu extra with:\n  {install_hint()}")
    if not all(f.ok or f.note for f in found):
        sys.exit(1)


@main.command()
def schema():
    """Print the JSON schema of a spec file (every key, type, range and description)."""
    from .spec import json_schema
    click.echo(json.dumps(json_schema(), indent=2))


@main.command()
@root_option
@click.argument("specs", nargs=-1, type=click.Path(dir_okay=False))
@click.option("--quick", is_flag=True, help="a 6-shape suite instead of the full 14 shapes per variant")
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False), callback=_report_file,
              help="also write the full report (every case, errors, tolerances) to this file")
@click.option("--seed", type=click.IntRange(0, MAX_SEED), default=0, show_default=True,
              help="base seed of the random inputs")
@click.option("--failures-only", is_flag=True, help="list only failing cases in the table")
@click.option("--specs-dir", default=None, callback=_folder_option, help=SPECS_DIR_HELP)
def verify(specs, quick, json_path, seed, failures_only, specs_dir):
    """Run SPECS (default: every spec) on this GPU and compare every variant with torch.

    \b
    For each mask variant and each shape of the suite (seqlens that are not tile multiples,
    seqlen_q != seqlen_k both ways, GQA/MQA, both layouts, strided qkv): random inputs, an
    output poisoned with NaN, then
      pass when max|out - ref| <= 2 x max|torch low-precision - ref| + 1e-5
    (ref: fp32 attention on the upcast inputs), no NaN or unwritten element, nothing written
    past seqlen_q, and |lse - ref| <= 1e-3 + 1e-3 |ref|. Specs with varlen: true also run
    varlen cases (mixed lengths in one batch, both causal alignments) and decode specs
    their decode cases, under the same rule. Exits 1 on any failure, 4 when there is no GPU,
    torch or CUDA driver.
    """
    from .eval import verify as verification
    paths = _spec_files(specs, specs_dir)
    kernels = verification.load_kernels(paths, on_compile=lambda p, arch: click.echo(
        f"compiling {Path(p).stem} for {arch} ...", err=True))
    shapes = verification.suite(quick)
    with click.progressbar(length=verification.case_count(kernels, shapes), label="verifying", file=sys.stderr,
                           show_pos=True) as bar:
        report = verification.verify_kernels(kernels, shapes, suite_name="quick" if quick else "full", seed=seed,
                                             on_case=lambda _case: bar.update(1))
    click.echo(format_verify(report, failures_only))
    if json_path:
        write_verify_json(report, json_path)
    failed = len(report.failed)
    counts = report.pycuda_counts()
    click.echo(f"attngen verify: {len(report.cases) - failed} passed, {failed} failed "
               f"({len(kernels)} spec(s), {len(shapes)} shapes per variant); launched again through PyCUDA: "
               f"{counts['bitwise']} bit for bit, {counts['bitwise but atomics']} within the error rule (atomics), "
               f"{counts['differs']} differ, {counts['not run']} not run", err=bool(failed))
    if not report.ok:
        sys.exit(1)


def write_verify_json(report, path) -> None:
    """The full verify report (every case, errors, tolerances) as JSON at `path`, written atomically."""
    from . import fsutil
    fsutil.atomic_write_text(path, json.dumps(report.as_dict(), indent=2) + "\n")


def format_verify(report, failures_only: bool = False) -> str:
    """The verify table, one row per case of any type (each says its shape label and layout); the
    spec, variant, shape and layout columns widen to their longest entry."""
    cases = [c for c in report.cases if not (failures_only and c.passed)]
    sw = max([len("spec")] + [len(c.spec) for c in cases])
    vw = max([len("variant")] + [len(c.variant) for c in cases])
    hw = max([len("shape")] + [len(c.shape.label) for c in cases])
    lw = max([len("layout")] + [len(c.shape.layout) for c in cases])
    lines = [f"{report.device} ({report.arch}), torch {report.torch_version}, {report.suite} suite",
             f"{'spec':<{sw}} {'variant':<{vw}} {'shape':<{hw}} {'layout':<{lw}} {'max err':>9} {'bound':>9} "
             f"{'lse err':>9}  result"]

    def num(x):
        return f"{x:9.2e}" if x is not None else f"{'-':>9}"
    for c in cases:
        lines.append(f"{c.spec:<{sw}} {c.variant:<{vw}} {c.shape.label:<{hw}} {c.shape.layout:<{lw}} {num(c.max_err)} "
                     f"{num(c.bound)} {num(c.lse_err)}  {'pass' if c.passed else 'FAIL: ' + '; '.join(c.problems)}")
    return "\n".join(lines)


@main.command()
@click.argument("base_spec", type=click.Path(dir_okay=False))
@click.option("--shapes", default=None, metavar="BxHxSxD,...", callback=_sweep_shapes,
              help="comma-separated shapes to measure; D must be the base's head_dim, the dtype is the base's "
                   f"(not needed with --compile-only); B at most {MAX_BATCH}, H {MAX_HEADS}, S {MAX_SEQLEN}")
@click.option("--causal", type=click.Choice(["both", "yes", "no"]), default="both", show_default=True)
@click.option("--budget", type=click.IntRange(1, MAX_BUDGET), default=None,
              help="at most N candidates go on to compile (a seeded sample when more survive pruning)")
@click.option("--search", type=click.Choice(["grid", "evolve"]), default="grid", show_default=True,
              help="grid: every surviving candidate; evolve: keep the top-k and mutate them")
@click.option("--seed", type=click.IntRange(0, MAX_SEED), default=0, show_default=True,
              help="seed of the sampling, the evolution and the inputs")
@click.option("--generations", type=click.IntRange(0, MAX_GENERATIONS), default=4, show_default=True,
              help="evolve: generations")
@click.option("--top-k", type=click.IntRange(1, MAX_TOP_K), default=4, show_default=True,
              help="evolve: parents kept per generation (the first population is twice this)")
@click.option("--arch", default=None, help="compile for this arch, e.g. sm_90 (default: the GPU's)")
@click.option("--compile-only", is_flag=True,
              help="stop after compiling: fill the cubin cache (on a CPU machine, with --arch) for a later GPU run")
@click.option("--jobs", type=click.IntRange(1, MAX_JOBS), default=None,
              help=JOBS_HELP)
@click.option("--json", "json_file", type=click.Path(dir_okay=False), callback=_report_file,
              help="write the full report here")
@click.option("--write-best", "best_dir", type=click.Path(file_okay=False), callback=_output_folder,
              help="write each case's winning spec to DIR/<name>.yaml, ready for `attngen build`")
@click.option("--reps", type=click.IntRange(1, MAX_REPS), default=30, show_default=True,
              help="timed calls per measurement (median reported)")
def sweep(base_spec, shapes, causal, budget, search, seed, generations, top_k, arch, compile_only, jobs, json_file,
          best_dir, reps):
    """Search variants of BASE_SPEC for the fastest correct kernel per shape on this GPU.

    \b
    The space is declared by the base spec's kind, around the base's own values. scalar,
    wmma and mma.sync specs: tile.block_m, tile.block_n, warps (and producer/consumer
    splits when the base has warp roles), smem.stages, smem.swizzle (the base's or none)
    and smem.q_in_registers. wgmma specs: tile.block_n, consumer warpgroups with or
    without a producer warpgroup (block_m follows), smem.stages, registers, schedule,
    epilogue, and blocks (one per query block, or persistent with 1 or 2 Q tiles).
    Backward specs: tile.block_m, tile.block_n with the warps that own its keys (16 per warp),
    and for mma.sync query_stages and query_chunk; their backward call is timed (given
    attngen's forward o and lse) beside flash's backward, TFLOP/s counting 2.5x the forward's
    FLOPs, and their gradients are checked. A candidate is dropped before compiling when it
    breaks a spec rule, exceeds the shared-memory budget or renders the same code as another;
    after compiling when nvcc fails or ptxas reports spills; on the GPU when it fails the
    verifier's quick suite or the output check on the sweep's inputs. Survivors are timed
    like `attngen bench`, beside torch's flash backend (vs flash = flash time / time).
    Results are cached per spec, GPU and shape in the sweep/ folder of the cubin cache
    ($ATTNGEN_CACHE_DIR, default ~/.cache/attngen): an interrupted sweep resumes. Exits 1 when a case has no verified
    candidate (or, with --compile-only, when none compiles cleanly).
    """
    import re
    from . import fsutil
    from .eval import sweep as S
    from .kinds import kind_of
    from .spec import load_spec
    base = load_spec(base_spec)
    kind = kind_of(base)
    if kind.space is None:
        raise click.UsageError(f"{base_spec}: sweep searches the variants a kind declares, and {kind.name} specs "
                               f"declare none; write variants as specs and time them with `attngen bench`")
    if arch is not None and not re.fullmatch(r"sm_\d+a?", arch):
        raise click.BadParameter(f"must look like sm_89 or sm_90a (got {arch!r})", param_hint="--arch")
    if not shapes and not compile_only:
        raise click.UsageError("--shapes is required (unless --compile-only)")
    if best_dir and compile_only:
        raise click.UsageError("--write-best needs measurements: drop --compile-only")
    try:
        cases = S.parse_cases(shapes, base, causal) if shapes else []
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--shapes/--causal") from None
    measurer = None
    if compile_only:
        arch = arch or _gpu_arch("--compile-only needs --arch (e.g. --arch sm_90) when there is no GPU to take it "
                                 "from")
    else:
        measurer = S.GpuMeasurer(reps=reps, seed=seed)   # no GPU, torch or CUDA driver: exit 4 before any work
        if arch is not None and arch != measurer.arch:
            raise click.BadParameter(f"{arch} is not this GPU's arch ({measurer.arch}); a measuring sweep compiles "
                                     "for the GPU it runs on", param_hint="--arch")
        arch = measurer.arch
    from .compile import default_jobs
    options = S.SweepOptions(cases, search=search, budget=budget, seed=seed, generations=generations, top_k=top_k,
                             jobs=jobs or default_jobs())
    space = S.default_space(base)
    click.echo(f"sweep: {space.size} candidates in the space of {base.name}; pruning ...", err=True)
    survivors = S.prune(base, space, **S.prune_options(options))
    steps = S.planned_steps(len(survivors[0]), options, measuring=measurer is not None)
    # Off a terminal click prints every new label as a line: there, relabel every 10% only.
    every = 1 if sys.stderr.isatty() else max(1, steps // 10)
    with click.progressbar(length=steps, label="sweep", file=sys.stderr, show_pos=True) as bar:
        def changed(p, n):
            if (bar.pos + n) // every != bar.pos // every:
                bar.label = (f"pruned {p.pruned}, compiled {p.compiled}, failed {p.failed}, timed {p.timed}"
                             + (f", cached {p.cached}" if p.cached else "") + f"; best {p.best_text()}")
            bar.update(n)
        report = S.run_sweep(base, space, options, arch=arch, measurer=measurer, survivors=survivors,
                             progress=S.Progress(on_change=changed))
    click.echo(S.format_report(report))
    command = _sweep_command(base_spec, shapes, causal, budget, search, seed, generations, top_k, reps)
    if json_file:
        fsutil.atomic_write_text(json_file, json.dumps({"command": command, **S.report_dict(report)}, indent=2) + "\n")
        click.echo(f"wrote {json_file}")
    if best_dir:
        for path in S.write_best(report, best_dir, command):
            click.echo(f"wrote {path}")
    counts = report.counts()
    if compile_only and not counts.get(S.COMPILED):
        sys.exit(1)
    if not compile_only and any(not report.ranking(c) for c in cases):
        sys.exit(1)


def _gpu_arch(missing: str) -> str:
    """The arch of this machine's GPU, or a usage error: `missing` (what to pass instead), then why."""
    from .errors import NoGpuError
    from .runtime import device_arch, gpu_modules
    try:
        return device_arch(gpu_modules()[0])
    except NoGpuError as exc:
        raise click.UsageError(f"{missing} ({exc})") from None


def _sweep_command(base_spec, shapes, causal, budget, search, seed, generations, top_k, reps) -> str:
    """The sweep's command line as the written specs and the JSON quote it."""
    parts = ["attngen", "sweep", str(base_spec), "--shapes", shapes or "", "--causal", causal, "--search", search,
             "--seed", str(seed)]
    if budget is not None:
        parts += ["--budget", str(budget)]
    if search == "evolve":
        parts += ["--generations", str(generations), "--top-k", str(top_k)]
    return " ".join(parts + ["--reps", str(reps)])
