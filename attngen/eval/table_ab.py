"""A dispatch-table change measured before and after, one process per mode: the "before" process reads another
table file in place of the checkout's, and both record the specs the table gave their calls. The runtime keeps a
shape's kernel once resolved, so the modes cannot share a process. Used by the table A/B scripts under docs/."""
from __future__ import annotations


def read_table_from(path: str) -> None:
    """Every Dispatcher made from now on reads the table at `path` (a file such as `git show REV:specs/dispatch/
    table.yaml` wrote), not the checkout's."""
    from ..ops import dispatch
    load = dispatch.load_table
    dispatch.load_table = lambda _path: load(path)


def record_specs() -> list:
    """A list that receives the spec of every table entry a Dispatcher resolves from now on, in call order; clear it
    between cases."""
    from ..ops import dispatch
    seen: list = []
    entry = dispatch.Dispatcher.entry

    def recorded(self, *args, **kwargs):
        found = entry(self, *args, **kwargs)
        seen.append(found.spec)
        return found
    dispatch.Dispatcher.entry = recorded
    return seen
