"""Spec pieces every kind shares: the strict model base, the common keys, the cross-field rule
mechanism and the translation of validation errors into one SpecError with file, line and key.

A spec states choices; it never holds a number that can be derived from other fields. A kind's
spec model subclasses ForwardSpec (or SpecBase) and lists its rules: small named functions, each
returning None or (key path, message with the fix).
"""
from __future__ import annotations

from typing import Callable, ClassVar, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..errors import SpecError
from ..targets import TARGETS
from .layout import register_cap, xor_misfit
from .specio import line_of
from .variants import MASKS, SCORES

SCHEMA_VERSION = 1

Dtype = Literal["fp16", "bf16"]
MaskName = Literal[tuple(MASKS)]
ScoreName = Literal[tuple(SCORES)]


class Strict(BaseModel):
    # strict: YAML already gives ints, bools and strings; lax coercion would read `stages: true` as 1
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, defer_build=True)


class Tile(Strict):
    """Tile sizes of one thread block."""

    block_m: int = Field(ge=1, le=256, description="query rows per thread block (CTA)")
    block_n: int = Field(ge=1, le=256, description="keys per K/V tile")


class HomogeneousWarps(Strict):
    """Every warp loads and computes; warps split block_m into equal row slices."""

    compute: int = Field(ge=1, le=16, description="compute warps; each owns block_m / compute rows")


class SpecializedWarps(Strict):
    """Producer warps only copy K/V tiles into the ring; consumer warps only compute."""

    producer: int = Field(ge=1, le=4, description="warps that only issue global->shared copies")
    consumer: int = Field(ge=1, le=16, description="warps that only compute; each owns block_m / consumer rows")


class PadSwizzle(Strict):
    """Pad each shared-memory row by pad_bytes (breaks the power-of-two row pitch)."""

    pad_bytes: int = Field(ge=4, le=128, description="bytes added after every row; a multiple of 4 (16 for 16-byte copies)")


class XorSwizzle(Strict):
    """XOR the 16-byte chunk index within a row with (row >> row_shift) mod 2**bits."""

    xor_bits: int = Field(ge=1, le=4, description="low bits of the 16-byte chunk index that are XORed")
    row_shift: int = Field(default=0, ge=0, le=3, description="rows sharing one XOR pattern = 2**row_shift")


Swizzle = Union[Literal["none"], PadSwizzle, XorSwizzle]


class SharedMemory(Strict):
    """Shared-memory layout and K/V pipeline."""

    swizzle: Swizzle = Field(default="none", description="none | {pad_bytes: N} | {xor_bits: B, row_shift: S}")
    stages: int = Field(default=1, ge=1, le=8, description="depth of the K/V ring in shared memory")
    async_copy: bool = Field(default=False, description="copy K/V global->shared with cp.async (16 B)")
    q_in_registers: bool = Field(default=False, description="keep Q fragments in registers for the whole kernel")
    opt_in: bool = Field(default=False, description="allow dynamic shared memory above 48 KiB, up to the target's opt-in maximum")


class Softmax(Strict):
    """Online-softmax choices."""

    rescale: Literal["always", "on_max_change"] = Field(
        default="always",
        description="rescale the running output every tile, or only when a row's max moved (not every kind "
                    "generates it)")
    max_chains: Literal[1, 4] = Field(
        default=1,
        description="running maxima a thread keeps while it scans its scores of a row: 1 (one chain of "
                    "pairs) or 4 (a dependent chain a quarter as long, three more registers; the max is "
                    "exact either way). The forward wgmma kinds take it, with a row of at least 32 "
                    "scores per thread (block_n a multiple of 32, from 128)")
    fma_exp2: Literal[0, 1, 2, 3, 4] = Field(
        default=0,
        description="of every 8 exponentials of a row's scores, how many a thread computes on the FMA pipes "
                    "(a cubic of the fraction times 2^n built as bits; relative error below 8.6e-5) rather "
                    "than the MUFU unit, which does 16 a cycle per SM: where the softmax waits on that unit, "
                    "the FMA pipes' idle issue slots take part of its work (k of 8 exactly where a thread holds a multiple of 8 "
                    "scores of a row, block_n a multiple of 32; else a few more). The forward wgmma kinds take it")
    lazy_rescale: bool = Field(
        default=False,
        description="keep a row's running max, and so its output's and sum's scale, until a tile's max exceeds "
                    "it by more than a slack the plan derives from P's type (2^8 for 16-bit P; for e4m3, whose P "
                    "already carries 2^8, what is left below 448), and rescale the output only in a warp where a "
                    "row moved: most tiles then skip the multiplies. The forward wgmma kinds take it")
    kept_max_first: bool = Field(
        default=False,
        description="with lazy_rescale: a warp rounds each tile's P at its rows' kept maxima at once, scanning the "
                    "tile's max beside the exponentials rather than ahead of them, and redoes the tile with the usual "
                    "step only where a row of the warp moved its max (seldom with 16-bit P, whose slack is 8; in a "
                    "fifth to over half of the tiles with e4m3's 0.75 on random inputs); S stays in its registers "
                    "until then. The forward wgmma kinds take it, without fma_exp2 and "
                    "schedule.softmax_block")


Rule = Callable[["SpecBase"], Optional[tuple[str, str]]]


class RuleError(ValueError):
    """A cross-field rule failed; carries the key path it is about."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(message)


class SpecBase(Strict):
    """Keys every spec has, whatever its kind."""

    schema_: Literal[1] = Field(alias="schema", description="spec schema version")
    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,47}$", description="kernel name; lowercase, digits, _")
    description: str = Field(default="", description="free text, copied into the generated header")
    target: str = Field(default="l4", description="GPU profile: " + ", ".join(TARGETS))
    dtype: Dtype = Field(default="fp16", description="element type of q, k, v and o")

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, populate_by_name=True, defer_build=True)

    # Cross-field rules, run in order after field validation; the first that fails is reported.
    # rules are the kind's; shared_rules, run after them, hold for every kind of the model (none can leave
    # one out).
    shared_rules: ClassVar[tuple[Rule, ...]] = ()
    rules: ClassVar[tuple[Rule, ...]] = ()

    @field_validator("target")
    @classmethod
    def _known_target(cls, v: str) -> str:
        if v not in TARGETS:
            raise ValueError(f"unknown target {v!r}; choose one of {', '.join(TARGETS)}")
        return v

    @model_validator(mode="after")
    def _rules(self):
        for rule in type(self).rules + type(self).shared_rules:
            problem = rule(self)
            if problem:
                key, message = problem
                raise RuleError(key, message)
        return self

    @property
    def elem_bytes(self) -> int:
        return 2

    @property
    def out_dtype(self) -> str:
        """The element type of the output: the inputs' (a kind with e4m3 inputs says otherwise)."""
        return self.dtype


class VariantExpressions(Strict):
    """A spec's own variant, written as expressions (attngen/core/expressions.py has the grammar)."""

    params: dict[str, str] = Field(default={}, description=(
        "name: type of each call argument the expressions read: int, float, or a tensor of one per head or "
        "per batch (float[heads], int[batch], ...); the call passes params={name: value}"))
    mask: Optional[str] = Field(default=None, description=(
        "which keys a query row sees, e.g. \"kv_idx <= q_idx + causal_offset and q_idx - kv_idx < window\" "
        "(indices b h q_idx kv_idx, lengths seqlen_q seqlen_k causal_offset, the params)"))
    score: Optional[str] = Field(default=None, description=(
        "the score the softmax takes, from `score` (the scaled q.k) and the names a mask reads, e.g. "
        "\"cap * tanh(score / cap)\""))
    verify: dict[str, list[Union[int, float]]] = Field(default={}, description=(
        "param: [lo, hi], the range `attngen verify` draws it from (default [0, 256] for ints, [0, 1] for "
        "floats; a tensor's elements likewise)"))


class ForwardSpec(SpecBase):
    """An attention-forward kernel: tiles, warps, a fragment (which picks the kind), shared memory.
    Every mask variant it lists shares it."""

    head_dim: int = Field(ge=8, le=256, description="D, the size of each head")
    head_dim_v: Optional[int] = Field(default=None, ge=8, le=256, description=(
        "the head size of V and of the output when it differs from head_dim's Q and K (DeepSeek MLA: head_dim "
        "192, head_dim_v 128); unset: head_dim"))
    masks: list[MaskName] = Field(default=["none", "causal"], min_length=1,
                                  description="mask variants to emit, one kernel function each: none, causal, "
                                              "window (a sliding window, FlashAttention's window_size)")
    scores: list[ScoreName] = Field(default=[], description=(
        "score modifiers every function applies before the mask, in this order: softcap (cap * tanh(s / cap), "
        "the call passes softcap=), alibi (-slope[h] * |i + Sk - Sq - j|, the call passes alibi_slopes=), sink (a "
        "learned per-head logit in every row's softmax denominator, the call passes sinks=)"))
    variant: Optional[VariantExpressions] = Field(default=None, description=(
        "score and mask expressions (params, mask, score, verify); a mask expression is the spec's only mask "
        "(masks: [expr], the default with one)"))
    tile: Tile
    warps: Union[HomogeneousWarps, SpecializedWarps]
    mma: str = Field(description="the fragment; it picks the kernel kind")
    varlen: Union[bool, Literal["only"]] = Field(
        default=False,
        description="true: also emit a varlen function per mask: q/k/v of shape (total, heads, head_dim) with "
                    "cu_seqlens_q/k, called as kernel.varlen(...); only: the varlen functions alone, for a "
                    "cell that serves varlen calls only (no padded function is compiled)")

    @property
    def padded(self) -> bool:
        """The spec emits padded functions (kernel(q, k, v)): every spec but a `varlen: only` one."""
        return self.varlen != "only"
    smem: SharedMemory = SharedMemory()
    softmax: Softmax = Softmax()
    min_blocks_per_sm: Optional[int] = Field(
        default=None, ge=1, le=32,
        description="second argument of __launch_bounds__: ptxas caps registers per thread so that this "
                    "many blocks fit on one SM; unset lets ptxas choose (it may trade a small spill for "
                    "occupancy)")

    # Kinds whose plans give V and O their own head dim (head_dim_v) say so.
    takes_head_dim_v: ClassVar[bool] = False
    # The masks and score modifiers a kind's templates implement.
    masks_taken: ClassVar[tuple[str, ...]] = ("none", "causal")
    takes_scores: ClassVar[bool] = False
    takes_sinks: ClassVar[bool] = False      # the finish of each row adds a learned sink (scores: [sink])
    takes_max_chains: ClassVar[bool] = False   # softmax.max_chains other than 1
    takes_fma_exp2: ClassVar[bool] = False     # softmax.fma_exp2 other than 0
    takes_lazy_rescale: ClassVar[bool] = False  # softmax.lazy_rescale
    takes_kept_max_first: ClassVar[bool] = False  # softmax.kept_max_first
    # Registers a thread needs beside those register_need counts (addresses, operand fragments, the
    # softmax), measured per kind as the lowest ptxas cap that compiles without spills.
    register_margin: ClassVar[int] = 0

    # What the kind's fragments need of the tile: rows per compute warp and keys per tile come in
    # multiples of these (see rule_block_m_split / rule_block_n).
    row_unit: ClassVar[int] = 1
    row_unit_what: ClassVar[str] = "rows"
    key_unit: ClassVar[int] = 1
    key_unit_why: ClassVar[str] = ""

    @model_validator(mode="before")
    @classmethod
    def _expression_mask_default(cls, data):
        """A spec with a mask expression and no masks key has the one function that applies it."""
        if isinstance(data, dict) and "masks" not in data and isinstance(data.get("variant"), dict) \
                and data["variant"].get("mask") is not None:
            data = {**data, "masks": ["expr"]}
        return data

    @field_validator("masks", "scores")
    @classmethod
    def _unique_masks(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"lists a variant twice ({v}); list each one once")
        return v

    @field_validator("scores")
    @classmethod
    def _score_order(cls, v: list[str]) -> list[str]:
        order = [s for s in SCORES if s in v]
        if v != order:
            raise ValueError(f"score modifiers apply in the order {list(SCORES)}; write {order}")
        return v

    @property
    def v_dim(self) -> int:
        """The head dim of V and O: head_dim_v, or head_dim when unset."""
        return self.head_dim_v or self.head_dim

    @property
    def compute_warps(self) -> int:
        w = self.warps
        return w.compute if isinstance(w, HomogeneousWarps) else w.consumer

    @property
    def producer_warps(self) -> int:
        w = self.warps
        return w.producer if isinstance(w, SpecializedWarps) else 0

    def swizzled_row_chunks(self) -> int:
        """16-byte chunks in the row an XOR swizzle permutes: a row of head_dim (kinds that store
        their tiles in narrower panels say so)."""
        return self.head_dim * self.elem_bytes // 16

    def register_need(self) -> tuple[int, str] | None:
        """(registers per thread the kernel needs at least, what they hold), for kinds that know it
        (their accumulators and fragments); None: the kind does not say."""
        return None


# -- rules every forward kind uses ----------------------------------------------------------------

def round_up(x: int, unit: int) -> int:
    return max(unit, (x + unit - 1) // unit * unit)


def rule_head_dim_vector_loads(s: ForwardSpec):
    if s.head_dim % 8:
        return "head_dim", f"must be a multiple of 8 for 16-byte loads (got {s.head_dim}); try {round_up(s.head_dim, 8)}"


def rule_block_m_split(s: ForwardSpec):
    warps = s.compute_warps
    who = "warps.compute" if s.producer_warps == 0 else "warps.consumer"
    unit = s.row_unit
    if s.tile.block_m % (unit * warps):
        need = unit * warps
        return "tile.block_m", (f"must be a multiple of {f'{unit} x ' if unit > 1 else ''}{who} = {need} so each compute "
                                f"warp owns whole {s.row_unit_what} (got {s.tile.block_m}); "
                                f"try {round_up(s.tile.block_m, need)}")


def rule_block_n(s: ForwardSpec):
    if s.tile.block_n % s.key_unit:
        return "tile.block_n", (f"must be a multiple of {s.key_unit} for {s.mma} ({s.key_unit_why}) "
                                f"(got {s.tile.block_n}); try {round_up(s.tile.block_n, s.key_unit)}")


def rule_head_dim_fragments(s: ForwardSpec):
    """Tensor-core kinds step over head_dim in k16 fragments."""
    if s.head_dim % 16:
        return "head_dim", (f"must be a multiple of 16 for {s.mma} fragments (got {s.head_dim}); "
                            f"try {round_up(s.head_dim, 16)}")


def rule_pad_16_bytes(s: ForwardSpec):
    """Kinds that store 16-byte chunks need 16-byte aligned rows."""
    sw = s.smem.swizzle
    if isinstance(sw, PadSwizzle) and sw.pad_bytes % 16:
        return "smem.swizzle.pad_bytes", (f"must be a multiple of 16 to keep 16-byte rows aligned for {s.mma} "
                                          f"(got {sw.pad_bytes}); try {round_up(sw.pad_bytes, 16)}")


def rule_stages_need_async(s: ForwardSpec):
    if s.smem.stages > 1 and not s.smem.async_copy:
        return "smem.stages", (f"{s.smem.stages} stages need asynchronous copies to overlap anything; "
                               "set smem.async_copy: true or stages: 1")


def rule_pad_bytes(s: ForwardSpec):
    sw = s.smem.swizzle
    if isinstance(sw, PadSwizzle) and sw.pad_bytes % 4:
        return "smem.swizzle.pad_bytes", f"must be a multiple of 4 (got {sw.pad_bytes}); try {round_up(sw.pad_bytes, 4)}"


def rule_xor_bits(s: ForwardSpec):
    sw = s.smem.swizzle
    if isinstance(sw, XorSwizzle):
        problem = xor_misfit(s.swizzled_row_chunks(), sw.xor_bits, s.head_dim)
        if problem:
            return "smem.swizzle.xor_bits", problem


def register_estimate(s: ForwardSpec) -> int | None:
    """Registers per thread the kernel needs to compile without spills: what it holds and the kind's
    margin; None when the kind does not say."""
    need = s.register_need()
    return None if need is None else need[0] + s.register_margin


def blocks_that_fit(s: ForwardSpec, threads: int) -> int:
    """The most blocks per SM (at least 1) that are resident on the target and leave ptxas the
    registers the kernel needs: the only counts a refusal may suggest."""
    target = TARGETS[s.target]
    need = register_estimate(s)
    resident = max(1, target.max_threads_per_sm // threads)
    fit = [n for n in range(1, resident + 1) if need is None or register_cap(target.regs_per_sm, threads, n) >= need]
    return max(fit, default=1)


def rule_register_cap(s: ForwardSpec):
    """min_blocks_per_sm caps the registers ptxas may use; a cap below what the kernel needs makes
    ptxas fail (wgmma: C7602) or spill to local memory. The need counts what the kernel holds (its
    accumulators and fragments) and the kind's measured margin beside them, so that a count this
    rule accepts or suggests compiles without spills."""
    blocks, need = s.min_blocks_per_sm, s.register_need()
    if blocks is None or need is None:
        return None
    threads = 32 * (s.compute_warps + s.producer_warps)
    target = TARGETS[s.target]
    if blocks * threads > target.max_threads_per_sm:
        return None    # the plan refuses it first: that many blocks are not resident at all
    cap = register_cap(target.regs_per_sm, threads, blocks)
    total = register_estimate(s)
    if cap < total:
        fit = blocks_that_fit(s, threads)
        fix = f"use min_blocks_per_sm <= {fit}, or leave it unset" if fit > 1 else "leave min_blocks_per_sm unset"
        beside = f" and about {s.register_margin} more beside them" if s.register_margin else ""
        return "min_blocks_per_sm", (f"{blocks} blocks of {threads} threads per SM cap ptxas at {cap} registers per "
                                     f"thread, but the kernel holds at least {need[0]} ({need[1]}){beside}: it needs "
                                     f"{total} to compile without spills; {fix}")


def rule_head_dim_v(s: ForwardSpec):
    if s.head_dim_v is None or s.head_dim_v == s.head_dim:
        return None
    if not s.takes_head_dim_v:
        return "head_dim_v", (f"a V head dim other than head_dim is not generated for {s.mma}: its P.V and output "
                              f"tiles share Q's head dim; leave head_dim_v unset (or {s.head_dim})")
    if s.head_dim_v % 8:
        return "head_dim_v", (f"must be a multiple of 8 for 16-byte rows (got {s.head_dim_v}); try "
                              f"{round_up(s.head_dim_v, 8)}")


def rule_variants_taken(s: ForwardSpec):
    for mask in s.masks:
        if mask not in s.masks_taken:
            return "masks", (f"this kind does not generate the {mask} mask (it takes "
                                  f"{', '.join(s.masks_taken)}); remove it, or pick a fragment whose kind takes it")
    if (s.scores or (s.variant is not None and s.variant.score is not None)) and not s.takes_scores:
        key = "scores" if s.scores else "variant.score"
        return key, (f"this kind does not apply score modifiers; leave {key} empty, or pick a fragment whose "
                     f"kind takes them")
    for name in s.scores:
        flag = SCORES[name].kind_flag
        if flag and not getattr(s, flag, False):
            return "scores", (f"this kind does not generate {name} ({SCORES[name].describe}); remove it, or pick a "
                              f"fragment whose kind takes it")
    if s.softmax.max_chains != 1 and not s.takes_max_chains:
        return "softmax.max_chains", ("this kind scans a row's max in one chain (four chains are generated by the "
                                      "forward wgmma kinds only); remove max_chains")
    if s.softmax.fma_exp2 and not s.takes_fma_exp2:
        return "softmax.fma_exp2", ("this kind computes every exponential on the MUFU unit (exponentials on the FMA "
                                    "pipes are generated by the forward wgmma kinds only); remove fma_exp2")
    if s.softmax.lazy_rescale and not s.takes_lazy_rescale:
        return "softmax.lazy_rescale", ("this kind moves a row's max to every tile's (a max kept with slack is "
                                        "generated by the forward wgmma kinds only); remove lazy_rescale")
    if s.softmax.kept_max_first and not s.takes_kept_max_first:
        return "softmax.kept_max_first", ("this kind scans a tile's max before its exponentials (P at the kept max "
                                          "first is generated by the forward wgmma kinds only); remove "
                                          "kept_max_first")
    if s.softmax.kept_max_first and not s.softmax.lazy_rescale:
        return "softmax.kept_max_first", ("P is taken at a row's kept max, which only lazy_rescale keeps: set "
                                          "softmax.lazy_rescale: true, or remove kept_max_first")
    if s.softmax.kept_max_first and s.softmax.fma_exp2:
        return "softmax.kept_max_first", ("P at the kept max takes every exponential on the MUFU unit: set "
                                          "softmax.fma_exp2: 0, or remove kept_max_first")


def rule_variant_expressions(s: ForwardSpec):
    """The expressions parse and type-check (the column in the message); a mask expression is the
    spec's only mask, and a score expression the only score change."""
    from .expression_variant import check_param_names, check_ranges
    from .expressions import ExpressionError, parse
    v = s.variant
    if v is None:
        if "expr" in s.masks:
            return "masks", "the expr mask applies the spec's mask expression: add variant.mask, or remove expr"
        return None
    named = check_param_names(v)      # names first: they become C++ members and Params fields
    if named:
        return named
    for key, text in (("variant.mask", v.mask), ("variant.score", v.score)):
        if text is not None:
            try:
                parse(text, v.params, score=key == "variant.score")
            except ExpressionError as exc:
                return key, f"{exc} in {text[:200]!r}{' ...' if len(text) > 200 else ''}"
    if v.mask is not None and list(s.masks) != ["expr"]:
        return "masks", (f"a spec with a mask expression has one mask function, expr, which applies it (got "
                         f"{list(s.masks)}); write masks: [expr] or leave masks out, and put causality or a window "
                         f"into the expression")
    if v.mask is None and "expr" in s.masks:
        return "masks", "the expr mask applies variant.mask, which this spec lacks: add it, or remove expr"
    if v.score is not None and s.scores:
        return "scores", (f"a score expression replaces the built-in modifiers: write {s.scores} into variant.score "
                          f"(e.g. cap * tanh(score / cap)) and leave scores empty")
    if v.mask is None and v.score is None:
        return "variant", "give a mask expression, a score expression, or both (variant.mask, variant.score)"
    return check_ranges(v)


# Every forward-shaped kind's tiles go through core.forward_plan.tile_swizzle, and every kind's launch
# bounds through ptxas: neither is a kind's choice. head_dim_v and the variants are refused by every
# kind that does not take them, in one place.
ForwardSpec.shared_rules = (rule_xor_bits, rule_register_cap, rule_head_dim_v, rule_variants_taken,
                            rule_variant_expressions)


def rule_warp_roles_need_a_ring(s: ForwardSpec):
    if s.producer_warps and not s.smem.async_copy:
        return "smem.async_copy", "producer warps issue cp.async copies; set smem.async_copy: true"
    if s.producer_warps and s.smem.stages < 2:
        return "smem.stages", "producer warps fill a ring while consumers compute: use at least 2 stages"


def rule_threads(s: ForwardSpec):
    threads = 32 * (s.compute_warps + s.producer_warps)
    if threads > 1024:
        return "warps", f"{threads} threads per block exceed CUDA's 1024; use fewer warps"


def refuse(key: str, applies: Callable[[ForwardSpec], bool], message: Callable[[ForwardSpec], str], name: str) -> Rule:
    """A rule refusing a key's value that a kind does not generate code for."""
    def rule(s):
        if applies(s):
            return key, message(s)
    rule.__name__ = name
    return rule


# Refusals of features some kinds do not generate. Each message names the feature, the spec's own
# `mma` and the value that works, never another kind: what generates the feature is the registry's
# business, and a kind added later would make such a hint wrong.

rule_no_q_in_registers = refuse(
    "smem.q_in_registers", lambda s: s.smem.q_in_registers,
    lambda s: f"Q fragments in registers are not generated for {s.mma}; set smem.q_in_registers: false",
    "rule_no_q_in_registers")
rule_no_xor_swizzle = refuse(
    "smem.swizzle", lambda s: isinstance(s.smem.swizzle, XorSwizzle),
    lambda s: f"the XOR swizzle is not generated for {s.mma}; set smem.swizzle to {{pad_bytes: N}} or none",
    "rule_no_xor_swizzle")
rule_no_warp_roles = refuse(
    "warps.producer", lambda s: s.producer_warps > 0,
    lambda s: (f"producer/consumer warp roles are not generated for {s.mma}; use warps: "
               f"{{compute: {s.compute_warps}}}"), "rule_no_warp_roles")
rule_backward_varlen_no_expressions = refuse(
    "variant", lambda s: s.variant is not None and s.varlen,
    lambda s: "the backward's varlen functions take no expressions yet (its padded functions do): drop varlen: "
              "true, or put the expressions in a spec without it", "rule_backward_varlen_no_expressions")
rule_backward_varlen_plain = refuse(
    "varlen", lambda s: s.varlen and (s.scores or "window" in s.masks),
    lambda s: f"the varlen functions of backward: {s.backward} take masks none and causal, without score "
              "modifiers, so far; drop varlen: true, or put the window and scores in a spec without it",
    "rule_backward_varlen_plain")
rule_always_rescales = refuse(
    "softmax.rescale", lambda s: s.softmax.rescale != "always",
    lambda s: (f"rescaling only when a row's max changes is not generated for {s.mma}; set "
               "softmax.rescale: always"), "rule_always_rescales")
# The backward recomputes P from the forward's LSE: it keeps no running max, so the key would be
# accepted and mean nothing.
rule_backward_no_rescale = refuse(
    "softmax.rescale", lambda s: s.softmax.rescale != "always",
    lambda s: ("the backward recomputes P from the forward's saved LSE and keeps no running max to rescale by; "
               "remove softmax.rescale (or set it to always)"), "rule_backward_no_rescale")


# -- validation errors -> one SpecError ------------------------------------------------------------

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
# class name -> model, to list a mapping's keys when a scalar was given instead
_MODELS = {m.__name__: m for m in (Tile, HomogeneousWarps, SpecializedWarps, PadSwizzle, XorSwizzle,
                                   SharedMemory, Softmax)}
# A valid value to show when a list is empty.
_EXAMPLES = {("masks",): "[none, causal]"}
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
        loc = _clean_loc(e["loc"])
        if loc[:2] == ("smem", "swizzle") and len(loc) == 3 and loc[2] in (set(PadSwizzle.model_fields)
                                                                         | set(XorSwizzle.model_fields)):
            return ("a swizzle is one of none, {pad_bytes: N} or {xor_bits: B, row_shift: S}: choose one (this one "
                    "mixes keys of two)")
        return "unknown key; check the spelling (see `attngen schema` for the keys a spec takes)"
    if e["type"] == "missing":
        return "required key is missing"
    if e["type"] == "string_pattern_mismatch" and _clean_loc(e["loc"]) == ("name",):
        return (f"must start with a lowercase letter and hold only lowercase letters, digits and _, at most 48 "
                f"characters: it names the generated files and the kernel functions (got {e.get('input')!r})")
    loc = _clean_loc(e["loc"])
    got = "" if isinstance(e.get("input"), (dict, list)) else f" (got {e.get('input')!r})"
    if loc in _UNION_FORMS and e["type"] in ("model_type", "literal_error"):
        return f"must be {_UNION_FORMS[loc]}{got}"
    if e["type"] == "too_short":
        need = (e.get("ctx") or {}).get("min_length", 1)
        example = _EXAMPLES.get(loc)
        return (f"must list at least {need} item{'s' if need > 1 else ''} (got an empty list)"
                + (f"; e.g. {'.'.join(map(str, loc))}: {example}" if example else ""))
    if e["type"] == "model_type":
        model = _MODELS.get((e.get("ctx") or {}).get("class_name"))
        keys = f" with keys {', '.join(model.model_fields)}" if model else ""
        return f"must be a mapping{keys}{got}"
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if e["type"] not in ("value_error",) and "input" in e and not isinstance(e["input"], (dict, list)):
        msg += f" (got {e['input']!r})"
    return msg


def validate(model: type[SpecBase], data: dict, node, file: str) -> SpecBase:
    """Validate YAML data against a kind's spec model; any problem becomes one SpecError."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        e = _pick_error(exc)
        ctx_err = (e.get("ctx") or {}).get("error")
        if isinstance(ctx_err, RuleError):
            key = ctx_err.key
            path = tuple(int(p) if p.isdigit() else p for p in key.split("."))
            raise SpecError(str(ctx_err), file=file, line=line_of(node, path), key=key) from None
        loc = _clean_loc(e["loc"])
        key = ".".join(str(p) for p in loc) or "(top level)"
        hint = None
        if loc == ("schema",):
            hint = f"this attngen reads schema {SCHEMA_VERSION}; start the file with 'schema: {SCHEMA_VERSION}'"
        raise SpecError(_message(e), file=file, line=line_of(node, loc), key=key, hint=hint) from None
