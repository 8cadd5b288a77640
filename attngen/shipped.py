"""The folders attngen ships beside its code: templates/, specs/ and generated/ sit at the top of
the repository and are installed into the wheel as attngen/templates, attngen/specs and
attngen/generated (pyproject.toml maps them). An installed attngen reads its own copies; a checkout
or an editable install reads the repository's."""
from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


# A file each shipped folder holds: an installed copy is recognised by it, not by the folder alone
# (a checkout can keep an attngen/<name>/ of __pycache__ from before the folder moved to the top).
MARKERS = {"templates": "lib/prelude.j2", "specs": "dispatch/table.yaml", "generated": "phase4.cu"}


def shipped(name: str) -> Path:
    """attngen/<name> in an installed wheel, else the repository's top-level <name>/."""
    installed = PACKAGE / name
    return installed if (installed / MARKERS[name]).is_file() else PACKAGE.parent / name


TEMPLATES = shipped("templates")     # lib/ (shared) and one folder per kind, named as the kind


__all__ = ["MARKERS", "PACKAGE", "TEMPLATES", "shipped"]
