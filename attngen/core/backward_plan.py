"""What every backward kind shares: the Params fields the gradients add to the forward ones, and
the numbers of its row kernels (preprocess and convert). The backward call
(attngen/runtime/calls/backward.py) and each backward kind read these; none of it names a kind.

A backward bundle runs three kernels on one Params:
- preprocess: delta = rowsum(dO * O) per query row (fp32), and zeros in the fp32 dQ accumulator;
- main: one block per key block (and KV head, batch) recomputes P from Q, K and the forward's LSE,
  keeps dK and dV in registers and adds its share of dQ into the accumulator (fp32 atomics);
- convert: dQ = scale * accumulator, in the element type, with the caller's strides.

Deterministic mode (a call's deterministic=True) runs the main part's deterministic function of the
mask (deterministic_key) with a turn counter per query block (dq_turns): the key blocks that see a
query block add its dQ one after another, in one order, so the fp32 sums, and dQ, repeat bit for bit.
A function of its own, so that the default one's code is not touched by the waits. The caller
zeroes the counters (one memset, only in this mode).

Group split (a spec's `group_split`, GQA/MQA calls that are not deterministic): the main part's
group-split function of the mask (group_split_key) runs `splits` blocks per (key block, KV head,
batch), each over its share of the KV head's query heads, adding dK and dV into fp32 sums that
follow the dQ accumulator in its buffer (zeroed by the caller); the convert part's kv_convert then
writes dk and dv. The split count is the call's (core.launch_rules.group_splits).

Varlen (a spec's `varlen: true`): the main part's varlen functions take a block per (key block,
KV head, sequence) and narrow Params to the sequence; the row kernels need no sequences at all:
they run over the total_q rows as one batch (delta and dq_accum are laid out as lse).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from .abi import float32, float_pointer, pointer
from .forward_plan import ForwardPlan, Part, forward_functions, function_name, stride_fields
# The row kernels' and the accumulator's arithmetic lives in core.launch_rules: the runtime's
# LaunchPlan runs it too.
from .launch_rules import (DETERMINISTIC, DQ_CONVERT, DQ_CONVERT_PAIRS, GROUP_SPLIT, KV_CONVERT, ROW_THREADS, deterministic_key,
                           dq_convert, group_split_key)
from .varlen_plan import backward_mask_of, is_varlen

ACCUM_FRAGMENT_ROWS = 64    # rows of a register-order block of a whole-block kind's dQ accumulator: an m64
                            # wgmma accumulator, or four m16 mma.sync fragments laid out alike


BACKWARD_ABI_FIELDS = (
    pointer("dout", "dO, the gradient of the output, shaped like o"),
    pointer("dq", "gradient of q, shaped like q (written by the convert kernel)", const=False),
    pointer("dk", "gradient of k, shaped like k", const=False),
    pointer("dv", "gradient of v, shaped like v", const=False),
    *stride_fields("dout", "dout"), *stride_fields("dq", "dq"), *stride_fields("dk", "dk"),
    *stride_fields("dv", "dv"),
    float_pointer("dq_accum", "fp32 (batch, heads, seqlen_q, head_dim), contiguous (varlen: (heads, total_q, "
                  "head_dim)), rows laid out as lse's: dQ / scale as the main kernel's blocks add it up; zeroed by "
                  "the preprocess kernel"),
    float_pointer("delta", "fp32, laid out as lse (batch, heads, seqlen_q) or (heads, total_q): rowsum(dO * O) of "
                  "every query row"),
    float32("scale", "the softmax scale: dQ and dK carry it (dS is the gradient of the scaled score)"),
    pointer("dq_turns", "int32 (batch, heads, ceil(seqlen_q / block_m)) (varlen: heads x (ceil(total_q / block_m) "
            "+ sequences)), zeroed by the caller: the key blocks that have added into each query block's dQ "
            "accumulator, which take turns in key order; null: they add in any order (not deterministic, faster)",
            const=False, optional=True),
)

# The Params fields the main kernel leaves to the row kernels (it reads every other one).
MAIN_UNREAD = ("o", "o_batch_stride", "o_head_stride", "o_row_stride", "batch", "dq", "dq_batch_stride",
               "dq_head_stride", "dq_row_stride")
# The Params fields each row kernel reads (they launch with the main kernel's bytes).
PREPROCESS_READS = ("o", "o_batch_stride", "o_head_stride", "o_row_stride", "dout", "dout_batch_stride",
                    "dout_head_stride", "dout_row_stride", "dq_accum", "delta", "heads", "seqlen_q")
# What the row kernels of a kind that adds whole query blocks also read in a varlen spec: where each
# sequence's run of accumulator blocks starts (varlen_accum_rows).
VARLEN_ACCUM_READS = ("cu_seqlens_q", "batch", "total_q")
CONVERT_READS = ("dq", "dq_batch_stride", "dq_head_stride", "dq_row_stride", "dq_accum", "heads", "seqlen_q",
                 "scale")
# What the convert part of a plan with group-split functions also reads (its kv_convert function: dK and
# dV from their fp32 sums, which follow the dQ accumulator in dq_accum's buffer).
KV_CONVERT_READS = ("dk", "dv", "dk_batch_stride", "dk_head_stride", "dk_row_stride", "dv_batch_stride",
                    "dv_head_stride", "dv_row_stride", "batch", "kv_heads", "seqlen_k")


@dataclass(frozen=True)
class BackwardPlan(ForwardPlan):
    """The plan of a backward bundle: the forward plan's numbers, with function keys that may carry
    the deterministic suffix."""

    @classmethod
    def of(cls, plan: ForwardPlan, **changes) -> "BackwardPlan":
        return cls(**{f.name: getattr(plan, f.name) for f in fields(ForwardPlan)} | changes)

    def key_mask(self, key: str) -> str:
        return backward_mask_of(key)

    @property
    def accum_row_block(self) -> int:
        """Rows of the dQ accumulator's blocks: 1, or whole query blocks where the kind's main kernel
        adds them (its fragments say)."""
        return self.fragments.accum_row_block

    @property
    def dq_pair_masks(self) -> tuple[str, ...]:
        """The masks whose main functions add dQ in register-pair order (the fragments say)."""
        return self.fragments.pair_masks

    def dq_convert(self, key: str) -> str:
        """The convert function that reads the dQ accumulator the main function of `key` added."""
        return dq_convert(self.key_mask(key), self.dq_pair_masks)

    def takes_turns(self, key: str) -> bool:
        """The function of `key` adds dQ in turns (deterministic mode)."""
        return DETERMINISTIC.has(key)

    def body(self, key: str) -> str:
        """The C++ function an entry point runs: attention_backward, its varlen form or its group-split
        form (GQA: a KV head's query heads split over blocks)."""
        if GROUP_SPLIT.has(key):
            return "attention_backward_group_split"
        return "attention_backward_varlen" if is_varlen(DETERMINISTIC.mask(key)) else "attention_backward"

    @property
    def group_split(self) -> bool:
        """The bundle has group-split main functions (and the convert part their kv_convert)."""
        return any(GROUP_SPLIT.has(key) for key, _ in self.functions)


def backward_parts(spec, abi, accum_blocks: bool = False, main_unread: tuple[str, ...] = (),
                   group_split: bool = False, pair_masks: tuple[str, ...] = ()) -> tuple[Part, ...]:
    """A backward bundle's parts: main, from the kind's main.cu.j2 (the forward's functions: one per
    mask, and with `varlen` one per mask for varlen sequences; then a deterministic one of each; they
    read every Params field but the row kernels' own and the kind's `main_unread`), then the shared
    row kernels, which run the same for varlen calls. accum_blocks: the kind adds whole query blocks
    to the accumulator; in a varlen spec its row kernels then also read the sequences
    (VARLEN_ACCUM_READS). group_split: a group-split function per padded mask after those (GQA/MQA
    calls; not deterministic), and the convert part's kv_convert. pair_masks: the masks whose main
    functions add dQ in register-pair order: the convert part has convert_pairs for them, and convert
    for the others."""
    keys = [key for key, _ in forward_functions(spec)]
    keys += [deterministic_key(key) for key in keys]
    if group_split:
        keys += [group_split_key(mask) for mask in spec.masks]
    unread = set(MAIN_UNREAD) | set(main_unread)
    main = Part("main", "main.cu.j2", f"{spec.name}_main.cu", tuple((k, function_name(spec, k)) for k in keys),
                reads=tuple(f.name for f in abi.fields if f.name not in unread), awaits_predecessor=True)
    row = dict(static_smem=0, threads=ROW_THREADS, awaits_predecessor=True)
    sequences = VARLEN_ACCUM_READS if accum_blocks and spec.varlen else ()
    orders = [dq_convert(mask, pair_masks) for mask in spec.masks]
    converts = tuple((key, function_name(spec, key)) for key in (DQ_CONVERT, DQ_CONVERT_PAIRS) if key in orders)
    if group_split:
        converts += ((KV_CONVERT, function_name(spec, KV_CONVERT)),)
    return (main,
            Part("preprocess", "lib/backward_preprocess.cu.j2", f"{spec.name}_preprocess.cu",
                 (("preprocess", function_name(spec, "preprocess")),), reads=PREPROCESS_READS + sequences, **row),
            Part("convert", "lib/backward_convert.cu.j2", f"{spec.name}_convert.cu", converts,
                 reads=CONVERT_READS + sequences + (KV_CONVERT_READS if group_split else ()), **row))
