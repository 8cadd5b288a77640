"""The errors a user of attngen sees. Everything else is a bug in attngen."""
from __future__ import annotations

from .core.comment_text import visible_line


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
