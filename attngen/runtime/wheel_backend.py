"""attngen's PEP 517 build backend: setuptools', plus the prebuilt cubins a wheel carries.

pyproject.toml names this file as the build backend (module wheel_backend, backend-path
attngen/runtime) and its build_py as setuptools' build_py command; both load the file by itself,
not through attngen.runtime, whose imports need attngen's dependencies. Two things differ from
plain setuptools:

- build_py, once the package is copied, compiles every source the dispatch table serves on
  sm_89 and sm_90 into <build dir>/attngen/prebuilt (attngen/runtime/prebuilt.py reads them), so that a
  served cell loads with no compile on a machine with an empty cache and no nvcc;
- get_requires_for_build_wheel adds attngen's own dependencies when that will happen, since
  rendering the specs needs them and an isolated build environment holds setuptools only.

It prebuilds for a wheel (`pip wheel .`, `python -m build`, `pip install .`) when nvcc is on PATH
and ATTNGEN_PREBUILD is not "0". Never for an editable install, and not where CI=true unless
ATTNGEN_PREBUILD=1: a test run needs no wheel's cubins and keeps its time. Without nvcc the wheel
builds without them and says so in one line; first use then compiles, as it always did.

Imports setuptools only: this module loads before attngen's dependencies are installed.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403  (every other hook is setuptools')
from setuptools.command.build_py import build_py as _build_py
from setuptools.command.sdist import sdist as _sdist

PREBUILD_ENV = "ATTNGEN_PREBUILD"     # "0": never prebuild; "1": prebuild on CI too
# What rendering a spec and compiling it import; a build environment without them cannot prebuild.
PREBUILD_IMPORTS = ("pydantic", "jinja2", "yaml", "tqdm")


def skip_reason(*, editable: bool = False, environ=None, which=None) -> str | None:
    """Why this build leaves the cubins out, or None when it prebuilds them. which: how nvcc is found (default
    shutil.which, looked up at the call, so that a test's patch of it holds)."""
    env = os.environ if environ is None else environ
    which = shutil.which if which is None else which
    asked = env.get(PREBUILD_ENV, "").strip()
    if editable:
        return "an editable install"
    if asked == "0":
        return f"{PREBUILD_ENV}=0"
    if env.get("CI", "").strip().lower() in ("true", "1") and asked != "1":
        return f"CI is set; {PREBUILD_ENV}=1 prebuilds there"
    if which("nvcc") is None:
        return "no nvcc on PATH"
    return None


def missing_imports() -> list[str]:
    """The modules prebuilding needs that this environment lacks."""
    import importlib.util
    return [name for name in PREBUILD_IMPORTS if importlib.util.find_spec(name) is None]


def project_dependencies(root: Path = Path(".")) -> list[str]:
    """attngen's [project] dependencies from pyproject.toml ([] where tomllib is missing, before
    Python 3.11: then the build prebuilds only when they are installed already)."""
    try:
        import tomllib
    except ImportError:
        return []
    with open(root / "pyproject.toml", "rb") as f:
        return list(tomllib.load(f)["project"]["dependencies"])


def get_requires_for_build_wheel(config_settings=None):
    extra = project_dependencies() if skip_reason() is None else []
    return _setuptools.get_requires_for_build_wheel(config_settings) + extra


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def prebuild(build_lib, *, editable: bool = False, environ=None, which=None, say=_say) -> int:
    """Fill <build_lib>/attngen/prebuilt, or leave it out with one line saying why (nothing for an
    editable install, which has no wheel to carry it); how many cubins it holds."""
    target = Path(build_lib) / "attngen" / "prebuilt"
    shutil.rmtree(target, ignore_errors=True)     # an earlier build's, in a build/ folder kept since
    why = skip_reason(editable=editable, environ=environ, which=which)
    if why is None and missing_imports():
        why = f"{', '.join(missing_imports())} missing in the build environment"
    if why is not None:
        if not editable:
            say(f"attngen: the wheel carries no prebuilt cubins ({why}); first use compiles them")
        return 0
    written, failed = _source_prebuilt().build_store(target, say=say)
    for line in failed:
        say(f"attngen: not prebuilt, compiled on first use: {line}")
    say(f"attngen: the wheel carries {written} prebuilt cubins")
    return written


def _source_prebuilt():
    """attngen.runtime.prebuilt of the tree being built (the folder above attngen/runtime/), which
    renders the specs this wheel ships."""
    import importlib
    root = str(Path(__file__).resolve().parents[2])
    if root not in sys.path:
        sys.path.insert(0, root)
    return importlib.import_module("attngen.runtime.prebuilt")


# The folders a wheel ships inside the package (attngen/<folder>) and the files of each, from the
# repository's top level, where a checkout and an editable install use them in place.
SHIPPED = {
    "templates": ("*/*.j2",),                                  # lib/, variants/ and one folder per kind
    "specs": ("*.yaml", "dispatch/*.yaml"),
    "generated": ("*.cu", "*.launch.json", "MANIFEST.json"),   # the manifest lets a first call read a source,
}                                                              # not render it; a launch record, not plan it


def shipped_files(root: Path) -> list[Path]:
    """The shipped files under `root`, relative to it, sorted."""
    return sorted(path.relative_to(root) for folder, patterns in SHIPPED.items()
                  for pattern in patterns for path in (root / folder).glob(pattern) if path.is_file())


def ship(root: Path, build_lib) -> int:
    """Copy the shipped files from `root` into <build_lib>/attngen/, in place of an earlier build's (a
    kept build/ folder would otherwise carry a deleted spec into the wheel); how many."""
    for folder in SHIPPED:
        shutil.rmtree(Path(build_lib) / "attngen" / folder, ignore_errors=True)
    files = shipped_files(root)
    for rel in files:
        target = Path(build_lib) / "attngen" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / rel, target)
    return len(files)


class build_py(_build_py):
    """setuptools' build_py, then the shipped folders (a wheel's; an editable install uses them in
    place) and the prebuilt cubins (see prebuild)."""

    def run(self):
        super().run()
        editable = bool(getattr(self, "editable_mode", False))
        if not editable:
            ship(Path(__file__).resolve().parents[2], self.build_lib)
        prebuild(self.build_lib, editable=editable)


class sdist(_sdist):
    """setuptools' sdist, with the shipped folders, so that a wheel built from the archive has them."""

    def add_defaults(self):
        super().add_defaults()
        self.filelist.extend(str(rel) for rel in shipped_files(Path(__file__).resolve().parents[2]))
