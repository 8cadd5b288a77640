"""merge_lse: the merge of partial attention results by their LSE, as a kernel of its own.

Each part is attention over a subset of the keys (ring attention's steps, a sharded KV cache, a long
prompt in chunks): its normalised output O_i and its natural-log LSE_i. One warp per output row
(batch, head, position) reads the parts' LSEs (lane i holds part i's), takes their logsumexp, then
weighs each part's row by exp(LSE_i - LSE) in fp32 and writes O and the row's LSE. It is the decode
kind's combine generalised: N given parts, each with its own pointer and strides, in either layout
(bhsd or bshd), of the spec's dtype or fp32, into an output of the spec's dtype or fp32
(core.merge_plan.FORMS). A part whose LSE is -inf saw no key: its weight is 0 and its output is
never read; where every part is -inf the row is 0 with LSE -inf."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from ...core.forward_plan import ELEMENT_TYPES, Part
from ...core.kind import Kind
from ...core.layout import Budget, Occupancy, Swizzle, TileCopy   # noqa: F401  (Occupancy: the plan's property)
from ...core.merge_plan import FORMS, MASK, MAX_PARTS, MergeFragments, MergePlan, merge_abi
from ...core.spec_keys import SpecBase
from ...core.variants import MASKS
from ...targets import TARGETS

NAME = "merge_lse"
TITLE = "merge of partial attention results by their LSE, a warp per output row"
SELECTOR = ("merge", "by_lse")
# __launch_bounds__'s minimum blocks per SM: 1 lets ptxas hold every part's loads of a row in registers.
# Without it ptxas aimed lower and spilled (d96: 56 registers, 20 B spilled; nvcc 13.0, sm_90).
MIN_BLOCKS = 1


class MergeSpec(SpecBase):
    merge: Literal["by_lse"] = Field(description=(
        "by_lse: weigh each part's output by exp(lse_i - logsumexp(lse)) (picks the merge kind)"))
    head_dim: int = Field(ge=8, le=256, description="D of the parts and of the output")
    warps: int = Field(default=4, ge=1, le=32, description="warps per block; each merges one output row")
    max_parts: int = Field(default=8, ge=2, le=MAX_PARTS, description=(
        "most parts one launch merges (Params hold a pointer and strides for each); a call with more merges "
        "them in rounds through fp32 partials"))


def rule_head_dim(s: MergeSpec):
    if s.head_dim % 8:
        return "head_dim", (f"must be a multiple of 8 (16-byte rows, as the forward writes them; got {s.head_dim}); "
                            f"try {-(-s.head_dim // 8) * 8}")


MergeSpec.rules = (rule_head_dim,)


def fragments(spec: MergeSpec) -> MergeFragments:
    return MergeFragments(rows_per_block=spec.warps, pairs_per_lane=-(-spec.head_dim // 64), max_parts=spec.max_parts)


def plan(spec: MergeSpec, file: str | None = None) -> MergePlan:
    target = TARGETS[spec.target]
    ctype, ctype2, ptx_type = ELEMENT_TYPES[spec.dtype]
    threads = 32 * spec.warps
    row_bytes = spec.head_dim * spec.elem_bytes
    chunks = row_bytes // 16
    functions = tuple((key, f"attngen_{spec.name}_{key}") for key, _, _ in FORMS)
    f = fragments(spec)
    forms = {"elem": spec.dtype, "fp32": "fp32"}
    block_text = (
        f"block: {spec.warps} output rows (batch, head, position), a warp each; grid ceil(batch x heads x seqlen / "
        f"{spec.warps}); no shared memory",
        f"threads: {threads} = {spec.warps} warps; lane i holds part i's LSE, and every lane merges the column pairs "
        f"2 x lane + 64 j (j < {f.pairs_per_lane}) of the row",
        "functions (parts -> output): " + "; ".join(f"{key}: {forms[p]} -> {forms[o]}" for key, p, o in FORMS),
    )
    return MergePlan(
        spec=spec, kind=KIND, title=TITLE, target=target, masks=(MASK,), mask_variants=(MASKS[MASK],),
        parts=(Part("merge", "merge.cu.j2", f"{spec.name}.cu", functions),), abi=merge_abi(spec.max_parts),
        ctype=ctype, ctype2=ctype2, ptx_type=ptx_type, head_dim=spec.head_dim, block_m=spec.warps, block_n=0,
        compute_warps=spec.warps, producer_warps=0, threads=threads, compute_threads=threads, producer_threads=0,
        rows_per_warp=1, chunks_per_row=chunks, swizzle=Swizzle("none", row_bytes), regions=(), smem_bytes=0,
        smem_budget=Budget.of(target, False).bytes, smem_dynamic=False, stages=1, async_copy=False,
        q_in_registers=False, rescale="always", q_copy=TileCopy(1, chunks, threads),
        kv_copy=TileCopy(1, chunks, threads), barriers=(), kv_stage_stride=0, min_blocks_per_sm=MIN_BLOCKS, fragments=f,
        block_text=block_text,
        pipeline_text=(f"loads: each lane reads its columns of every part with a non-zero weight (up to "
                       f"{spec.max_parts}) before it adds any, so a row's loads are in flight together; parts "
                       "with LSE -inf are never read"),
        max_parts=spec.max_parts)


def explain(plan: MergePlan) -> list[str]:
    f = plan.fragments
    return [f"merge: up to {f.max_parts} parts per launch, each with its own pointer and strides; a call with more "
            f"merges them in rounds through fp32 partials (at most {f.max_parts} per round)",
            f"per lane: {f.pairs_per_lane} column pair(s) per part, {2 * f.pairs_per_lane * f.max_parts} fp32 values "
            "loaded before the weighted sum"]


KIND = Kind(NAME, TITLE, SELECTOR, MergeSpec, plan, explain, calls="merge")
