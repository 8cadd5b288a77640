"""Search spaces, kind-agnostic: a space is a list of axes, each a spec field (or a few fields that
move together) and the values it may take. A kind builds the space around a base spec from its own
axes (`Kind.space`); the sweep only enumerates, names and applies points (`Choice`)."""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable


@dataclass(frozen=True)
class Axis:
    """One dimension of a space."""

    name: str                               # column header, JSON key and Choice attribute
    values: tuple                           # hashable, in search order (neighbours are adjacent values)
    read: Callable[[Any], Any]              # spec -> the value it sits at
    write: Callable[[dict, Any], None]      # writes a value into a spec's dict form
    tag: Callable[[Any], str]               # a short token of [a-z0-9] for candidate names
    show: Callable[[Any], str] = str        # the value in tables and JSON


@dataclass(frozen=True)
class Choice:
    """One point of a space: a value per axis, and its tag (the axes' tokens joined), which names
    the candidate. Axis values read as attributes: choice.block_n."""

    fields: tuple[tuple[str, Any], ...]
    tag: str

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        for key, value in object.__getattribute__(self, "fields"):
            if key == name:
                return value
        raise AttributeError(f"no axis {name!r} in this choice")

    def values(self) -> dict:
        return dict(self.fields)


def _set(data: dict, path: str, value) -> None:
    """data[a][b] = value for path 'a.b', creating the inner dict."""
    *outer, last = path.split(".")
    for key in outer:
        data = data.setdefault(key, {})
    data[last] = value


def field_axis(name: str, path: str, values: Iterable, read: Callable, tag: Callable,
               show: Callable = str) -> Axis:
    """An axis over one spec key (dotted path)."""
    return Axis(name, tuple(values), read, lambda data, v: _set(data, path, v), tag, show)


def with_base(defaults: Iterable, base_value) -> tuple:
    """The default values plus the base's own, sorted."""
    return tuple(sorted(set(defaults) | {base_value}))


@dataclass(frozen=True)
class SearchSpace:
    """The values each axis may take; everything else comes from the base spec."""

    axes: tuple[Axis, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.axes)

    def axis(self, name: str) -> Axis:
        for a in self.axes:
            if a.name == name:
                return a
        raise KeyError(name)

    def __getattr__(self, name: str):   # space.block_n: that axis's values
        if name.startswith("__") or name == "axes":
            raise AttributeError(name)
        try:
            return self.axis(name).values
        except KeyError:
            raise AttributeError(f"no axis {name!r} in this space") from None

    @property
    def size(self) -> int:
        return math.prod(len(a.values) for a in self.axes)

    def choice(self, *values, **named) -> Choice:
        """The point with these values (positional in axis order, or by name)."""
        if values:
            named = {**dict(zip(self.names, values)), **named}
        missing = [n for n in self.names if n not in named]
        if missing:
            raise KeyError(f"no value for axes {missing}")
        vals = tuple(named[n] for n in self.names)
        return Choice(tuple(zip(self.names, vals)), "".join(a.tag(v) for a, v in zip(self.axes, vals)))

    def choices(self) -> Iterable[Choice]:
        """Every point, in a fixed order (the axes' values in the order given)."""
        for values in itertools.product(*(a.values for a in self.axes)):
            yield self.choice(*values)

    def choice_of(self, spec) -> Choice:
        """The point a spec sits at."""
        return self.choice(*(a.read(spec) for a in self.axes))

    def neighbours(self, choice: Choice) -> list[Choice]:
        """Points that differ from `choice` in one axis, by one step in that axis's value list."""
        out, at = [], choice.values()
        for a in self.axes:
            i = a.values.index(at[a.name])
            for j in (i - 1, i + 1):
                if 0 <= j < len(a.values):
                    out.append(self.choice(**{**at, a.name: a.values[j]}))
        return out

    def apply(self, data: dict, choice: Choice) -> None:
        """Write every axis's value of `choice` into a spec's dict form."""
        for a in self.axes:
            a.write(data, getattr(choice, a.name))

    def shown(self, choice: Choice) -> dict[str, str]:
        return {a.name: a.show(getattr(choice, a.name)) for a in self.axes}

    def as_dict(self) -> dict:
        return {a.name: [a.show(v) for v in a.values] for a in self.axes}
