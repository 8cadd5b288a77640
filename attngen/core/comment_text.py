"""The one way spec text enters a generated file: as the text of a `//` comment line that cannot end.

A spec's free text (its description, its expressions as written, the whole spec echoed in the
header) is shown to reviewers, never compiled. A `//` comment ends at the first line break the C
preprocessor sees, and rendering itself splits lines at every break `str.splitlines()` knows; a
trailing backslash splices the next line into the comment; `/*` and `*/` confuse readers of the
file (attngen's lean pass among them). So every line of such text goes through `comment_line`,
which keeps what a reader wants to see and writes the rest as a visible `<U+XXXX>` escape:

- every line separator of Python or a C preprocessor (LF, CR, VT, FF, FS, GS, RS, NEL, U+2028,
  U+2029) and every other control, format (bidi overrides, zero-width characters), private-use,
  surrogate or unassigned character;
- a backslash at the end of the line, and the `/*`, `*/` and `??` pairs (block comments, trigraphs).

Printable ASCII, tabs and printable non-ASCII text (µ, ×, —) pass unchanged, so the comment of every
ordinary spec is its text, byte for byte.
"""
from __future__ import annotations

from ..errors import escape, visible_line

# Pairs that mean something to a C preprocessor or a comment reader inside a comment, each written
# with its second character escaped.
NEUTRALISED_PAIRS = ("/*", "*/", "??")


def comment_line(text: str) -> str:
    """`text` as the body of one `//` comment line: one line, nothing a preprocessor reads as an end
    of the comment or a directive, every hidden character visible."""
    out = visible_line(text)
    for pair in NEUTRALISED_PAIRS:
        out = out.replace(pair, pair[0] + escape(pair[1]))
    stripped = out.rstrip()
    if stripped.endswith("\\"):      # a line splice: the next line would join the comment
        out = stripped[:-1] + escape("\\")
    return out


def comment_lines(text: str) -> list[str]:
    """Multi-line text (a spec file) as comment line bodies: one per line of the text."""
    return [comment_line(line) for line in text.splitlines()]


__all__ = ["comment_line", "comment_lines", "escape", "visible_line"]
