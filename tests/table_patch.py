"""GPU tests' view of the dispatch table without some of its entries: a cell with a forward and no
backward, now that the committed table has a backward at every forward head dim. Needs torch (it
patches attngen.ops.library's caches)."""
from __future__ import annotations

import sys


def without_backward(monkeypatch, head_dim: int, calls=("backward", "varlen_backward")) -> None:
    """The table as the ops see it for the rest of the test: no entries of `calls` at `head_dim` (the
    kernels they had resolved forgotten). The SDPA integration's misses start empty and are dropped
    after the test, so a refusal seen under the patched table does not outlive it (a later call of
    the same shape would otherwise go to torch's kernel without asking the table)."""
    from attngen.ops import library
    from attngen.ops.dispatch import DISPATCH
    kept = tuple(e for e in DISPATCH.entries if not (e.call in calls and e.head_dim == head_dim))
    monkeypatch.setattr(DISPATCH, "_entries", kept)
    monkeypatch.setattr(DISPATCH, "_resolved", {})
    monkeypatch.setattr(DISPATCH, "_padded", {})
    monkeypatch.setattr(library, "_BACKWARD", {})
    sdpa = sys.modules.get("attngen.integrations.sdpa")
    if sdpa is not None:
        monkeypatch.setattr(sdpa, "_MISSES", {})
