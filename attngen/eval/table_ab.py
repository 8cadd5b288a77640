"""A dispatch-table change measured before and after, one process per mode: the "before" process reads another
table file in place of the checkout's, and both record the specs the table gave their calls. The runtime keeps a
shape's kernel once resolved, so the modes cannot share a process. Used by the table A/B scripts under docs/."""
from __future__ import annotations


def read_table_from(path: str) -> None:
    """Every Dispatcher whose table is not loaded yet reads the table at `path` (a file such as `git show REV:specs/
    dispatch/table.yaml` wrote), not the checkout's: ops.dispatch.DISPATCH, which the entry points use, included, so
    call this before the process's first attngen call (an error says so after it)."""
    from ..ops import dispatch
    if dispatch.DISPATCH._entries is not None:
        raise RuntimeError("read_table_from: the dispatch table is loaded already; call it before the first attngen "
                           "call of the process")
    load = dispatch.load_table
    dispatch.load_table = lambda _path: load(path)


def record_specs() -> list:
    """A list that receives the spec of every table entry a Dispatcher resolves from now on, in call order; clear it
    between cases. A call the runtime answers from a kernel it keeps (the same key or padded shape seen before)
    resolves nothing, so it records nothing."""
    from ..ops import dispatch
    seen: list = []
    entry = dispatch.Dispatcher.entry

    def recorded(self, *args, **kwargs):
        found = entry(self, *args, **kwargs)
        seen.append(found.spec)
        return found
    dispatch.Dispatcher.entry = recorded
    return seen
