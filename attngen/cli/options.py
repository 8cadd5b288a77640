"""What the commands share about their options: the project's folders (and --root), output paths
checked before any work, upper bounds of the count options, --arch and --shapes, and this GPU's arch."""
from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import click

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


def folder_option(ctx, param, value):
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


def report_file(ctx, param, value):
    """A file option written at the end of the run (--json, --plot): its folder exists and is writable."""
    from ..errors import WriteError
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


def output_folder(ctx, param, value):
    """A folder option written at the end of the run (--write-best): made on the way if missing, so
    its nearest existing ancestor must be a folder that takes new entries."""
    from ..errors import WriteError
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
MAX_HEAD_DIM = 1024           # a spec's head_dim and head_dim_v: 256 (core.spec_keys), MLA decode's up to 1024
MAX_PAGE_SIZE = 512           # a paged call's page size (core.launch_rules.MAX_PAGE_SIZE; tests/test_decode.py)
MAX_INT32 = 2 ** 31 - 1       # lengths and row counts reach the kernels as int32
MAX_GROUP_ROWS = 1024 * 256   # query heads per KV head (at most 1024) x new tokens (at most 256), as decode cells
# bench --shapes and --varlen: the sizes decode cells take (eval.bench.decode.CELL_MAX) for B, H and S;
# a varlen batch holds at most as many tokens as one sequence may.
MAX_BATCH, MAX_HEADS, MAX_SEQLEN = 65_535, 1024, 1 << 22


def archs_option(ctx, param, values):
    """--arch of compile: each like sm_89, sm_90a or sm_100f (nvcc says which it supports)."""
    from ..compile import ARCH_RE
    for v in values:
        if not ARCH_RE.fullmatch(v):
            raise click.BadParameter(f"{v!r} is not an arch; write it like sm_89 or sm_90a")
    return values


_SHAPE_DIM = re.compile(r"[1-9][0-9]{0,8}")


def shapes_option(ctx, param, value):
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
        too_large = shape_too_large(shape)
        if too_large:
            raise click.BadParameter(f"{part.strip()!r}: {too_large}")
        shapes.append(shape[:4] if len(shape) == 5 and shape[4] == shape[3] else shape)
    return tuple(shapes)


def shape_too_large(shape: tuple[int, ...]) -> str | None:
    """Which of B, H and S is over its bound (D has the specs' own), or None."""
    for what, value, most in (("B", shape[0], MAX_BATCH), ("H", shape[1], MAX_HEADS), ("S", shape[2], MAX_SEQLEN)):
        if value > most:
            return f"{what} must be at most {most} (got {value})"
    return None


def gpu_arch(missing: str) -> str:
    """The arch of this machine's GPU, or a usage error: `missing` (what to pass instead), then why."""
    from ..errors import NoGpuError
    from ..runtime import device_arch, gpu_modules
    try:
        return device_arch(gpu_modules()[0])
    except NoGpuError as exc:
        raise click.UsageError(f"{missing} ({exc})") from None

