"""A spec file's cells: the specs it stands for, one per family member and element type it lists.

A file describes a *family*: one spec (its own keys) and the grid it serves, so specs that differ
only in a few keys live in one file instead of one file each.

- `dtypes: [fp16, bf16]` instead of `dtype`: a cell per element type.
- `cells:` a mapping of members, each a variant set (or any other set of keys) of the file's spec:
  `window: {masks: [window]}`. A member's keys replace the file's (a null value, `~`, leaves the
  key out); a key the file does not have goes on a line of its own after the key written before it
  in the member's entry (the entry's first key at the end of the file). A member may list its own
  `dtypes` (some of the file's, or others); it may not set `name`, `schema`, `dtype` beside `dtypes`, `cells`
  or `base_cell`.
- `base_cell: false`: the file's own spec is no cell, only its members are (a lab file holding the
  unserved members of a family whose served file sits in specs/).

Names, one rule: a cell is named `<name>[_<member>][_<dtype>]`: the file's `name`, then the
member's key (none for the file's own spec), then the dtype for every dtype of the list but the
first. Its path is that name beside the file (`specs/h100_bwd_d64_wgmma_window_bf16.yaml` is the
bf16 cell of member `window` of `specs/h100_bwd_d64_wgmma.yaml`); the file's path names its own
spec's first dtype.

Each cell is the spec a file of its own would hold, its text the file's edited:

- the `cells` and `base_cell` entries left out, the member's keys written in (each value as the
  entry writes it), the `dtypes` entry written as `dtype: <its dtype>`, `name:` its name;
- a line that starts with a marker `#[<tags>] ` belongs to the cells each of whose tags names
  (`#[window bf16] `: the bf16 cell of member window), which read it without the marker. A tag is a
  dtype, a member, or `base` (the file's own spec); tags joined by `,` are alternatives
  (`#[alibi,softcap] `). A comment or description that differs per cell: "otherwise <name>_bf16".

A cell's text is exactly what its own file held before the files were folded, so generated files,
whose header quotes that text and its sha256, keep their bytes. A file with neither `dtypes` nor
`cells` is one cell: its own text.

Cells are named by path, as files are. The specs no dispatch entry serves sit in the specs folder's
`lab/`; a path names a spec in either folder, and generated headers name it as if it sat in the
specs folder (`address`), which is where every spec sat when they were first rendered.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..errors import SpecError
from .specio import line_of, load_yaml, read_spec_text

LAB = "lab"                 # the folder, inside a specs folder, of the specs no dispatch entry serves
DTYPES_KEY = "dtypes"
CELLS_KEY = "cells"
BASE_KEY = "base_cell"
BASE_TAG = "base"           # the marker tag of the file's own spec
FAMILY_KEYS = (DTYPES_KEY, CELLS_KEY, BASE_KEY)
MARKER = re.compile(r"#\[([^\]\n]*)\](?: |$)")
MEMBER = re.compile(r"[a-z0-9][a-z0-9_]{0,39}")      # matched whole (fullmatch)
SPEC_SUFFIXES = (".yaml", ".yml")
_NOT_IN_MEMBERS = ("name", "schema", CELLS_KEY, BASE_KEY)


@dataclass(frozen=True)
class SpecCell:
    file: Path                  # the YAML file that holds the cell
    path: Path                  # how commands name it: the file, or <name>[_<member>][_<dtype>].yaml beside it
    dtype: str | None           # the dtype it stands for, when the file (or its member) lists `dtypes`
    text: str                   # what a spec file of this cell alone holds
    lines: tuple[int, ...]      # the file's line of each line of `text` (1-based), for errors
    member: str | None = None   # the `cells` member it stands for; None: the file's own spec
    line: int | None = None     # the file's line that makes it a cell (its member's key, or `dtypes`)
    alone: bool = False         # the file holds this cell only, as its own text
    entry_lines: frozenset = frozenset()    # the file's lines of its member's entry

    @property
    def address(self) -> Path:
        """The path with a lab folder left out: what generated headers and the dispatch table call it."""
        return self.path.parent.parent / self.path.name if in_lab(self.path) else self.path

    @property
    def shown(self) -> str:
        """The cell in words, for errors: `the bf16 cell of member window`."""
        what = " ".join(x for x in (self.dtype, "cell") if x)
        return f"the {what} of member {self.member}" if self.member else f"the {what}"


def in_lab(path: Path) -> bool:
    return Path(path).parent.name == LAB


# -- a file's cells --------------------------------------------------------------------------------

def file_cells(file: str | Path) -> tuple[SpecCell, ...]:
    """Every cell of a spec file: the file's own spec, then each member, each first dtype first; any
    problem of the file is one SpecError."""
    file = Path(file)
    return cells_of_text(read_spec_text(file), file, str(file))


@functools.lru_cache(maxsize=1024)
def cells_of_text(text: str, file: Path, shown: str) -> tuple[SpecCell, ...]:
    """The cells of spec text read from `file` (`shown` names it in errors)."""
    data, node = load_yaml(text, shown)
    if not any(k in data for k in FAMILY_KEYS):
        return (SpecCell(file, file, None, text, tuple(range(1, text.count("\n") + 2)), alone=True),)
    family = _Family(text, node, data, file, shown)
    cells = tuple(family.cell(m, d) for m in family.members for d in family.dtypes_of(m))
    _refuse_a_shared_name(cells, shown)
    return cells


def _refuse_a_shared_name(cells: tuple[SpecCell, ...], shown: str) -> None:
    """Two cells of one file named alike (a member named like a dtype, or `w` beside `w_bf16`) would
    be one path for two specs: the later one is refused at its member's line."""
    seen: dict[Path, SpecCell] = {}
    for c in cells:
        first = seen.setdefault(c.path, c)
        if first is not c:
            raise SpecError(f"{c.shown} is named {c.path.stem}, and so is {first.shown}", file=shown, line=c.line,
                            key=f"{CELLS_KEY}.{c.member}" if c.member else DTYPES_KEY,
                            hint="rename the member: cells are named <name>[_<member>][_<dtype>], each once")


def _refusal(shown: str, line: int | None, key: str):
    def refuse(message: str, hint: str) -> SpecError:
        return SpecError(message, file=shown, line=line, key=key, hint=hint)
    return refuse


def listed_dtypes(value, line: int | None, shown: str, key: str = DTYPES_KEY) -> list[str]:
    """A `dtypes` list, checked: a list of names, at least one, each once."""
    refuse = _refusal(shown, line, key)
    if not isinstance(value, list) or not all(isinstance(d, str) and d for d in value):
        raise refuse("is a list of element types", "write it as dtypes: [fp16, bf16]")
    if not value:
        raise refuse("is empty", "list at least one element type, e.g. dtypes: [fp16]")
    twice = next((d for i, d in enumerate(value) if d in value[:i]), None)
    if twice is not None:
        raise refuse(f"lists {twice} twice", f"list {twice} once")
    return value


class _Family:
    """A file that lists dtypes or cells, read once: its members, their entries, its marked lines."""

    def __init__(self, text: str, node: yaml.MappingNode, data: dict, file: Path, shown: str):
        self.text, self.node, self.file, self.shown = text, node, file, shown
        self.lines = _lines(text)
        self.top = {k.value: (k, v) for k, v in node.value}
        self.dtypes = None
        if DTYPES_KEY in data:
            if "dtype" in data:
                raise _refusal(shown, self._line(DTYPES_KEY), DTYPES_KEY)(
                    f"is given with dtype (line {self._line('dtype')})",
                    "keep one: dtype for one element type, or list every one in dtypes")
            self.dtypes = listed_dtypes(data[DTYPES_KEY], self._line(DTYPES_KEY), shown)
        self.entries = self._entries(data)          # member -> (key node, entry mapping node, entry data)
        base = data.get(BASE_KEY, True)
        if not isinstance(base, bool):
            raise _refusal(shown, self._line(BASE_KEY), BASE_KEY)(
                "is true or false", "base_cell: false makes the file's own spec no cell, only its cells")
        if base is False and not self.entries:
            raise _refusal(shown, self._line(BASE_KEY), BASE_KEY)(
                "is false, and cells lists no member: the file would stand for no spec",
                "list the members under cells, or remove base_cell")
        self.members = ([None] if base else []) + list(self.entries)
        if self.entries and not isinstance(self.top.get("name", (None, None))[1], yaml.ScalarNode):
            raise _refusal(shown, self._line(CELLS_KEY), CELLS_KEY)(
                "names each cell <name>_<member>, and the file has no name", "give the file's spec a name")
        self.marked = self._marked()

    def _line(self, key: str) -> int | None:
        return line_of(self.node, (key,))

    # -- members

    def _entries(self, data: dict) -> dict:
        if CELLS_KEY not in data:
            return {}
        refuse = _refusal(self.shown, self._line(CELLS_KEY), CELLS_KEY)
        cells = self.top[CELLS_KEY][1]
        if not isinstance(cells, yaml.MappingNode) or not cells.value:
            raise refuse("is a mapping of members, each the keys its cell changes",
                         "write it as cells: {window: {masks: [window]}}, one member a line")
        out = {}
        for key, entry in cells.value:
            member, line = key.value, key.start_mark.line + 1
            where = _refusal(self.shown, line, f"{CELLS_KEY}.{member}")
            if not isinstance(member, str) or not MEMBER.fullmatch(member) or member == BASE_TAG:
                raise where("is no member name (lower case letters, digits and _, not base)",
                            "name the member by the suffix its cells' names take, e.g. window")
            if not isinstance(entry, yaml.MappingNode):
                raise where("is a mapping of the keys its cell changes", f"write it as {member}: {{masks: [window]}}")
            values = data[CELLS_KEY][member]
            for k, v in entry.value:
                at = _refusal(self.shown, k.start_mark.line + 1, f"{CELLS_KEY}.{member}.{k.value}")
                if k.value in _NOT_IN_MEMBERS:
                    raise at("is the file's alone", "a member's cells are named <name>_<member>; "
                             "remove the key from the member" if k.value == "name" else "remove it from the member")
                if k.value == "dtype" and self.dtypes is not None:
                    raise at("is given where the file lists dtypes", "give the member its own dtypes: [...]")
                if k.value == DTYPES_KEY:
                    if self.dtypes is None:
                        raise at("is given where the file has one dtype", "list the file's dtypes in dtypes: [...]")
                    listed_dtypes(values[DTYPES_KEY], k.start_mark.line + 1, self.shown, f"{CELLS_KEY}.{member}.{DTYPES_KEY}")
                    continue
                if k.start_mark.line != _last_line(v):      # a block value starts on the next line
                    raise at("is written on more than one line",
                             "write the value on one line, in flow style: {block_m: 64, block_n: 128}")
                if k.value not in self.top and _is_null(v):
                    raise at("leaves out a key the file does not have", "remove it from the member")
                if k.value in self.top:
                    fk, fv = self.top[k.value]
                    if not _is_null(v) and fk.start_mark.line != _last_line(fv):
                        raise at(f"replaces a value the file writes on more than one line (line {fk.start_mark.line + 1})",
                                 "write the file's value on one line, in flow style")
            out[member] = (key, entry, values)
        return out

    def dtypes_of(self, member: str | None) -> list[str | None]:
        if self.dtypes is None:
            return [None]
        if member is not None and DTYPES_KEY in self.entries[member][2]:
            return self.entries[member][2][DTYPES_KEY]
        return self.dtypes

    # -- markers

    def _tags(self) -> set[str]:
        tags = set(self.dtypes or ()) | set(self.entries)
        for m in self.entries:
            tags |= set(self.dtypes_of(m))
        if None in self.members:
            tags.add(BASE_TAG)
        return tags - {None}

    def _marked(self) -> dict[int, tuple[list[set[str]], str]]:
        """{index: (tag groups, the line without its marker)} of the lines that belong to some cells."""
        known, out = self._tags(), {}
        key = CELLS_KEY if self.entries else DTYPES_KEY
        for i, line in enumerate(self.lines):
            m = MARKER.match(line)
            if m is None:
                continue
            groups = [set(g.split(",")) for g in m.group(1).split()]
            unknown = sorted(t for g in groups for t in g if t not in known)
            if unknown or not groups:
                lists = "dtypes" if key == DTYPES_KEY else "dtypes, cells or base"
                what = "an empty tag" if not groups or unknown[0] == "" else repr(unknown[0])
                raise SpecError(f"marks a line for {what}, which {lists} does not name "
                                f"({', '.join(sorted(known))})", file=self.shown, line=i + 1, key=key,
                                hint="mark it with a listed dtype or member, or add it to the list")
            out[i] = (groups, line[m.end():])
        return out

    # -- one cell

    def cell(self, member: str | None, dtype: str | None) -> SpecCell:
        """The cell of one member (None: the file's own spec) and dtype: the file's lines, edited."""
        replace: dict[int, tuple[str, int]] = {}    # index -> (new line, file line)
        drop: set[int] = set()
        after: dict[int, list[tuple[str, int]]] = {}    # index -> lines inserted after it (text, file line)
        entry_lines = set()
        for key in (CELLS_KEY, BASE_KEY):
            if key in self.top:
                drop |= set(range(self.top[key][0].start_mark.line, _last_line(self.top[key][1]) + 1))
        if member is not None:
            cursor = None
            for k, v in self.entries[member][1].value:
                if k.value == DTYPES_KEY:
                    continue
                value = self.text[v.start_mark.index:v.end_mark.index]
                origin = k.start_mark.line + 1
                entry_lines.add(origin)
                if k.value in self.top:
                    fk, fv = self.top[k.value]
                    first, last = fk.start_mark.line, _last_line(fv)
                    if _is_null(v):
                        drop |= set(range(first, last + 1))
                    else:
                        line = self.lines[first]
                        replace[first] = (line[:fv.start_mark.column] + value + line[fv.end_mark.column:], origin)
                    cursor = last
                else:
                    at = len(self.lines) - 1 if cursor is None else cursor
                    after.setdefault(at, []).append((f"{k.value}: {value}\n", origin))
                    cursor = at
        if dtype is not None:
            fk, fv = self.top[DTYPES_KEY]
            last = fv.value[-1] if isinstance(fv, yaml.SequenceNode) and not fv.flow_style and fv.value else fv
            first_line, last_line = fk.start_mark.line, last.end_mark.line
            tail = self.lines[last_line][last.end_mark.column:]
            head = self.lines[first_line][:fk.start_mark.column]
            replace[first_line] = (head + f"dtype: {dtype}" + tail, first_line + 1)
            drop |= set(range(first_line + 1, last_line + 1))
        name = self.top.get("name", (None, None))[1]
        suffix = "".join(f"_{x}" for x in (member, dtype if dtype != self.dtypes_of(member)[0] else None) if x)
        if suffix and isinstance(name, yaml.ScalarNode):
            i = name.start_mark.line
            line = replace.get(i, (self.lines[i], i + 1))[0]
            replace[i] = (line[:name.start_mark.column] + name.value + suffix + line[name.end_mark.column:], i + 1)
        tags = {t for t in (member or BASE_TAG, dtype) if t}
        out, origin = [], []
        for i, line in enumerate(self.lines):
            if i not in drop:
                text, at = replace.get(i, (line, i + 1))
                if i in self.marked:
                    groups, text = self.marked[i]
                    if not all(g & tags for g in groups):
                        text = None
                if text is not None:
                    out.append(text)
                    origin.append(at)
            for text, at in after.get(i, ()):
                if out and not out[-1].endswith("\n"):
                    out[-1] += "\n"
                out.append(text)
                origin.append(at)
        path = self.file.with_name(f"{self.file.stem}{suffix}{self.file.suffix}")
        declared = (self.entries[member][0].start_mark.line + 1 if member is not None
                    else self._line(DTYPES_KEY) if dtype is not None else None)
        return SpecCell(self.file, path, dtype, "".join(out), tuple(origin), member, declared,
                        entry_lines=frozenset(entry_lines))


def _is_null(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"


def _last_line(node: yaml.Node) -> int:
    """The 0-based line a value ends on: a block collection at its last item (its own end mark lies
    at the next key)."""
    if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)) and not node.flow_style and node.value:
        last = node.value[-1]
        return _last_line(last[1] if isinstance(node, yaml.MappingNode) else last)
    end = node.end_mark
    return end.line - 1 if end.column == 0 and end.line > node.start_mark.line else end.line


def _lines(text: str) -> list[str]:
    """The text's lines, each with its newline: lines as editors and error messages count them."""
    return re.findall(r"[^\n]*\n|[^\n]+$", text)


def cell_error(exc: SpecError, cell: SpecCell) -> SpecError:
    """An error of a cell's text, moved to its file: the file's line, `dtypes` where the cell says
    `dtype`, and `cells.<member>.<key>` where the member's entry wrote the key."""
    if cell.alone:
        return exc
    if exc.line is not None and 1 <= exc.line <= len(cell.lines):
        exc.line = cell.lines[exc.line - 1]
        if exc.line in cell.entry_lines and exc.key:
            exc.key = f"{CELLS_KEY}.{cell.member}.{exc.key}"
    if exc.key == "dtype" and cell.dtype is not None:
        exc.key = DTYPES_KEY
    exc.args = (exc.format(),)      # the same error (a BudgetError keeps its table), now at the file's line
    return exc


# -- which cell a path names -----------------------------------------------------------------------

def cell_at(path: str | Path) -> SpecCell:
    """The cell a path names: a spec file's own first cell, or a cell `<name>[_<member>][_<dtype>]`
    of a file beside it whose name the path's starts with; looked for in the path's folder, then in
    its lab (or, for a path in a lab, the folder above). Two files answering to one path is an
    error; so is none."""
    path = Path(path)
    for folder in _folders(path):
        found = _cells_named(folder / path.name)
        if len(found) > 1:
            raise _twice(path, found)
        if found:
            return found[0]
    if path.is_file():
        file_cells(path)                # a family file that is no cell itself: a path names its cells
        raise SpecError("names a family file whose own spec is no cell (base_cell: false)", file=str(path),
                        hint="name one of its cells, or build the file to build them all")
    return file_cells(path)[0]          # no such file: read_spec_text says so in its words


def _twice(path: Path, found: list[SpecCell]) -> SpecError:
    """Two cells answering to one path: the family's cell is refused at its line, with the fix."""
    own = next((c for c in found if c.path == c.file), None)
    if own is None:                     # two families' members: neither is a file of its own
        first, other = found[0], found[1]
        return SpecError(f"{other.shown} is {path.name}, and so is {first.shown} of {first.file}",
                         file=str(other.file), line=other.line,
                         key=f"{CELLS_KEY}.{other.member}" if other.member else DTYPES_KEY,
                         hint="rename a member in one of the two files: a path names one cell")
    other = next(c for c in found if c is not own)
    key = f"{CELLS_KEY}.{other.member}" if other.member else DTYPES_KEY
    take = f"remove member {other.member} from cells" if other.member else f"take {other.dtype} out of dtypes"
    return SpecError(f"{other.shown} is {path.name}, and so is the file {own.file}", file=str(other.file),
                     line=other.line, key=key, hint=f"delete {own.file}, or {take}")


def _folders(path: Path) -> tuple[Path, Path]:
    folder = path.parent
    return (folder, folder.parent) if folder.name == LAB else (folder, folder / LAB)


def _cells_named(path: Path) -> list[SpecCell]:
    """The cells `path` names in its own folder: the file's own cell, and a cell of a family file
    whose stem is a prefix of the path's (`<stem>_...`)."""
    found = []
    if path.is_file():
        found += [c for c in file_cells(path) if c.path == path]
    parts = path.stem.split("_")
    for n in range(1, len(parts)):
        found += [c for c in _family_cells(path.with_name("_".join(parts[:n]) + path.suffix)) if c.path == path]
    return found


def _family_cells(file: Path) -> tuple[SpecCell, ...]:
    """The cells of a file that lists dtypes or cells; none for another file, or one that cannot be
    read (a path beside it still names its own file, and the bad file is reported where it is
    rendered)."""
    try:
        if not file.is_file():
            return ()
        text = read_spec_text(file)
        return cells_of_text(text, file, str(file)) if any(k in text for k in FAMILY_KEYS) else ()
    except SpecError:
        return ()


def names_spec(folder: str | Path, name: str) -> bool:
    """Whether `<folder>/<name>.yaml` names a spec (a file or a cell, in the folder or its lab)."""
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


__all__ = ["BASE_KEY", "CELLS_KEY", "DTYPES_KEY", "FAMILY_KEYS", "LAB", "SpecCell", "cell_at", "cell_error",
           "cells_of_text", "file_cells", "folder_spec_files", "in_lab", "names_spec", "spec_paths"]
