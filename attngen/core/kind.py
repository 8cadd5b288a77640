"""What a kernel kind is: the unit of growth. A kind lives in its own package under attngen/kinds/,
its templates in templates/<kind>/, and is registered once in attngen/kinds/__init__.py; nothing
outside it knows its name."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from .calls import FORWARD, Call, call_named


@dataclass(frozen=True, repr=False)
class Kind:
    name: str                           # e.g. fwd_mma; printed, never compared outside the kind
    title: str                          # one line for explain and headers
    selector: tuple[str, str]           # (spec key, value) that picks this kind, e.g. ("mma", "mma_m16n8k16")
    spec_model: type                    # its pydantic model (a core.spec_keys.SpecBase subclass)
    plan: Callable                      # (spec, file) -> its plan
    explain: Callable                   # plan -> lines of its explain section
    space: Optional[Callable] = None    # base spec -> the SearchSpace `attngen sweep` explores (core.search_space)
    calls: str = FORWARD.name           # its kernels' call convention, by its name in core.calls.CALLS
    templates: Optional[str] = None     # its folder under templates/ (default: its name); shared ones: templates/lib
    by_dtype: tuple[tuple[str, "Kind"], ...] = ()   # (dtype, this kind on it) where an element type brings its own
                                        # spec model, plan and call convention (e4m3: FlashAttention-3's Is_FP8);
                                        # each shares this kind's name, selector and templates

    def __post_init__(self):
        call_named(self.calls)          # a convention the list has, or a ValueError naming those it has

    @property
    def convention(self) -> Call:
        """Its call convention: what serves it in every layer (core.calls)."""
        return call_named(self.calls)

    @property
    def template_folder(self) -> str:
        return self.templates or self.name

    def on_dtype(self, dtype) -> "Kind":
        """This kind as a spec of `dtype` gets it: the form declared for that dtype, else itself."""
        return dict(self.by_dtype).get(dtype, self) if isinstance(dtype, str) else self

    @property
    def forms(self) -> tuple["Kind", ...]:
        """This kind on every dtype it serves: itself, then each by_dtype form."""
        return (self,) + tuple(form for _, form in self.by_dtype)

    def __repr__(self) -> str:
        return f"<kind {self.name}>"

    @property
    def select_key(self) -> str:
        return self.selector[0]

    @property
    def select_value(self) -> str:
        return self.selector[1]
