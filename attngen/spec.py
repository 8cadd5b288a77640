"""Specs: YAML text -> the spec model of its kind, validated; and back to plain data / YAML.

The shared keys and rules live in attngen/core/spec_keys.py, each kind's own in attngen/kinds/<kind>/;
the registry picks the kind from the key the kinds declare (mma today).
"""
from __future__ import annotations

from pathlib import Path
from typing import Union

import yaml
from pydantic import TypeAdapter

from .core.spec_keys import (SCHEMA_VERSION, ForwardSpec, HomogeneousWarps, PadSwizzle, SharedMemory, Softmax,
                        SpecBase, SpecializedWarps, Tile, XorSwizzle, validate)
from .core.spec_cells import BASE_KEY, CELLS_KEY, DTYPES_KEY, SpecCell, cell_at, cell_error
from .core.specio import line_of, load_yaml, read_spec_text
from .errors import SpecError
from .kinds import all_kinds, kind_for_data, spec_models

# Any kind's spec: a SpecBase subclass (isinstance checks use this).
Spec = SpecBase

__all__ = ["SCHEMA_VERSION", "ForwardSpec", "HomogeneousWarps", "PadSwizzle", "SharedMemory", "Softmax", "Spec",
           "SpecializedWarps", "Tile", "XorSwizzle", "json_schema", "load_spec", "parse_cell", "parse_spec", "read_spec_text",
           "spec_dict", "spec_yaml"]


def parse_spec(text: str, file: str = "<spec>") -> Spec:
    """Parse and validate spec YAML text; raise SpecError naming file, line and key."""
    data, node = load_yaml(text, file)
    family = next((k for k in (DTYPES_KEY, CELLS_KEY, BASE_KEY) if k in data), None)
    if family is not None:
        what = "dtype" if family == DTYPES_KEY else "member"
        raise SpecError(f"lists a spec per {what}; this reads one spec", file=file, line=line_of(node, (family,)),
                        key=family, hint="load the file (load_spec), or one of its cells (parse_cell)")
    kind = kind_for_data(data, file=file, line_of=lambda path: line_of(node, path))
    try:
        return validate(kind.spec_model, data, node, file)
    except SpecError as exc:
        if exc.key in RENAMED_KEYS and _holds(data, exc.key):
            raise renamed_key(exc) from None
        if exc.key in data and exc.key not in kind.spec_model.model_fields:
            raise other_kinds_key(exc, kind) from None
        raise


# Keys attngen once read under another name, by their old dotted path: a spec written for an
# older attngen is told the key's name now instead of "check the spelling". Only names that were
# renamed or moved belong here (git log -S on the spec models finds them); a key whose meaning
# went away is an unknown key like any other.
RENAMED_KEYS = {
    # 291ba05: "split" names decode's split-KV alone; the Hopper kind's flag became separate_kv_barriers.
    "schedule.split_kv": ("schedule.separate_kv_barriers",
                          "K and V of a stage on separate mbarriers; split-KV decoding is `decode: split_kv`"),
    # A decode spec's page_size (16 or 256) became `paged: true`: one kernel reads pages of any size from
    # 1 to 512 keys, given at run time; `page_size: ~` is `paged: false`.
    "page_size": ("paged", "true: paged caches of any page size, chosen per call; false: contiguous caches only"),
}


def _holds(data, dotted: str) -> bool:
    """The YAML data has a key at this dotted path."""
    for part in dotted.split("."):
        if not isinstance(data, dict) or part not in data:
            return False
        data = data[part]
    return True


def renamed_key(exc: SpecError) -> SpecError:
    """A key refused as unknown that an older attngen read: say its name now."""
    new, what = RENAMED_KEYS[exc.key]
    return SpecError(f"is now {new} ({what}); rename it", file=exc.file, line=exc.line, key=exc.key)


def other_kinds_key(exc: SpecError, kind) -> SpecError:
    """An unknown top-level key that another kind takes: say which (the registry knows), rather than
    "check the spelling"."""
    takers = [k for k in all_kinds() if exc.key in k.spec_model.model_fields]
    if not takers:
        return exc
    choices = " or ".join(f"{k.select_key}: {k.select_value}" for k in takers)
    return SpecError(f"is a key of specs with {choices}; this spec's {kind.select_key}: {kind.select_value} takes "
                     f"no {exc.key} (remove it, or change {kind.select_key})", file=exc.file, line=exc.line,
                     key=exc.key)


def load_spec(path: str | Path) -> Spec:
    """Load the spec a path names (a file's first cell, or another dtype's cell by its path: see
    attngen.core.spec_cells); any problem becomes one SpecError."""
    cell = cell_at(path)
    return parse_cell(cell, str(cell.file))


def parse_cell(cell: SpecCell, file: str) -> Spec:
    """Parse and validate one cell of a spec file; an error names the file's line (`file` names it)."""
    try:
        return parse_spec(cell.text, file=file)
    except SpecError as exc:
        raise cell_error(exc, cell) from None


def spec_dict(spec: Spec) -> dict:
    """A spec as plain data, keys in the order of the spec files (the model's field order); unset
    optional keys are left out, as a spec file leaves them out."""
    return spec.model_dump(by_alias=True, mode="json", exclude_none=True)


def spec_yaml(data: dict) -> str:
    """spec_dict() as YAML that parse_spec reads back to the same spec."""
    return yaml.safe_dump(data, sort_keys=False, width=200)


def json_schema() -> dict:
    """The JSON schema of a spec file: one alternative per kind."""
    models = spec_models()
    schema = TypeAdapter(Union[models] if len(models) > 1 else models[0]).json_schema(by_alias=True)
    for model in schema.get("$defs", {}).values():
        with_dtypes(model)
    schema["title"] = "attngen spec"
    return schema


def with_dtypes(model: dict) -> None:
    """A spec file's `dtypes` beside its model's `dtype` (the file, not the model, reads it: one spec per
    dtype, attngen.core.spec_cells), so an editor validating against the schema takes either, not both."""
    dtype = model.get("properties", {}).get("dtype")
    if dtype is None:
        return
    item = {k: v for k, v in dtype.items() if k in ("enum", "const", "type")}
    model["properties"][DTYPES_KEY] = {"type": "array", "items": item, "minItems": 1, "uniqueItems": True,
                                       "description": "one spec per element type, the first named as `name`, "
                                                      "each other `<name>_<dtype>`; instead of dtype"}
    model["not"] = {"required": ["dtype", DTYPES_KEY]}
    model["properties"][CELLS_KEY] = {
        "type": "object", "additionalProperties": {"type": "object"},
        "description": "a family's members: each a cell named `<name>_<member>` (and per dtype), its keys "
                       "replacing the file's (null leaves one out)"}
    model["properties"][BASE_KEY] = {"type": "boolean", "default": True,
                                     "description": "false: the file's own spec is no cell, only its cells are"}
