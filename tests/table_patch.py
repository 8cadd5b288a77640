"""GPU tests' view of the dispatch table without some of its entries: a cell with a forward and no
backward, now that the committed table has a backward at every forward head dim. Needs torch (it
patches attngen.ops.library's caches)."""
from __future__ import annotations


def without_backward(monkeypatch, head_dim: int, calls=("backward", "varlen_backward")) -> None:
    """The table as the ops see it for the rest of the test: no entries of `calls` at `head_dim` (the
    kernels they had resolved forgotten)."""
    from attngen.ops import library
    from attngen.ops.dispatch import DISPATCH
    kept = tuple(e for e in DISPATCH.entries if not (e.call in calls and e.head_dim == head_dim))
    monkeypatch.setattr(DISPATCH, "_entries", kept)
    monkeypatch.setattr(DISPATCH, "_resolved", {})
    monkeypatch.setattr(library, "_BACKWARD", {})
