"""Frozen: an immutable record that is cheap to define, for the classes a process's first call defines.

Defining a frozen dataclass exec-compiles its __init__, __repr__, __eq__, __hash__, __setattr__ and
__delattr__: about a millisecond per class on the GPU host, which a first attngen.attention spends
before it launches anything. The records on that path are typing.NamedTuple (a tenth of the cost),
or, where a record checks its values on construction or a tuple's behaviour would not fit, a
subclass of Frozen (a class statement and nothing more)."""
from __future__ import annotations


class Frozen:
    """A record whose fields are its __slots__, in order, set once by the subclass's __init__ through
    Frozen.__init__: as a frozen dataclass, its fields cannot be assigned or deleted afterwards
    (AttributeError), two records are equal when they are of one class with equal fields, the hash
    is the fields', and the repr names them. It is not a tuple: it neither iterates nor equals one.
    A record class derives from Frozen directly: its __slots__ are all of its fields (a subclass of
    a record would leave its parent's slots out of equality, hash and repr)."""

    __slots__ = ()

    def __init__(self, *values):
        if len(values) != len(self.__slots__):
            raise TypeError(f"{type(self).__name__} takes {len(self.__slots__)} values, got {len(values)}")
        for name, value in zip(self.__slots__, values):
            object.__setattr__(self, name, value)

    def _values(self) -> tuple:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __setattr__(self, name, value):
        raise AttributeError(f"cannot assign to field {name!r} of a {type(self).__name__}")

    def __delattr__(self, name):
        raise AttributeError(f"cannot delete field {name!r} of a {type(self).__name__}")

    def __eq__(self, other):
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self):
        return hash(self._values())

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{type(self).__name__}({shown})"

    def __reduce__(self):
        # copy and pickle rebuild the record through its __init__ (they cannot set its slots)
        return type(self), self._values()


__all__ = ["Frozen"]
