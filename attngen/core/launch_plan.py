"""What the runtime reads of a plan to load and call its kernels, kept as a launch record: JSON that
`attngen build` writes beside a served spec's generated files (generated/<name>.launch.json), so the
dispatcher's first call loads a kernel without parsing the spec or building the plan (the planner,
pydantic and the YAML loader stay unimported).

A record names its mask variants and score modifiers by their names in core.variants' registries;
a plan whose variants are not all registry entries (an expression spec's) has no record and loads
as before. A record is JSON, never code: reading one runs nothing. Where records sit and how one
is proved current: attngen.shipped (committed_launch).

This module is one of the planner's inputs (core/), so changing what a record holds changes the
render inputs MANIFEST.json records: every committed record is then stale until rebuilt."""
from __future__ import annotations

import json
from typing import NamedTuple

from ..targets import TARGETS, Target
from .abi import Abi, AbiField
from .launch_rules import compile_arch, dq_convert, forward_grid, merges_in_kernel, query_block_grid, split_key
from .tensor_maps import TensorMapSpec
from .variants import MASKS, SCORES
from .varlen_plan import backward_mask_of

RECORD_FORMAT = 1
ABI_KEYS = ("name", "ctype", "size", "align", "pack", "meaning", "default", "array")
MAP_KEYS = ("tensor", "box_rows", "box_cols", "swizzle", "store", "transposed", "row_stride")
MAP_DEFAULTS = {"row_stride": 1}   # written only where a map sets it, so older records read the same


def map_record(m: TensorMapSpec) -> list:
    """A tensor map as the record lists it: MAP_KEYS' values, the trailing ones left out where they hold
    their defaults (MAP_DEFAULTS)."""
    values = [getattr(m, k) for k in MAP_KEYS]
    while len(values) > 1 and MAP_DEFAULTS.get(MAP_KEYS[len(values) - 1], object()) == values[-1]:
        values.pop()
    return values


class LaunchSpec(NamedTuple):
    """The spec's words a call reads: its name and element types."""

    # A NamedTuple, not a frozen dataclass: a first call defines this class (core.frozen says why).
    name: str
    dtype: str
    out_dtype: str


class LaunchKind(NamedTuple):
    """The kind's words a call reads: its name and call convention (core.calls)."""

    # A NamedTuple, not a frozen dataclass: a first call defines this class (core.frozen says why).
    name: str
    calls: str


class LaunchPart(NamedTuple):
    """One generated file of the bundle, as the runtime loads it."""

    # A NamedTuple, not a frozen dataclass: a first call defines this class (core.frozen says why).
    name: str
    file_name: str
    functions: tuple[tuple[str, str], ...]   # (function key, extern "C" function name)
    threads: int | None = None               # threads per block of its kernels; None: the plan's
    awaits_predecessor: bool = False         # launched as a programmatic dependent (core.forward_plan.Part)
    awaiting_twins: tuple[tuple[str, str], ...] = ()   # (function key, name): core.forward_plan.Part's


class LaunchPlan(NamedTuple):
    """A plan as the runtime reads it: the same names and answers as the full plan (a Kernel takes
    either), and nothing the templates alone need."""

    # A NamedTuple, not a frozen dataclass: a first call defines this class (core.frozen says why).
    spec: LaunchSpec
    kind: LaunchKind
    target: Target
    masks: tuple[str, ...]
    mask_variants: tuple
    score_variants: tuple
    parts: tuple[LaunchPart, ...]
    abi: Abi
    head_dim: int
    head_dim_v: int
    block_m: int
    block_n: int
    threads: int
    smem_bytes: int
    smem_dynamic: bool
    arch_suffix: str
    persistent: bool
    tensor_maps: tuple[TensorMapSpec, ...]
    max_splits: int = 1             # decode: most key slices per (KV head, batch)
    paged: bool = False             # decode: reads paged caches (any page size, a kernel parameter); forward: its
                                    # varlen functions also read page pools through a block table
    combine: str = "kernel"         # decode: how the splits merge (core.decode_plan.DecodePlan.combine)
    unsplit_in_flight: int = 0      # decode: the split heuristic's bytes in flight per block
    slice_cost_min_tiles: int = 0   # decode: tiles from which a combine-kernel call takes the slice-cost count
    co_resident_blocks: int = 1     # decode: blocks per SM the split rule counts on large grids and caches
    co_resident_min_tiles: int = 0  # decode: the tiles from which a merging cell counts them (0: the rule's own)
    kv_dtype: str = ""              # decode: the caches' element type where it is not the queries' ("e4m3")
    append: bool = False            # decode: the kernel writes a call's new tokens into the cache (append cells)
    v_in_k: bool = False            # decode: V is the first v_dim columns of each K row (one latent cache)
    step_rows: bool = False         # decode: rows functions of a serving step's decode rows (DecodePlan.step_rows)
    combine_slices: int = 1         # decode: warps sharing an output row's columns in the combine (its grid y)
    combine_wide_slices: int = 0    # decode: the same for the wide combine function (0: none)
    accum_row_block: int = 1        # backward: rows of the dQ accumulator's blocks
    dq_pair_masks: tuple[str, ...] = ()   # backward: the masks whose functions add dQ in register-pair order

    @property
    def v_dim(self) -> int:
        return self.head_dim_v or self.head_dim

    @property
    def functions(self) -> tuple[tuple[str, str], ...]:
        return tuple(f for part in self.parts for f in part.functions)

    @property
    def entry_functions(self) -> dict[str, str]:
        return dict(self.parts[0].functions)

    @property
    def awaiting_entry_functions(self) -> dict[str, str]:
        return dict(self.parts[0].awaiting_twins)

    @property
    def combine_part(self):
        return self.parts[1] if len(self.parts) > 1 else None

    def compile_arch(self, arch: str) -> str:
        return compile_arch(self.spec.name, self.target.arch, self.arch_suffix, arch)

    def grid(self, batch: int, heads: int, seqlen_q: int, sm_count: int | None = None) -> tuple[int, int, int]:
        return forward_grid(self.block_m, self.persistent, self.target.sm_count, batch, heads, seqlen_q, sm_count)

    def varlen_grid(self, batch: int, heads: int, max_seqlen_q: int) -> tuple[int, int, int]:
        return query_block_grid(self.block_m, batch, heads, max_seqlen_q)

    def split_key(self, mask: str, splits: int, step_rows: bool = False) -> str:
        return split_key(self.combine, mask, splits, step_rows)

    def merges_in_kernel(self, splits: int) -> bool:
        return merges_in_kernel(self.combine, splits)

    def dq_convert(self, key: str) -> str:
        return dq_convert(backward_mask_of(key), self.dq_pair_masks)

    @classmethod
    def from_record(cls, record: dict) -> "LaunchPlan":
        """The plan a record describes; ValueError (or KeyError, TypeError) for one that is not a
        record of this format."""
        if record.get("format") != RECORD_FORMAT:
            raise ValueError(f"not a launch record of format {RECORD_FORMAT}")
        abi = record["abi"]
        return cls(
            spec=LaunchSpec(**record["spec"]), kind=LaunchKind(**record["kind"]), target=TARGETS[record["target"]],
            masks=tuple(record["masks"]), mask_variants=tuple(MASKS[m] for m in record["mask_variants"]),
            score_variants=tuple(SCORES[s] for s in record["score_variants"]),
            parts=tuple(LaunchPart(p["name"], p["file_name"], tuple(tuple(f) for f in p["functions"]), p["threads"],
                                   p.get("awaits_predecessor", False),
                                   tuple(tuple(f) for f in p.get("awaiting_twins", ()))) for p in record["parts"]),
            abi=Abi(abi["name"], tuple(AbiField(**dict(zip(ABI_KEYS, f))) for f in abi["fields"]),
                    frozenset(abi["omitted"])),
            tensor_maps=tuple(TensorMapSpec(**dict(zip(MAP_KEYS, m))) for m in record["tensor_maps"]),
            **{name: record[name] for name in NUMBERS}, **record.get("kv_cache", {}), **record.get("pages", {}),
            **_dq_accumulator(record.get("dq_accumulator", {})))


def _dq_accumulator(entry: dict) -> dict:
    """A record's dq_accumulator entry as LaunchPlan fields (the pair masks a tuple)."""
    return {**entry, **({"dq_pair_masks": tuple(entry["dq_pair_masks"])} if "dq_pair_masks" in entry else {})}


NUMBERS = ("head_dim", "head_dim_v", "block_m", "block_n", "threads", "smem_bytes", "smem_dynamic", "arch_suffix",
           "persistent")
DECODE_NUMBERS = ("max_splits", "paged", "combine", "unsplit_in_flight", "slice_cost_min_tiles", "co_resident_blocks",
                  "co_resident_min_tiles", "kv_dtype", "append")


def has_launch_record(plan) -> bool:
    """Every variant of the plan is a registry entry (a record names them); an expression spec's
    score modifier is built from its expressions and has none."""
    return (getattr(plan, "expression", None) is None
            and all(MASKS.get(m.name) is m for m in plan.mask_variants)
            and all(SCORES.get(s.name) is s for s in plan.score_variants))


def launch_record(plan) -> dict:
    """The record of a plan (has_launch_record(plan) must hold): plain JSON values, in a fixed order."""
    if not has_launch_record(plan):
        raise ValueError(f"{plan.spec.name} has variants no registry names; it has no launch record")
    record = {
        "format": RECORD_FORMAT,
        "spec": {"name": plan.spec.name, "dtype": plan.spec.dtype, "out_dtype": plan.spec.out_dtype},
        "kind": {"name": plan.kind.name, "calls": plan.kind.calls},
        "target": plan.target.name,
        "masks": list(plan.masks),
        "mask_variants": [m.name for m in plan.mask_variants],
        "score_variants": [s.name for s in plan.score_variants],
        "parts": [{"name": p.name, "file_name": p.file_name, "functions": [list(f) for f in p.functions],
                   "threads": p.threads, **({"awaits_predecessor": True} if p.awaits_predecessor else {}),
                   **({"awaiting_twins": [list(f) for f in p.awaiting_twins]} if p.awaiting_twins else {})}
                  for p in plan.parts],
        "abi": {"name": plan.abi.name, "fields": [[getattr(f, k) for k in ABI_KEYS] for f in plan.abi.fields],
                "omitted": sorted(plan.abi.omitted)},
        "tensor_maps": [map_record(m) for m in plan.tensor_maps],
        **{name: getattr(plan, name) for name in NUMBERS},
    }
    if hasattr(plan, "max_splits"):
        record["kv_cache"] = {name: getattr(plan, name) for name in DECODE_NUMBERS}
        if plan.v_in_k:     # recorded where it holds only: every other decode record stays as it was
            record["kv_cache"]["v_in_k"] = True
        if plan.step_rows:
            record["kv_cache"]["step_rows"] = True
        if plan.combine_slices > 1:
            record["kv_cache"]["combine_slices"] = plan.combine_slices
        if plan.combine_wide_slices:
            record["kv_cache"]["combine_wide_slices"] = plan.combine_wide_slices
    elif getattr(plan, "paged", False):
        record["pages"] = {"paged": True}     # a forward plan whose varlen functions read page pools
    accum = getattr(plan, "accum_row_block", None)
    if accum is not None:
        record["dq_accumulator"] = {"accum_row_block": accum}
        if plan.dq_pair_masks:   # recorded where some mask pairs: every other backward record stays as it was
            record["dq_accumulator"]["dq_pair_masks"] = list(plan.dq_pair_masks)
    return record


def record_text(record: dict) -> str:
    """A record as committed: JSON with a line per key and per Params field, so that a review's diff
    names what changed."""
    def value(key, v):
        if key == "abi":
            fields = ",\n  ".join(json.dumps(f) for f in v["fields"])
            return f'{{"name": {json.dumps(v["name"])}, "omitted": {json.dumps(v["omitted"])}, "fields": [\n  {fields}]}}'
        return json.dumps(v)
    return "{\n" + ",\n".join(f" {json.dumps(k)}: {value(k, v)}" for k, v in record.items()) + "\n}\n"


__all__ = ["LaunchKind", "LaunchPart", "LaunchPlan", "LaunchSpec", "RECORD_FORMAT", "has_launch_record",
           "launch_record", "record_text"]
