"""A spec file's cells: the specs it stands for, one per element type it lists.

A spec that runs the same kernel on fp16 and bf16 says so once, `dtypes: [fp16, bf16]`, instead of
living in two files that differ in name, dtype and comment. Each cell is the spec a file of its own
would hold:

- its text is the file's, with the `dtypes` entry written as `dtype: <its dtype>`;
- the first dtype's cell takes the file's `name:`, every other one `<name>_<dtype>`;
- a line that starts with `#[<dtype>] ` belongs to that dtype's cell alone, which reads it without
  the marker (a comment or description that differs per dtype: "bf16 twin of ...", its own times).

A cell's text is exactly what its own file held before the twins were folded, so generated files,
whose header quotes that text and its sha256, keep their bytes. A file with a single `dtype:` (or
none) is one cell: its own text.

Cells are named by path, as files are: the first cell by its file, another by `<stem>_<dtype>.yaml`
beside it (`specs/h100_bwd_d128_bf16.yaml` is the bf16 cell of `specs/h100_bwd_d128.yaml`). The
specs no dispatch entry serves sit in the specs folder's `lab/`; a path names a spec in either
folder, and generated headers name it as if it sat in the specs folder (`address`), which is where
every spec sat when they were first rendered.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..errors import SpecError
from .specio import line_of, load_yaml, read_spec_text

LAB = "lab"                 # the folder, inside a specs folder, of the specs no dispatch entry serves
DTYPES_KEY = "dtypes"
MARKER = re.compile(r"#\[([^\]\s]*)\](?: |$)")
SPEC_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True)
class SpecCell:
    file: Path                  # the YAML file that holds the cell
    path: Path                  # how commands name it: the file, or <stem>_<dtype>.yaml beside it
    dtype: str | None           # the dtype it stands for, when the file lists `dtypes`
    text: str                   # what a spec file of this cell alone holds
    lines: tuple[int, ...]      # the file's line of each line of `text` (1-based), for errors

    @property
    def address(self) -> Path:
        """The path with a lab folder left out: what generated headers and the dispatch table call it."""
        return self.path.parent.parent / self.path.name if in_lab(self.path) else self.path


def in_lab(path: Path) -> bool:
    return Path(path).parent.name == LAB


# -- a file's cells --------------------------------------------------------------------------------

def file_cells(file: str | Path) -> tuple[SpecCell, ...]:
    """Every cell of a spec file, first dtype first; any problem of the file is one SpecError."""
    file = Path(file)
    return cells_of_text(read_spec_text(file), file, str(file))


def cells_of_text(text: str, file: Path, shown: str) -> tuple[SpecCell, ...]:
    """The cells of spec text read from `file` (`shown` names it in errors)."""
    data, node = load_yaml(text, shown)
    if DTYPES_KEY not in data:
        return (SpecCell(file, file, None, text, tuple(range(1, text.count("\n") + 2))),)
    dtypes = listed_dtypes(data, node, shown)
    marked = marked_lines(_lines(text), dtypes, shown)
    return tuple(_cell(text, node, file, d, d == dtypes[0], marked) for d in dtypes)


def listed_dtypes(data: dict, node: yaml.Node, shown: str) -> list[str]:
    """The `dtypes` list, checked: a list of names, at least one, each once, and no `dtype` beside it."""
    line = line_of(node, (DTYPES_KEY,))

    def refuse(message: str, hint: str) -> SpecError:
        return SpecError(message, file=shown, line=line, key=DTYPES_KEY, hint=hint)

    if "dtype" in data:
        raise refuse(f"is given with dtype (line {line_of(node, ('dtype',))})",
                     "keep one: dtype for one element type, or list every one in dtypes")
    dtypes = data[DTYPES_KEY]
    if not isinstance(dtypes, list) or not all(isinstance(d, str) and d for d in dtypes):
        raise refuse("is a list of element types", "write it as dtypes: [fp16, bf16]")
    if not dtypes:
        raise refuse("is empty", "list at least one element type, e.g. dtypes: [fp16]")
    twice = next((d for i, d in enumerate(dtypes) if d in dtypes[:i]), None)
    if twice is not None:
        raise refuse(f"lists {twice} twice", f"list {twice} once")
    return dtypes


def marked_lines(lines: list[str], dtypes: list[str], shown: str) -> dict[int, tuple[str, str]]:
    """{index: (dtype, the line without its marker)} of the lines that belong to one dtype's cell."""
    out = {}
    for i, line in enumerate(lines):
        m = MARKER.match(line)
        if m is None:
            continue
        if m.group(1) not in dtypes:
            raise SpecError(f"marks a line for {m.group(1)!r}, which dtypes does not list ({', '.join(dtypes)})",
                            file=shown, line=i + 1, key=DTYPES_KEY,
                            hint="mark it with a listed dtype, or add that dtype to the list")
        out[i] = (m.group(1), line[m.end():])
    return out


def _cell(text: str, node: yaml.MappingNode, file: Path, dtype: str, first: bool,
          marked: dict[int, tuple[str, str]]) -> SpecCell:
    """One dtype's cell: its `dtype:` line and name written in, the other dtypes' lines left out."""
    start, end, key_line, last_line = _dtypes_span(node)
    edits = [(start, end, f"dtype: {dtype}")]
    name = _value(node, "name")
    if not first and isinstance(name, yaml.ScalarNode):
        edits.append((name.start_mark.index, name.end_mark.index, f"{name.value}_{dtype}"))
    for edit_start, edit_end, new in sorted(edits, reverse=True):
        text = text[:edit_start] + new + text[edit_end:]
    out, origin = [], []
    for i, line in enumerate(_lines(text)):
        # a block list of dtypes became one line: the lines after it keep their number in the file
        file_index = i if i <= key_line else i + last_line - key_line
        if file_index in marked:
            owner, line = marked[file_index]
            if owner != dtype:
                continue
        out.append(line)
        origin.append(file_index + 1)
    path = file if first else file.with_name(f"{file.stem}_{dtype}{file.suffix}")
    return SpecCell(file, path, dtype, "".join(out), tuple(origin))


def _lines(text: str) -> list[str]:
    """The text's lines, each with its newline: lines as editors and error messages count them."""
    return re.findall(r"[^\n]*\n|[^\n]+$", text)


def _value(node: yaml.MappingNode, key: str) -> yaml.Node | None:
    return next((v for k, v in node.value if k.value == key), None)


def _dtypes_span(node: yaml.MappingNode) -> tuple[int, int, int, int]:
    """(start, end) in the text and (first, last) 0-based line of the `dtypes` entry, key to value: a
    block list ends at its last item (its own end mark lies at the next key)."""
    key, value = next((k, v) for k, v in node.value if k.value == DTYPES_KEY)
    last = value.value[-1] if isinstance(value, yaml.SequenceNode) and not value.flow_style else value
    return key.start_mark.index, last.end_mark.index, key.start_mark.line, last.end_mark.line


def cell_error(exc: SpecError, cell: SpecCell) -> SpecError:
    """An error of a cell's text, moved to its file: the file's line, and `dtypes` where the cell says `dtype`."""
    if cell.dtype is None:
        return exc
    if exc.line is not None and 1 <= exc.line <= len(cell.lines):
        exc.line = cell.lines[exc.line - 1]
    if exc.key == "dtype":
        exc.key = DTYPES_KEY
    exc.args = (exc.format(),)      # the same error (a BudgetError keeps its table), now at the file's line
    return exc


# -- which cell a path names -----------------------------------------------------------------------

def cell_at(path: str | Path) -> SpecCell:
    """The cell a path names: a spec file's first cell, or `<stem>_<dtype>.yaml`, the dtype cell of
    `<stem>.yaml` beside it; looked for in the path's folder, then in its lab (or, for a path in a
    lab, the folder above). Two files answering to one path is an error; so is none."""
    path = Path(path)
    for folder in _folders(path):
        found = _cells_named(folder / path.name)
        if len(found) > 1:
            raise SpecError(f"names both {found[0].file} and the {found[1].dtype} cell of {found[1].file}",
                            file=str(path), hint=f"delete {found[0].file}, or take {found[1].dtype} out of "
                            f"{found[1].file}'s dtypes")
        if found:
            return found[0]
    return file_cells(path)[0]          # no such file: read_spec_text says so in its words


def _folders(path: Path) -> tuple[Path, Path]:
    folder = path.parent
    return (folder, folder.parent) if folder.name == LAB else (folder, folder / LAB)


def _cells_named(path: Path) -> list[SpecCell]:
    """The cells `path` names in its own folder: the file's first cell, and a dtype cell of a sibling."""
    found = [file_cells(path)[0]] if path.is_file() else []
    stem, _, dtype = path.stem.rpartition("_")
    if stem:
        found += [c for c in _listed_cells(path.with_name(stem + path.suffix))[1:] if c.dtype == dtype]
    return found


def _listed_cells(file: Path) -> tuple[SpecCell, ...]:
    """The cells of a file that lists dtypes; none for another file, or one that cannot be read (a
    path beside it still names its own file, and the bad file is reported where it is rendered)."""
    try:
        return file_cells(file) if file.is_file() and DTYPES_KEY in read_spec_text(file) else ()
    except SpecError:
        return ()


def names_spec(folder: str | Path, name: str) -> bool:
    """Whether `<folder>/<name>.yaml` names a spec (a file or a dtype cell, in the folder or its lab)."""
    try:
        cell_at(Path(folder) / f"{name}.yaml")
    except SpecError:
        return False
    return True


def spec_paths(files) -> list[Path]:
    """Every cell of the given spec files, by path, each file once (`p.yaml` and a link to it are one
    file, whose other cells would otherwise be named twice). A file that cannot be read stands for
    itself (its error is reported where it is rendered); a path that is no file is kept as given."""
    out, seen = [], set()
    for f in map(Path, files):
        if f.is_file():
            if f.resolve() in seen:
                continue
            seen.add(f.resolve())
        try:
            out += [c.path for c in file_cells(f)] if f.is_file() else [f]
        except SpecError:
            out.append(f)
    return out


def folder_spec_files(folder: str | Path) -> list[Path]:
    """The spec files of a specs folder and of its lab, each folder's sorted by name."""
    folder = Path(folder)
    return [f for d in (folder, folder / LAB) for f in sorted(p for s in SPEC_SUFFIXES for p in d.glob(f"*{s}"))]


__all__ = ["DTYPES_KEY", "LAB", "SpecCell", "cell_at", "cell_error", "cells_of_text", "file_cells",
           "folder_spec_files", "in_lab", "names_spec", "spec_paths"]
