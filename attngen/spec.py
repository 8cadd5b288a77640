"""The spec: what a user writes in YAML, validated with pydantic.

A spec states choices (tile sizes, warps, fragment, swizzle, pipeline); it never holds a number
that can be derived from other fields: the planner derives those. Cross-field rules that depend
only on the spec live here, so that an invalid spec is refused before anything is planned.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .core.specio import line_of, load_yaml, read_spec_text
from .errors import SpecError
from .targets import TARGETS

SCHEMA_VERSION = 1

Dtype = Literal["fp16", "bf16"]
Mask = Literal["none", "causal"]
Fragment = Literal["scalar", "wmma_m16n16k16", "mma_m16n8k16"]
TENSOR_CORE_FRAGMENTS = ("wmma_m16n16k16", "mma_m16n8k16")


class _Strict(BaseModel):
    # strict: YAML already gives ints, bools and strings; lax coercion would read `stages: true` as 1
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Tile(_Strict):
    """Tile sizes of one thread block."""

    block_m: int = Field(ge=1, le=256, description="query rows per thread block (CTA)")
    block_n: int = Field(ge=1, le=256, description="keys per K/V tile")


class HomogeneousWarps(_Strict):
    """Every warp loads and computes; warps split block_m into equal row slices."""

    compute: int = Field(ge=1, le=16, description="compute warps; each owns block_m / compute rows")


class SpecializedWarps(_Strict):
    """Producer warps only copy K/V tiles into the ring; consumer warps only compute."""

    producer: int = Field(ge=1, le=4, description="warps that only issue global->shared copies")
    consumer: int = Field(ge=1, le=16, description="warps that only compute; each owns block_m / consumer rows")


class PadSwizzle(_Strict):
    """Pad each shared-memory row by pad_bytes (breaks the power-of-two row pitch)."""

    pad_bytes: int = Field(ge=4, le=128, description="bytes added after every row; a multiple of 4 (16 for 16-byte copies)")


class XorSwizzle(_Strict):
    """XOR the 16-byte chunk index within a row with (row >> row_shift) mod 2**bits."""

    xor_bits: int = Field(ge=1, le=4, description="low bits of the 16-byte chunk index that are XORed")
    row_shift: int = Field(default=0, ge=0, le=3, description="rows sharing one XOR pattern = 2**row_shift")


Swizzle = Union[Literal["none"], PadSwizzle, XorSwizzle]


class SharedMemory(_Strict):
    """Shared-memory layout and K/V pipeline."""

    swizzle: Swizzle = Field(default="none", description="none | {pad_bytes: N} | {xor_bits: B, row_shift: S}")
    stages: int = Field(default=1, ge=1, le=8, description="depth of the K/V ring in shared memory")
    async_copy: bool = Field(default=False, description="copy K/V global->shared with cp.async (16 B)")
    q_in_registers: bool = Field(default=False, description="keep Q fragments in registers for the whole kernel")
    opt_in: bool = Field(default=False, description="allow dynamic shared memory above 48 KiB, up to the target's opt-in maximum")


class Softmax(_Strict):
    """Online-softmax choices."""

    rescale: Literal["always", "on_max_change"] = Field(
        default="always",
        description="rescale the running output every tile, or only when a row's max moved (tensor-core families)")


class Spec(_Strict):
    """One attention-forward kernel family instance; every mask variant it lists shares it."""

    schema_: Literal[1] = Field(alias="schema", description="spec schema version")
    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,47}$", description="kernel name; lowercase, digits, _")
    description: str = Field(default="", description="free text, copied into the generated header")
    target: str = Field(default="l4", description="GPU profile: " + ", ".join(TARGETS))
    dtype: Dtype = Field(default="fp16", description="element type of q, k, v and o")
    head_dim: int = Field(ge=8, le=256, description="D, the size of each head")
    masks: list[Mask] = Field(default=["none", "causal"], min_length=1,
                              description="mask variants to emit, one kernel function each")
    tile: Tile
    warps: Union[HomogeneousWarps, SpecializedWarps]
    mma: Fragment = Field(description="scalar | wmma_m16n16k16 | mma_m16n8k16")
    smem: SharedMemory = SharedMemory()
    softmax: Softmax = Softmax()
    min_blocks_per_sm: Optional[int] = Field(
        default=None, ge=1, le=32,
        description="second argument of __launch_bounds__: ptxas caps registers per thread so that this "
                    "many blocks fit on one SM; unset lets ptxas choose (it may trade a small spill for "
                    "occupancy)")

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, populate_by_name=True)

    @field_validator("target")
    @classmethod
    def _known_target(cls, v: str) -> str:
        if v not in TARGETS:
            raise ValueError(f"unknown target {v!r}; choose one of {', '.join(TARGETS)}")
        return v

    @field_validator("masks")
    @classmethod
    def _unique_masks(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"lists a mask twice ({v}); list each variant once")
        return v

    # -- cross-field rules -------------------------------------------------------------------
    @model_validator(mode="after")
    def _rules(self) -> "Spec":
        for rule in _RULES:
            problem = rule(self)
            if problem:
                key, message = problem
                raise _RuleError(key, message)
        return self

    @property
    def compute_warps(self) -> int:
        w = self.warps
        return w.compute if isinstance(w, HomogeneousWarps) else w.consumer

    @property
    def producer_warps(self) -> int:
        w = self.warps
        return w.producer if isinstance(w, SpecializedWarps) else 0

    @property
    def elem_bytes(self) -> int:
        return 2


class _RuleError(ValueError):
    """A cross-field rule failed; carries the key path it is about."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(message)


# Each rule returns None or (key path, message with the fix). Kept as small named functions so
# that tests can name the rule they exercise.

def _rule_head_dim_vector_loads(s: Spec):
    if s.head_dim % 8:
        return "head_dim", f"must be a multiple of 8 for 16-byte loads (got {s.head_dim}); try {_round(s.head_dim, 8)}"


def _rule_head_dim_fragments(s: Spec):
    if s.mma in TENSOR_CORE_FRAGMENTS and s.head_dim % 16:
        return "head_dim", (f"must be a multiple of 16 for {s.mma} fragments (got {s.head_dim}); "
                            f"try {_round(s.head_dim, 16)}")


def _rule_scalar_head_dim(s: Spec):
    if s.mma == "scalar" and s.head_dim % 64:
        return "head_dim", (f"the scalar kernel gives each lane head_dim/32 columns as half2 pairs, so it must be "
                            f"a multiple of 64 (got {s.head_dim}); use a tensor-core fragment for other sizes")


def _rule_block_m_split(s: Spec):
    warps = s.compute_warps
    who = "warps.compute" if s.producer_warps == 0 else "warps.consumer"
    unit = 16 if s.mma in TENSOR_CORE_FRAGMENTS else 1
    if s.tile.block_m % (unit * warps):
        need = unit * warps
        return "tile.block_m", (f"must be a multiple of {'16 x ' if unit > 1 else ''}{who} = {need} so each compute "
                                f"warp owns whole {'16-row fragments' if unit > 1 else 'rows'} (got {s.tile.block_m}); "
                                f"try {_round(s.tile.block_m, need)}")


def _rule_block_n(s: Spec):
    unit = {"scalar": 32, "wmma_m16n16k16": 16, "mma_m16n8k16": 16}[s.mma]
    if s.tile.block_n % unit:
        why = "one key per lane per step" if s.mma == "scalar" else "whole k16 steps of the P.V product"
        return "tile.block_n", (f"must be a multiple of {unit} for {s.mma} ({why}) (got {s.tile.block_n}); "
                                f"try {_round(s.tile.block_n, unit)}")


def _rule_stages_need_async(s: Spec):
    if s.smem.stages > 1 and not s.smem.async_copy:
        return "smem.stages", (f"{s.smem.stages} stages need asynchronous copies to overlap anything; "
                               "set smem.async_copy: true or stages: 1")


def _rule_async_needs_tensor_cores(s: Spec):
    if s.smem.async_copy and s.mma == "scalar":
        return "smem.async_copy", "the scalar kernel loads synchronously; set async_copy: false or use mma_m16n8k16"


def _rule_q_in_registers(s: Spec):
    if s.smem.q_in_registers and s.mma != "mma_m16n8k16":
        return "smem.q_in_registers", f"only the mma_m16n8k16 family keeps Q fragments in registers (mma is {s.mma})"


def _rule_swizzle_family(s: Spec):
    sw = s.smem.swizzle
    if isinstance(sw, XorSwizzle) and s.mma != "mma_m16n8k16":
        return "smem.swizzle", (f"the XOR swizzle is applied by the ldmatrix/cp.async path of mma_m16n8k16 only "
                                f"(mma is {s.mma}); use {{pad_bytes: 16}} or none")
    if isinstance(sw, PadSwizzle) and sw.pad_bytes % 4:
        return "smem.swizzle.pad_bytes", f"must be a multiple of 4 (got {sw.pad_bytes}); try {_round(sw.pad_bytes, 4)}"
    if isinstance(sw, PadSwizzle) and s.mma != "scalar" and sw.pad_bytes % 16:
        return "smem.swizzle.pad_bytes", (f"must be a multiple of 16 to keep 16-byte rows aligned for {s.mma} "
                                          f"(got {sw.pad_bytes}); try {_round(sw.pad_bytes, 16)}")
    if isinstance(sw, XorSwizzle):
        chunks = s.head_dim * 2 // 16
        if (1 << sw.xor_bits) > chunks:
            return "smem.swizzle.xor_bits", (f"2**{sw.xor_bits} exceeds the {chunks} 16-byte chunks of a "
                                             f"{s.head_dim}-element row; use xor_bits <= {chunks.bit_length() - 1}")


def _rule_warp_roles(s: Spec):
    if s.producer_warps and s.mma != "mma_m16n8k16":
        return "warps.producer", f"producer/consumer roles are generated for mma_m16n8k16 only (mma is {s.mma})"
    if s.producer_warps and not s.smem.async_copy:
        return "smem.async_copy", "producer warps issue cp.async copies; set smem.async_copy: true"
    if s.producer_warps and s.smem.stages < 2:
        return "smem.stages", "producer warps fill a ring while consumers compute: use at least 2 stages"


def _rule_threads(s: Spec):
    threads = 32 * (s.compute_warps + s.producer_warps)
    if threads > 1024:
        return "warps", f"{threads} threads per block exceed CUDA's 1024; use fewer warps"


def _rule_rescale(s: Spec):
    if s.softmax.rescale == "on_max_change" and s.mma == "scalar":
        return "softmax.rescale", "the scalar kernel always rescales; use rescale: always"


# class name -> model, to list a mapping's keys when a scalar was given instead
_MODELS = {m.__name__: m for m in (Tile, HomogeneousWarps, SpecializedWarps, PadSwizzle, XorSwizzle,
                                   SharedMemory, Softmax)}

_RULES = [
    _rule_head_dim_vector_loads, _rule_head_dim_fragments, _rule_scalar_head_dim, _rule_block_m_split,
    _rule_block_n, _rule_stages_need_async, _rule_async_needs_tensor_cores, _rule_q_in_registers,
    _rule_swizzle_family, _rule_warp_roles, _rule_threads, _rule_rescale,
]


def _round(x: int, unit: int) -> int:
    return max(unit, (x + unit - 1) // unit * unit)


# -- YAML loading with line numbers ------------------------------------------------------------

_UNION_TAGS = {"HomogeneousWarps", "SpecializedWarps", "PadSwizzle", "XorSwizzle", "literal['none']",
               "function-after[_known_target(), str]"}


def _is_tag(part) -> bool:
    return isinstance(part, str) and (part in _UNION_TAGS or part.startswith(("literal[", "function-", "union[")))


def _clean_loc(loc: tuple) -> tuple:
    """Drop pydantic's union-member tags from an error location: keep the user's key path."""
    return tuple("schema" if p == "schema_" else p for p in loc if not _is_tag(p))


# The forms a union-typed key accepts, for the message when a value fits none of them.
_UNION_FORMS = {
    ("warps",): "{compute: N} or {producer: P, consumer: C}",
    ("smem", "swizzle"): "none, {pad_bytes: N} or {xor_bits: B, row_shift: S}",
}
_KEY_ERRORS = ("missing", "extra_forbidden")
# Among errors at the same depth: an unknown key usually explains the missing one (a typo).
_TYPE_RANK = {"extra_forbidden": 1, "missing": 2, "model_type": 3, "literal_error": 4}


def _pick_error(err: ValidationError) -> dict:
    """Pick the one error to show.

    With unions pydantic reports errors for every member. The member whose keys match the input
    best is the one the user meant, so its errors come first: a member refusing the value's kind
    outright (a mapping for `none`, a scalar for a mapping) matches worst, then each missing or
    unknown key counts one. Then the deepest location; then an unknown key before a missing one.
    """
    errors = err.errors()
    members = [tuple(p for p in e["loc"] if _is_tag(p)) for e in errors]
    mismatch: dict[tuple, int] = {}
    for e, m in zip(errors, members):
        wrong_kind = bool(m) and _is_tag(e["loc"][-1])
        mismatch[m] = mismatch.get(m, 0) + (100 if wrong_kind else e["type"] in _KEY_ERRORS)
    order = sorted(range(len(errors)), key=lambda i: (
        mismatch[members[i]], -len(_clean_loc(errors[i]["loc"])), _TYPE_RANK.get(errors[i]["type"], 0)))
    return errors[order[0]]


def _message(e: dict) -> str:
    msg = e["msg"]
    if e["type"] == "extra_forbidden":
        return "unknown key; check the spelling (see `attngen schema` for the keys a spec takes)"
    if e["type"] == "missing":
        return "required key is missing"
    loc = _clean_loc(e["loc"])
    got = "" if isinstance(e.get("input"), (dict, list)) else f" (got {e.get('input')!r})"
    if loc in _UNION_FORMS and e["type"] in ("model_type", "literal_error"):
        return f"must be {_UNION_FORMS[loc]}{got}"
    if e["type"] == "model_type":
        model = _MODELS.get((e.get("ctx") or {}).get("class_name"))
        keys = f" with keys {', '.join(model.model_fields)}" if model else ""
        return f"must be a mapping{keys}{got}"
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if e["type"] not in ("value_error",) and "input" in e and not isinstance(e["input"], (dict, list)):
        msg += f" (got {e['input']!r})"
    return msg


def parse_spec(text: str, file: str = "<spec>") -> Spec:
    """Parse and validate spec YAML text; raise SpecError naming file, line and key."""
    data, node = load_yaml(text, file)
    try:
        return Spec.model_validate(data)
    except ValidationError as exc:
        e = _pick_error(exc)
        ctx_err = (e.get("ctx") or {}).get("error")
        if isinstance(ctx_err, _RuleError):
            key = ctx_err.key
            path = tuple(int(p) if p.isdigit() else p for p in key.split("."))
            raise SpecError(str(ctx_err), file=file, line=line_of(node, path), key=key) from None
        loc = _clean_loc(e["loc"])
        key = ".".join(str(p) for p in loc) or "(top level)"
        hint = None
        if loc == ("schema",):
            hint = f"this attngen reads schema {SCHEMA_VERSION}; start the file with 'schema: {SCHEMA_VERSION}'"
        raise SpecError(_message(e), file=file, line=line_of(node, loc), key=key, hint=hint) from None


def load_spec(path: str | Path) -> Spec:
    """Load a spec file; any problem becomes one SpecError."""
    return parse_spec(read_spec_text(path), file=str(path))


def spec_dict(spec: Spec) -> dict:
    """A spec as plain data, keys in the order of the spec files (the model's field order); unset
    optional keys are left out, as a spec file leaves them out."""
    return spec.model_dump(by_alias=True, mode="json", exclude_none=True)


def spec_yaml(data: dict) -> str:
    """spec_dict() as YAML that parse_spec reads back to the same spec."""
    return yaml.safe_dump(data, sort_keys=False, width=200)


def json_schema() -> dict:
    return Spec.model_json_schema(by_alias=True)
