"""docs/architecture.md's module tree names exactly the modules under attngen/.

The tree is the code block under "## Module tree". Each line's first word is an entry when it ends
in `.py` (a module) or `/` (a package: its `__init__.py`); a line whose first word is neither
continues the description above it. Indentation nests an entry under the package line above it
that is indented less. Only the lines of the `attngen/` entry's subtree are compared."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENTRY = re.compile(r"[A-Za-z0-9_.]+(/|\.py)")


def documented_modules(text: str) -> set[str]:
    section = text[text.index("## Module tree"):]
    start = section.index("```\n") + 4
    block = section[start:section.index("```", start)]
    modules: set[str] = set()
    stack: list[tuple[int, str]] = []  # (indent, package path) of the enclosing package lines
    inside = False
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        word = line.split()[0]
        if not ENTRY.fullmatch(word):
            continue  # a description continued from the line above
        if indent == 0:
            inside = word == "attngen/"
            stack = []
        if not inside:
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        assert indent == 0 or stack, f"architecture.md: {word!r} is indented outside any package"
        path = (stack[-1][1] if stack else "") + word
        if word.endswith("/"):
            modules.add(path + "__init__.py")
            stack.append((indent, path))
        else:
            modules.add(path)
    return modules


def package_modules() -> set[str]:
    return {path.relative_to(ROOT).as_posix() for path in (ROOT / "attngen").rglob("*.py")
            if "__pycache__" not in path.parts}


def test_the_module_tree_lists_every_module_and_no_other():
    documented = documented_modules((ROOT / "docs" / "architecture.md").read_text())
    actual = package_modules()
    missing, extra = sorted(actual - documented), sorted(documented - actual)
    assert not missing and not extra, (
        "docs/architecture.md's module tree differs from attngen/:\n"
        f"  missing from the tree (exist in attngen/): {missing}\n"
        f"  extra in the tree (no such module): {extra}")


def test_the_tree_parser_reads_nesting_and_packages():
    text = "## Module tree\n\n```\nattngen/   a\n  x.py    b\n  p/      c\n    q.py  d\n          more text\n" \
           "  r.py    e\ntemplates/  not a module\n```\n"
    assert documented_modules(text) == {"attngen/__init__.py", "attngen/x.py", "attngen/p/__init__.py",
                                        "attngen/p/q.py", "attngen/r.py"}
