"""Kernel-function keys: a bundle's functions are keyed by the mask they run, or by the mask plus a
suffix for another function of that mask (its varlen function, a decode split function
that merges the splits). The suffix is also the end of the function's name."""
from __future__ import annotations

from typing import NamedTuple


class KeySuffix(NamedTuple):
    # A NamedTuple, not a frozen dataclass: a first call defines this class (core.frozen says why).
    suffix: str

    def key(self, mask: str) -> str:
        """The function key of `mask`'s function of this family."""
        return mask + self.suffix

    def has(self, key: str) -> bool:
        return key.endswith(self.suffix)

    def mask(self, key: str) -> str:
        """The mask a key of this family runs (a key of another family comes back as it is)."""
        return key[:-len(self.suffix)] if self.has(key) else key


__all__ = ["KeySuffix"]
