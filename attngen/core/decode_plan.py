"""What every decode kind shares: the Params fields a split-KV decode adds to the forward ones, the
group rows (a KV head's query heads x new tokens), and the number of key slices (splits) a launch
uses. The decode call (attngen/runtime/calls/decode.py) and each decode kind read these; none of it
names a kind."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

from .abi import float_pointer, int32, pointer
from .forward_plan import ForwardPlan
from .function_keys import KeySuffix

MAX_SPLITS = 128
WAVE_EFFICIENCY = 0.95      # the heuristic takes the fewest splits within this fraction of the best
# K/V bytes in flight per SM, on average over the GPU, from which one slice per (KV head, batch)
# already streams at full speed: a split would only add partials to write and a combine to run.
# Measured on the H200 (docs/decode-h200/decode_split_grid.py, a 32-layer loop replayed from a CUDA graph, GQA
# 32/8, 1k-16k keys): d128 at batch 8 (64 blocks x 128 KiB in flight, 62 KiB per SM) is 1-16 %
# faster unsplit than in 2 slices; d64 at batch 8 (64 KiB per block, 31 KiB per SM) is 2-21 % slower
# unsplit from 4k keys on. The threshold lies between the two.
IN_FLIGHT_PER_SM = 48 << 10

DECODE_ABI_FIELDS = (
    pointer("cache_seqlens", "int32 (batch,): keys of each sequence in the cache; null: seqlen_k for all",
            optional=True),
    float_pointer("o_accum", "fp32 (num_splits, batch, heads, seqlen_q, head_dim): each split's normalised O",
                  optional=True),
    float_pointer("lse_accum", "fp32 (num_splits, batch, heads, seqlen_q): each split's natural-log LSE",
                  optional=True),
    int32("num_splits", "key slices per (KV head, batch); 1: the split kernel writes O itself", default=1),
    int32("tiles_per_split", "K/V tiles of block_n keys each split takes", default=1),
    int32("row_blocks", "blocks of block_m group rows per KV head: ceil(heads / kv_heads * seqlen_q / block_m)",
          default=1),
    pointer("block_table", "int32 (batch, table_stride): page ids of each sequence's keys, in order; null: k and v "
            "are contiguous caches (batch, kv_heads, seqlen_k, head_dim)", optional=True),
    int32("table_stride", "entries per row of block_table (its max pages per sequence)", default=0),
    pointer("split_counters", "int32 (batch, kv_heads, row_blocks), zeros: split blocks done per group; with a fused "
            "combine the last one merges the group's splits and resets it to 0", const=False, optional=True),
    int32("num_pages", "pages in the k and v pools (paged: k is (num_pages, kv_heads, page_size, head_dim) with "
          "batch stride = page stride); a page id outside [0, num_pages) is clamped, never read past", default=0),
)


@dataclass(frozen=True)
class DecodePlan(ForwardPlan):
    """The plan of a decode bundle, the decode call convention's: the forward plan of its split
    kernel (parts[0]) plus what a decode call decides by (a kind fills these, the runtime reads them)."""

    max_splits: int = 1             # most key slices per (KV head, batch) the heuristic or a call may use
    page_size: int = 0              # keys per page of a paged cache; 0: contiguous caches only
    combine: str = "kernel"         # kernel: a combine part; fused: every split function merges its group's
                                    # splits; auto: merging functions (merging_key) beside the plain ones
    unsplit_in_flight: int = 0      # K/V bytes in flight per block the split heuristic weighs (IN_FLIGHT_PER_SM);
                                    # 0: the build does not stream at full speed unsplit, waves decide alone

    @classmethod
    def of(cls, plan: ForwardPlan, **decode) -> "DecodePlan":
        """A decode plan from the forward plan of its split kernel and the decode fields (and any
        forward field to replace)."""
        return cls(**{f.name: getattr(plan, f.name) for f in fields(ForwardPlan)} | decode)

    @property
    def fused_combine(self) -> bool:
        """Every split function merges its group's splits itself."""
        return self.combine == "fused"

    @property
    def merging_functions(self) -> bool:
        """The split part has a merging function per mask beside the plain one (combine: auto)."""
        return self.combine == "auto"

    def split_key(self, mask: str, splits: int) -> str:
        """The split function a call of `splits` slices launches for `mask`."""
        return merging_key(mask) if splits > 1 and self.merging_functions else mask

    def merges_in_kernel(self, splits: int) -> bool:
        """The split kernel a call launches merges the splits itself (no combine launch)."""
        return splits > 1 and self.combine != "kernel"

    def body(self, key: str) -> str:
        return "attention_merging" if is_merging(key) else super().body(key)

    def expression_lines(self) -> list[str]:
        """A decode block's rows are several heads' new tokens: the expressions run per row (its head,
        its token as q_idx, the sequence's length as seqlen_k), the mask key by key on every tile read."""
        x = self.expression
        if x is None:
            return []
        lines = ["expressions per row: each group row evaluates them with its own head and new token (q_idx "
                 "0 .. seqlen_q - 1; seqlen_k and causal_offset are the sequence's len and len - seqlen_q)"]
        if x.mask is not None:
            lines.append("mask: key by key on every tile read; " + (
                "it reads a head, so every tile of the sequence is read" if self.expression_cuda.mask_reads_head
                else "it reads no head, so one interval classification per block of tokens 0 .. seqlen_q - 1 "
                     "against each tile (in the kernel, a lane per tile) bounds the tiles read, and the "
                     "splits share the tiles inside the bound"))
        return lines

    def key_mask(self, key: str) -> str:
        return merged_mask(key)

    @property
    def combine_part(self):
        """The combine kernel's part, or None where the split kernel merges the splits itself."""
        return self.parts[1] if len(self.parts) > 1 else None


MERGING = KeySuffix("_merging")   # function key (and name) suffix of a mask's merging split function (combine: auto)
merging_key = MERGING.key
is_merging = MERGING.has
merged_mask = MERGING.mask        # the mask of a split function key, merging or plain


def row_blocks(plan, heads: int, kv_heads: int, seqlen_q: int) -> int:
    """Blocks of block_m group rows per KV head."""
    return -(-(heads // kv_heads) * seqlen_q // plan.block_m)


def visited_tiles(n_tiles: int, block_n: int, seqlen_q: int, left: int) -> int:
    """The most K/V tiles one block of a sequence visits under a window of `left` keys (>= 0) before
    each new token: its seqlen_q tokens see seqlen_q + left keys ending at the sequence's end, which
    span at most one tile more than they fill; never more than the cache's n_tiles."""
    return min(n_tiles, -(-(seqlen_q + left) // block_n) + 1)


def num_splits(blocks: int, n_tiles: int, sm_count: int, blocks_per_sm: int, max_splits: int,
               in_flight: int = 0) -> int:
    """The fewest key slices whose wave efficiency (blocks in flight / slots of the last wave) is
    within WAVE_EFFICIENCY of the best over 1..max_splits. `blocks` = batch x kv_heads x row_blocks;
    no slice is empty for the longest sequence (n_tiles tiles). One slice when the blocks already
    fill 0.8 of the slots, or keep IN_FLIGHT_PER_SM bytes of K/V in flight per SM (`in_flight`:
    bytes one block has in flight, its ring's stages ahead of the one it computes)."""
    slots = sm_count * blocks_per_sm
    cap = max(1, min(max_splits, n_tiles))
    if blocks >= 0.8 * slots or cap == 1 or blocks * in_flight >= IN_FLIGHT_PER_SM * sm_count:
        return 1

    def efficiency(s: int) -> float:
        waves = blocks * s / slots
        return waves / math.ceil(waves)

    # only split counts that change the slice length make distinct schedules
    counts = [s for s in range(1, cap + 1) if s == 1 or -(-n_tiles // s) != -(-n_tiles // (s - 1))]
    best = max(efficiency(s) for s in counts)
    return next(s for s in counts if efficiency(s) >= WAVE_EFFICIENCY * best)
