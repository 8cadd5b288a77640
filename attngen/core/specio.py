"""Spec files as YAML: reading a file, composing it with line numbers, finding a key's line.

Everything a spec file can do wrong before validation (unreadable, not YAML, not a mapping, a key
given twice) becomes one SpecError naming the file and line.
"""
from __future__ import annotations

from pathlib import Path

import yaml

from ..errors import SpecError


def read_spec_text(path: str | Path) -> str:
    """The text of a spec file; a missing, unreadable or non-UTF-8 file becomes one SpecError."""
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError("no such spec file", file=str(path)) from None
    except IsADirectoryError:
        raise SpecError("is a directory, not a spec file", file=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read spec: {exc}", file=str(path)) from None


def load_yaml(text: str, file: str = "<spec>") -> tuple[dict, yaml.Node]:
    """(data, composed node tree) of spec text; the node tree gives every key its line."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(f"YAML syntax error: {problem}", file=file, line=line,
                        hint="check indentation and the ':' after each key") from None
    if not isinstance(data, dict):
        raise SpecError("a spec is a YAML mapping of keys (schema, name, tile, ...)", file=file, line=1)
    dup = duplicate_key(node)
    if dup:
        key, line, first = dup
        raise SpecError(f"key given twice (first on line {first}); keep one", file=file, line=line, key=key)
    return data, node


def line_of(node: yaml.Node | None, path: tuple) -> int | None:
    """Line (1-based) of the deepest node along a key path inside a composed YAML tree."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in path:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if k.value == str(part):
                    line = k.start_mark.line + 1
                    node = v
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def duplicate_key(node: yaml.Node, path: tuple = ()) -> tuple[str, int, int] | None:
    """(key path, line, first line) of the first key given twice in one mapping, else None.

    PyYAML silently keeps the last value of a repeated key; in a spec that hides an edit.
    """
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for k, v in node.value:
            line = k.start_mark.line + 1
            if isinstance(k, yaml.ScalarNode):
                if k.value in seen:
                    return ".".join(map(str, path + (k.value,))), line, seen[k.value]
                seen[k.value] = line
            found = duplicate_key(v, path + (getattr(k, "value", "?"),))
            if found:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            found = duplicate_key(v, path + (i,))
            if found:
                return found
    return None
