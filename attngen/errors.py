"""The errors a user of attngen sees. Everything else is a bug in attngen."""
from __future__ import annotations

import re
import unicodedata

# Unicode categories a message or comment shows as escapes: controls, formats (bidi, zero-width), line
# and paragraph separators, surrogates, private use and unassigned code points.
ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})


def escape(ch: str) -> str:
    """How a character a message or comment must not carry is shown: <U+XXXX>."""
    return f"<U+{ord(ch):04X}>"


_PRINTABLE_ASCII = re.compile(r"[\t -~]*")     # what shown_char leaves as it is, ASCII only


def shown_char(ch: str) -> str:
    """`ch` as shown: printable text as it is, anything that could break a line, hide text or drive a
    terminal as its escape."""
    if ch == "\t" or " " <= ch <= "~":
        return ch
    if ch < "\x80" or unicodedata.category(ch) in ESCAPED_CATEGORIES:
        return escape(ch)
    return ch


def visible_line(text: str) -> str:
    """`text` as one line of a message: a key or value a spec supplies cannot break the line or
    send a terminal its control sequences (line breaks, controls, bidi shown as <U+XXXX>)."""
    if _PRINTABLE_ASCII.fullmatch(text):
        return text                       # (nearly every line: each character shows as itself)
    return "".join(shown_char(ch) for ch in text)


class AttngenError(Exception):
    """Base class: the CLI prints these as one message and exits with ``exit_code``."""

    exit_code = 2


class SpecError(AttngenError):
    """A spec file that cannot become a kernel: bad YAML, unknown key, wrong value, bad rule."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 key: str | None = None, hint: str | None = None):
        self.message = message
        self.file = file
        self.line = line
        self.key = key
        self.hint = hint
        super().__init__(self.format())

    def format(self) -> str:
        where = ""
        if self.file:
            where = self.file + (f":{self.line}" if self.line else "") + ": "
        key = f"{self.key}: " if self.key else ""
        hint = f"; {self.hint}" if self.hint else ""
        return visible_line(f"{where}{key}{self.message}{hint}")


class BudgetError(SpecError):
    """The plan's shared memory does not fit the target's per-block budget."""

    def __init__(self, message: str, *, breakdown: str, **kw):
        self.breakdown = breakdown
        super().__init__(message, **kw)

    def format(self) -> str:
        return super().format() + "\n" + self.breakdown


class ToolError(AttngenError):
    """A tool attngen needs (nvcc, a GPU, the CUDA driver) is missing or failed."""

    exit_code = 3


class WriteError(ToolError):
    """A file or directory attngen writes (generated source, a cubin, a report, the cache) could not
    be written: a full disk, a read-only directory, a missing permission."""


class NoGpuError(ToolError):
    """No CUDA GPU, torch or CUDA driver on this machine."""

    exit_code = 4
