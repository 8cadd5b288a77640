"""The kind registry: every kernel kind attngen generates, registered once here.

A spec picks its kind by a (key, value) pair the kind declares (e.g. mma: mma_m16n8k16). Nothing
outside attngen/kinds/ knows the names; the rest of attngen asks this registry.

A kind's module is imported when a spec selects it, not when the registry is: importing every kind
(and building its spec model) cost a process's first call tens of milliseconds for kinds it never
runs. REGISTERED repeats each kind's selector so a spec can be matched before its module loads; a
module whose KIND declares another name or selector is refused when it loads.

An element type that needs its own spec model, plan and call convention (e4m3) is a form of its kind
(Kind.by_dtype), not a kind: the selector picks the kind, the spec's dtype the form.
"""
from __future__ import annotations

import importlib
import sys

from ..core.kind import Kind
from ..errors import SpecError

# (package under attngen/kinds/, the (spec key, value) that selects it), in the registry's order:
# messages list choices in it, and the schema's alternatives follow it.
REGISTERED: tuple[tuple[str, tuple[str, str]], ...] = (
    ("fwd_scalar", ("mma", "scalar")),
    ("fwd_wmma", ("mma", "wmma_m16n16k16")),
    ("fwd_mma", ("mma", "mma_m16n8k16")),
    ("fwd_wgmma", ("mma", "wgmma_m64nNk16")),
    ("decode_mma", ("decode", "split_kv")),
    ("decode_mla", ("decode", "latent_split_kv")),
    ("bwd_mma", ("backward", "dq_atomic")),
    ("bwd_wgmma", ("backward", "wgmma_dq_red")),
    ("merge_lse", ("merge", "by_lse")),
)

# Selectors of kinds that became a dtype of another: a spec still naming one is told what to write
# instead of being offered the list of kinds. (old selector) -> (the kind's selector value, dtype)
FOLDED: dict[tuple[str, str], tuple[str, str]] = {
    ("mma", "mma_m16n8k32_e4m3"): ("mma_m16n8k16", "e4m3"),
    ("mma", "wgmma_m64nNk32_e4m3"): ("wgmma_m64nNk16", "e4m3"),
}


def _check_registry(registered) -> None:
    """No two kinds share a name or a selector; `registered`: (name, selector) pairs."""
    names = [name for name, _ in registered]
    selectors = [selector for _, selector in registered]
    assert len(set(names)) == len(names), f"two kinds share a name: {names}"
    assert len(set(selectors)) == len(selectors), f"two kinds share a selector: {selectors}"


_check_registry(REGISTERED)


def _checked(kind: Kind, name: str, selector: tuple[str, str]) -> Kind:
    """A loaded kind, refused when its module declares another name or selector than REGISTERED."""
    assert (kind.name, kind.selector) == (name, selector), \
        f"attngen.kinds.{name} declares {kind.name} {kind.selector}; REGISTERED says {name} {selector}"
    return kind


def _load(index: int) -> Kind:
    """The kind REGISTERED[index] names, importing its module (once per process)."""
    name, selector = REGISTERED[index]
    return _checked(importlib.import_module(f"{__name__}.{name}").KIND, name, selector)


def all_kinds() -> tuple[Kind, ...]:
    """Every registered kind, each module imported (the schema, the architecture checks, a message
    naming another kind's key). Kept as KINDS; a test may replace KINDS to register one more."""
    kinds = globals().get("KINDS")
    if kinds is None:
        from . import bwd_mma, bwd_wgmma, decode_mla, decode_mma, fwd_mma, fwd_scalar, fwd_wgmma, fwd_wmma, merge_lse
        modules = (fwd_scalar, fwd_wmma, fwd_mma, fwd_wgmma, decode_mma, decode_mla, bwd_mma, bwd_wgmma, merge_lse)
        kinds = tuple(_checked(m.KIND, name, selector) for m, (name, selector) in zip(modules, REGISTERED, strict=True))
        _check_registry([(k.name, k.selector) for k in kinds])
        globals()["KINDS"] = kinds
    return kinds


def __getattr__(name: str):
    # KINDS loads every kind, so it is made on first use rather than at import.
    if name == "KINDS":
        return all_kinds()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _selectors() -> tuple[tuple[str, str], ...]:
    """Every kind's selector in registry order, without importing a kind that is not loaded yet."""
    kinds = globals().get("KINDS")
    return tuple(k.selector for k in kinds) if kinds is not None else tuple(s for _, s in REGISTERED)


def _kind_at(index: int) -> Kind:
    kinds = globals().get("KINDS")
    return kinds[index] if kinds is not None else _load(index)


def _loaded_kinds() -> tuple[Kind, ...]:
    """The kinds whose modules are imported already (every kind once KINDS is made)."""
    kinds = globals().get("KINDS")
    if kinds is not None:
        return kinds
    modules = (sys.modules.get(f"{__name__}.{name}") for name, _ in REGISTERED)
    return tuple(m.KIND for m in modules if m is not None and hasattr(m, "KIND"))


def selector_keys() -> tuple[str, ...]:
    """The keys that pick a kind, the most specific first: a key fewer kinds share (e.g. decode)
    decides before one many share (mma), so a spec may carry both."""
    selectors = _selectors()
    keys = list(dict.fromkeys(key for key, _ in selectors))
    return tuple(sorted(keys, key=lambda key: sum(k == key for k, _ in selectors)))


def kind_for_data(data: dict, *, file: str | None = None, line_of=None) -> Kind:
    """The kind a spec's YAML data asks for, in the form of its dtype; a SpecError naming the key when
    none matches."""
    selectors = _selectors()
    for key in selector_keys():
        if key not in data:
            continue
        value = data[key]
        for index, selector in enumerate(selectors):
            if selector == (key, value):
                return _kind_at(index).on_dtype(data.get("dtype"))
        if isinstance(value, str) and (key, value) in FOLDED:
            raise folded_selector(key, value, file=file, line=line_of((key,)) if line_of else None)
        choices = [repr(v) for k, v in selectors if k == key]
        listed = ", ".join(choices[:-1]) + f" or {choices[-1]}" if len(choices) > 1 else choices[0]
        raise SpecError(f"must be {listed} (got {value!r}): each picks a kernel kind", file=file,
                        line=line_of((key,)) if line_of else None, key=key)
    first, *others = dict.fromkeys(key for key, _ in selectors)
    raise SpecError("required key is missing", file=file, line=line_of(()) if line_of else None, key=first,
                    hint=(f"it picks the kernel kind; {' or '.join(others)} picks the others" if others else None))


def folded_selector(key: str, value: str, *, file, line) -> SpecError:
    """A spec naming a kind that is now a dtype of another: what to write instead."""
    now, dtype = FOLDED[(key, value)]
    return SpecError(f"{value} is now dtype {dtype} of {now}: write {key}: {now} and dtype: {dtype}", file=file,
                     line=line, key=key)


def kind_of(spec) -> Kind:
    """The kind (in the form of its dtype) whose spec model `spec` is (a spec model can exist before
    its kind's module loads: some live in core, so every kind is loaded before the answer is no)."""
    for kinds in (_loaded_kinds, all_kinds):
        for k in kinds():
            for form in k.forms:
                if type(spec) is form.spec_model:
                    return form
    raise TypeError(f"{type(spec).__name__} is not the spec model of a registered kind")


def spec_models() -> tuple[type, ...]:
    """Every spec model, of each kind's every dtype form."""
    return tuple(form.spec_model for k in all_kinds() for form in k.forms)
