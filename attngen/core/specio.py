"""Spec files as YAML: reading a file, composing it with line numbers, finding a key's line.

Everything a spec file can do wrong before validation (unreadable, not a regular file, too large,
not YAML, nested too deep, anchors and aliases, explicit tags, number forms whose meaning depends
on the YAML version, not a mapping, a key given twice) becomes one SpecError naming the file and
line.

The YAML read here is deliberately small: a spec is a few hundred bytes of mappings, lists,
strings, plain decimal integers and true/false. PyYAML implements YAML 1.1, where `0100` is octal
64, `1:04` is base-60 64, `6_4` is 64 and `on` is true; YAML 1.2 and most other tools read those
differently, so a spec that relied on them would mean different things to different readers. The
loader below resolves only the unambiguous forms and refuses the rest with the value as written.
"""
from __future__ import annotations

import math
import re
import stat
from pathlib import Path

import yaml

from ..errors import SpecError
from ..fsutil import NotRegular, NotUtf8, ReadRefused, TooLarge, read_regular, reason, utf8_text

# The largest spec in specs/ is under 1 KiB; 64 KiB leaves room for long comments and nothing else.
MAX_SPEC_BYTES = 64 * 1024
# A spec nests at most 4 levels (document, smem, swizzle, pad_bytes).
MAX_DEPTH = 16
# Plain decimal integers longer than this are refused before Python converts them.
MAX_INT_DIGITS = 18


# -- reading the file ------------------------------------------------------------------------

def _too_large(size: int) -> str:
    return (f"is {size} bytes; a spec file is at most {MAX_SPEC_BYTES} bytes ({MAX_SPEC_BYTES // 1024} KiB), "
            "a spec is a few hundred")


def read_spec_text(path: str | Path) -> str:
    """The text of a spec file.

    Only a regular file of at most MAX_SPEC_BYTES of UTF-8 is read; a link is followed (a user may
    point at a spec through one). A missing, unreadable, non-regular (FIFO, device, directory),
    oversized or non-UTF-8 file becomes one SpecError. A FIFO or device is refused without being
    opened, so a FIFO with no writer is never waited on.
    """
    name = str(path)
    try:
        data = read_regular(name, MAX_SPEC_BYTES, follow=True)
    except FileNotFoundError:
        raise SpecError("no such spec file", file=name) from None
    except (ReadRefused, OSError) as exc:
        raise SpecError(_refusal(exc), file=name) from None
    try:
        return utf8_text(data)
    except NotUtf8 as exc:
        raise SpecError(f"cannot read spec: {exc}", file=name, line=exc.line, hint="save the file as UTF-8") from None


def _refusal(exc: Exception) -> str:
    """What read_regular's refusal or OSError says of a spec file."""
    if isinstance(exc, NotRegular):
        if stat.S_ISDIR(exc.mode):
            return "is a directory, not a spec file"
        return f"is {exc.kind}, not a regular file; a spec is a small YAML file"
    if isinstance(exc, TooLarge):
        return _too_large(exc.size) + (" (it grew while being read)" if exc.grew else "")
    return f"cannot read spec: {reason(exc)}"


# -- the loader ------------------------------------------------------------------------------

class _Refused(Exception):
    """A construct the spec loader does not accept, with the 1-based line it starts on."""

    def __init__(self, message: str, line: int | None, hint: str | None = None, key: str | None = None):
        super().__init__(message)
        self.message, self.line, self.hint, self.key = message, line, hint, key


_INT = re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$")
_FLOAT = re.compile(r"^[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?$")
_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_NULL = re.compile(r"^(?:~|null|Null|NULL|)$")


class SpecLoader(yaml.SafeLoader):
    """SafeLoader that resolves only plain decimal ints, decimal floats, true/false and null,
    and refuses anchors, aliases, explicit tags and nesting deeper than MAX_DEPTH.

    Any other plain scalar is a string here; `suspicious_scalar` then refuses those that YAML 1.1
    or 1.2 would read as a number or a boolean.
    """

    yaml_implicit_resolvers: dict = {}

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent):
            raise _Refused(f"YAML alias *{event.anchor} is not allowed in a spec", line,
                           "write the value out where it is used")
        if getattr(event, "anchor", None) is not None:
            raise _Refused(f"YAML anchor &{event.anchor} is not allowed in a spec", line,
                           "remove it and write values out where they are used")
        tag = getattr(event, "tag", None)
        if tag is not None:
            if tag.startswith("tag:yaml.org,2002:"):
                tag = "!!" + tag[len("tag:yaml.org,2002:"):]
            raise _Refused(f"explicit YAML tag {_shown(tag)} is not allowed in a spec", line,
                           "remove the tag; quote a value to make it a string")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(f"nested more than {MAX_DEPTH} levels deep; a spec nests at most 4 "
                               "(e.g. smem.swizzle.pad_bytes)", line)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


for _tag, _regexp, _first in (
        ("tag:yaml.org,2002:int", _INT, "-+0123456789"),
        ("tag:yaml.org,2002:float", _FLOAT, "-+0123456789."),
        ("tag:yaml.org,2002:bool", _BOOL, "tTfF"),
        ("tag:yaml.org,2002:null", _NULL, ["~", "n", "N", ""])):
    SpecLoader.add_implicit_resolver(_tag, _regexp, list(_first))


# Plain scalars that SpecLoader leaves as strings but some YAML reader takes for a number or a
# boolean: (pattern, what it is, fix). The fix may name {v}, YAML 1.1's reading of the value.
_SUSPICIOUS = [
    (re.compile(r"^[-+]?0[0-7_]+$"), "a YAML 1.1 octal number ({v})",
     "integers are plain decimal without leading zeros: write {v}"),
    (re.compile(r"^[-+]?0[0-9_]+$"), "a decimal number with a leading zero",
     "integers are plain decimal without leading zeros: write {d}"),
    (re.compile(r"^[-+]?0x[0-9a-fA-F_]+$"), "a hexadecimal number ({v})", "integers are plain decimal: write {v}"),
    (re.compile(r"^[-+]?0o[0-7_]+$"), "an octal number ({o})", "integers are plain decimal: write {o}"),
    (re.compile(r"^[-+]?0b[01_]+$"), "a binary number ({v})", "integers are plain decimal: write {v}"),
    (re.compile(r"^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$"), "a YAML 1.1 base-60 number ({v})",
     "integers are plain decimal: write {v}"),
    (re.compile(r"^[-+]?(?:[0-9][0-9_]*)?\.?[0-9_]*(?:[eE][-+]?[0-9]+)?$"), "a number with digit separators or an "
     "exponent", "integers are plain decimal digits only: write {d}"),
    (re.compile(r"^[-+]?\.(?:inf|Inf|INF|nan|NaN|NAN)$"), "a YAML float ({v})",
     "a spec takes no infinities or NaNs: write a plain decimal integer"),
    (re.compile(r"^(?:yes|Yes|YES|no|No|NO|on|On|ON|off|Off|OFF|y|Y|n|N)$"), "a YAML 1.1 boolean",
     "write true or false"),
]


_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
# A number is named in a fix only up to this size; a longer one helps no reader of the message.
_MAX_SHOWN = 10 ** MAX_INT_DIGITS


def _shown_number(n):
    """n when it is a finite number short enough to write out in a fix, else None."""
    if isinstance(n, bool) or not isinstance(n, (int, float)):
        return None
    if isinstance(n, float) and not math.isfinite(n):
        return None
    return n if abs(n) < _MAX_SHOWN else None


def _yaml11(value: str) -> tuple[bool, object]:
    """(whether PyYAML's YAML 1.1 SafeLoader reads a plain scalar as a number, that number or None).

    YAML 1.1 resolves `0x_` and `0b_` as integers and then fails to convert them: such a value is
    still a number to that reader (a file holding it does not load there), only one without a value.
    """
    if yaml.resolver.Resolver().resolve(yaml.ScalarNode, value, (True, False)) not in _NUMBER_TAGS:
        return False, None
    try:
        return True, _shown_number(yaml.load(value, Loader=yaml.SafeLoader))
    except (yaml.YAMLError, ValueError, OverflowError):
        return True, None


def _decimal(value: str) -> tuple[bool, object]:
    """(whether the value has a digit before any exponent, its value read as decimal digits
    ignoring separators, leading zeros and exponents, or None). `1_0e400` has digits but no
    finite value; `_` and `.e1` have none."""
    if not any(c in "0123456789" for c in re.split("[eE]", value)[0]):
        return False, None
    try:
        f = float(value.replace("_", ""))
    except (ValueError, OverflowError):
        return True, None
    if not math.isfinite(f):
        return True, None
    return True, _shown_number(int(f) if f.is_integer() else f)


def _octal(value: str) -> tuple[bool, object]:
    """(whether a `0o` value has octal digits, their value). `0o_` has none: it is text to every
    YAML reader."""
    sign = -1 if value.startswith("-") else 1
    digits = value.lstrip("+-")[2:].replace("_", "")
    if not digits:
        return False, None
    return True, _shown_number(sign * int(digits, 8))


_READINGS = {"v": _yaml11, "d": _decimal, "o": _octal}


def _shown(value: str) -> str:
    return value if len(value) <= 40 else value[:37] + "..."


def suspicious_scalar(value: str) -> tuple[str, str] | None:
    """(problem, fix) when a plain scalar that SpecLoader reads as a string would be a number or a
    boolean to YAML 1.1 or 1.2, else None.

    The fix names the number the value stands for when it has one that can be written out;
    otherwise (`0x_` has no digits, `1e400` no finite value) it names none. Never raises.
    """
    if not value or len(value) > 64 or not (value[0] in "-+.0123456789" or value[0] in "yYnNoO"):
        return None
    for pattern, what, fix in _SUSPICIOUS:
        if not pattern.match(value):
            continue
        subs, is_number = {}, True
        for key in set(re.findall(r"\{(\w)\}", what + fix)):
            number_form, subs[key] = _READINGS[key](value)
            is_number = is_number and number_form
        if not is_number and not _yaml11(value)[0]:
            continue                     # every reader takes it for text: `0:30` (1.1 wants 1-9 first), `_`
        if any(v is None for v in subs.values()):
            what = re.sub(r" \(\{\w\}\)", "", what)
            fix = re.sub(r": write \{\w\}$", "", fix)
        return what.format(**subs), fix.format(**subs)
    return None


def _check_scalars(node: yaml.Node, path: tuple = ()) -> None:
    """Refuse plain scalars of ambiguous meaning and oversized integers anywhere in the tree."""
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if not (isinstance(k, yaml.ScalarNode) and k.tag == "tag:yaml.org,2002:str"):
                shown = f"'{_shown(k.value)}'" if isinstance(k, yaml.ScalarNode) else "(a " + k.id + ")"
                raise _Refused(f"key {shown} is not a name; keys are words like tile or block_m",
                               k.start_mark.line + 1, key=".".join(map(str, path)) or None)
            _check_scalars(v, path + (k.value,))
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            _check_scalars(v, path + (i,))
    elif isinstance(node, yaml.ScalarNode) and node.style is None:
        line = node.start_mark.line + 1
        key = ".".join(map(str, path)) or None
        if node.tag == "tag:yaml.org,2002:int" and len(node.value.lstrip("+-")) > MAX_INT_DIGITS:
            raise _Refused(f"integer {_shown(node.value)} has {len(node.value.lstrip('+-'))} digits, more than any "
                           "spec value", line, "a spec's integers are at most a few hundred", key)
        if node.tag == "tag:yaml.org,2002:str":
            found = suspicious_scalar(node.value)
            if found:
                what, fix = found
                raise _Refused(f"{_shown(node.value)} is {what}", line,
                               f"{fix} (quote it if you mean text)", key)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def load_yaml(text: str, file: str = "<spec>") -> tuple[dict, yaml.Node]:
    """(data, composed node tree) of spec text; the node tree gives every key its line."""
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError(_too_large(len(text.encode("utf-8", "surrogatepass"))), file=file)
    loader = None
    try:
        loader = SpecLoader(text)
        node = loader.get_single_node()
        if node is not None:
            _check_scalars(node)
        data = loader.construct_document(node) if node is not None else None
    except _Refused as exc:
        raise SpecError(exc.message, file=file, line=exc.line, key=exc.key, hint=exc.hint) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = exc.problem or exc.context or "not YAML"
        if exc.context and problem.startswith("but "):     # "expected a single document ... but found ..."
            problem = f"{exc.context} {problem}"
        problem = _one_line(problem)
        raise SpecError(f"YAML syntax error: {problem}", file=file, line=line,
                        hint="check indentation and the ':' after each key") from None
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        raise SpecError(f"character U+{exc.character:04X} is not allowed in YAML", file=file,
                        line=line, hint="remove it") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"YAML error: {_one_line(exc)}", file=file) from None
    finally:
        if loader is not None:
            loader.dispose()
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
