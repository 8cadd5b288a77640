"""What the repository keeps where: .ci/ holds CI and nothing else, and every data file under docs/
is cited by a markdown file (a page, or its folder's README.md), so no measurement lies unexplained."""
from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# .ci/run is CI; .ci/gpu-run is the GPU-machine session, and sanitize_case.py the program it runs
# under compute-sanitizer. Measurement scripts live beside their data under docs/.
CI_FILES = {"run", "gpu-run", "sanitize_case.py"}
NOT_DATA = (".md", ".py", ".sh")     # pages and the scripts that wrote the data


def repository_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def is_cited(data: Path, markdown: dict[Path, str]) -> bool:
    """A markdown file names the data file by its path from the repository root or from the
    markdown's own folder (a folder's README.md names its files by their names)."""
    for page, text in markdown.items():
        for path in {data.relative_to(ROOT).as_posix(), Path(os.path.relpath(data, page.parent)).as_posix()}:
            if path in text and re.search(r"(?<![\w./-])" + re.escape(path) + r"(?![\w/-])", text):
                return True
    return False


def uncited(data_files: list[Path], markdown: dict[Path, str]) -> list[str]:
    return [d.relative_to(ROOT).as_posix() for d in data_files if not is_cited(d, markdown)]


def test_ci_holds_only_the_ci_files():
    held = {p.relative_to(ROOT / ".ci").as_posix() for p in repository_files(ROOT / ".ci")}
    assert held == CI_FILES, f".ci/ holds {sorted(held - CI_FILES)} beyond CI; a measurement script goes beside " \
                             f"its data under docs/ (docs/measurements/README.md)"
    assert ".ci/sanitize_case.py" in (ROOT / ".ci" / "gpu-run").read_text()


def test_every_data_file_under_docs_is_cited():
    markdown = {p: p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]}
    data = [p for p in repository_files(ROOT / "docs") if not p.name.endswith(NOT_DATA)]
    missing = uncited(data, markdown)
    assert not missing, ("no markdown cites these data files; add a line to their folder's README.md saying what "
                         f"each holds, or delete them: {missing}")


def test_a_citation_is_a_whole_path():
    folder = ROOT / "docs" / "x-h200"
    grid, sub_grid = folder / "grid.json", folder / "round2" / "grid.json"
    pages = {folder / "README.md": "- `round2/grid.json`: the second round", ROOT / "docs" / "p.md": "see grid.json"}
    assert uncited([grid, sub_grid], pages) == ["docs/x-h200/grid.json"]
    pages[ROOT / "docs" / "p.md"] = "see `x-h200/grid.json`, and docs/x-h200/grid.json."
    assert uncited([grid, sub_grid], pages) == []
