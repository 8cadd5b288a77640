"""The kind registry: every kernel kind attngen generates, registered once here.

A spec picks its kind by a (key, value) pair the kind declares (e.g. mma: mma_m16n8k16). Nothing
outside attngen/kinds/ knows the names; the rest of attngen asks this registry.
"""
from __future__ import annotations

from ..core.kind import Kind
from ..errors import SpecError
from . import bwd_mma, bwd_wgmma, decode_mma, fwd_mma, fwd_mma_fp8, fwd_scalar, fwd_wgmma, fwd_wgmma_fp8, fwd_wmma

KINDS: tuple[Kind, ...] = (fwd_scalar.KIND, fwd_wmma.KIND, fwd_mma.KIND, fwd_mma_fp8.KIND, fwd_wgmma.KIND,
                          fwd_wgmma_fp8.KIND, decode_mma.KIND, bwd_mma.KIND, bwd_wgmma.KIND)


def _check_registry(kinds: tuple[Kind, ...]) -> None:
    names = [k.name for k in kinds]
    selectors = [k.selector for k in kinds]
    assert len(set(names)) == len(names), f"two kinds share a name: {names}"
    assert len(set(selectors)) == len(selectors), f"two kinds share a selector: {selectors}"


_check_registry(KINDS)


def selector_keys() -> tuple[str, ...]:
    """The keys that pick a kind, the most specific first: a key fewer kinds share (e.g. decode)
    decides before one many share (mma), so a spec may carry both."""
    keys = list(dict.fromkeys(k.select_key for k in KINDS))
    return tuple(sorted(keys, key=lambda key: sum(k.select_key == key for k in KINDS)))


def kind_for_data(data: dict, *, file: str | None = None, line_of=None) -> Kind:
    """The kind a spec's YAML data asks for; a SpecError naming the key when none matches."""
    for key in selector_keys():
        if key not in data:
            continue
        value = data[key]
        for k in KINDS:
            if k.selector == (key, value):
                return k
        choices = [repr(k.select_value) for k in KINDS if k.select_key == key]
        listed = ", ".join(choices[:-1]) + f" or {choices[-1]}" if len(choices) > 1 else choices[0]
        raise SpecError(f"must be {listed} (got {value!r}): each picks a kernel kind", file=file,
                        line=line_of((key,)) if line_of else None, key=key)
    first, *others = dict.fromkeys(k.select_key for k in KINDS)
    raise SpecError("required key is missing", file=file, line=line_of(()) if line_of else None, key=first,
                    hint=(f"it picks the kernel kind; {' or '.join(others)} picks the others" if others else None))


def kind_of(spec) -> Kind:
    """The kind whose spec model `spec` is."""
    for k in KINDS:
        if type(spec) is k.spec_model:
            return k
    raise TypeError(f"{type(spec).__name__} is not the spec model of a registered kind")


def spec_models() -> tuple[type, ...]:
    return tuple(k.spec_model for k in KINDS)
