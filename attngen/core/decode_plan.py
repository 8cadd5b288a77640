"""What every decode kind shares: the Params fields a split-KV decode adds to the forward ones, the
group rows (a KV head's query heads x new tokens), and the number of key slices (splits) a launch
uses. The decode call (attngen/runtime/calls/decode.py) and each decode kind read these; none of it
names a kind."""
from __future__ import annotations

from dataclasses import dataclass, fields

from .abi import float_pointer, int32, pointer
from .append_abi import APPEND_ABI_FIELDS, APPEND_FIELDS
from .forward_plan import ForwardPlan
# The split arithmetic (the heuristic, split_key, merges_in_kernel) lives in core.launch_rules: the
# runtime's LaunchPlan runs it too.
from .launch_rules import MERGING, STEP_ROWS, merges_in_kernel, split_key

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
    int32("page_size", "keys per page of the k and v pools: a power of two, 1 to MAX_PAGE_SIZE (0: contiguous)",
          default=0),
    int32("page_shift", "log2(page_size): key j lies in table entry j >> page_shift, row j & (page_size - 1)",
          default=0),
    pointer("query_rows", "int32 (batch + 1,): a serving step's rows functions (`_rows` keys) read sequence b's "
            "queries at rows query_rows[b] .. query_rows[b + 1] of a packed q (cu_seqlens_q; q and o's batch stride "
            "is their row stride): a sequence of exactly one query is decoded at its row, the others are left to "
            "the varlen kernel (its blocks return at once); null in other calls", optional=True),
    int32("query_total", "rows functions: rows of q and o; query_rows is clamped to [0, query_total]", default=0),
)
# The fields only a paged cache needs: a contiguous-only plan's Params leaves them out.
PAGE_FIELDS = ("block_table", "table_stride", "num_pages", "page_size", "page_shift")
# The fields only a plan with a serving step's rows functions reads (DecodePlan.step_rows); others leave them out.
STEP_ROW_FIELDS = ("query_rows", "query_total")
# One list: the append fields come last, so every other field keeps its offset in any plan.
DECODE_ABI_FIELDS = DECODE_ABI_FIELDS + APPEND_ABI_FIELDS
# The fields only an e4m3 KV cache needs, after DECODE_ABI_FIELDS in its plan's Params; a plan of fp16/bf16
# caches never has them (not even as omitted fields), so its Params and launch record stay as they were.
KV_SCALE_ABI_FIELDS = (
    pointer("k_scale", "fp32 scale(s) of an e4m3 k cache (dequantised k = e4m3 x scale): one per tensor "
            "(kv_scale_stride 0) or one per KV head (1); null: 1", optional=True),
    pointer("v_scale", "fp32 scale(s) of an e4m3 v cache, laid out as k_scale's; null: 1", optional=True),
    int32("kv_scale_stride", "elements between KV heads' entries of k_scale and v_scale: 0 one scale per tensor, "
          "1 one per KV head", default=0),
)
KV_SCALE_FIELDS = tuple(f.name for f in KV_SCALE_ABI_FIELDS)
KV_FOLD = 256.0     # e4m3 bits moved into a bf16 element read e4m3 x 2^-8 (templates/decode_mma/split.cu.j2,
                    # kv_pair): the kernel folds 2^8 into the softmax scale and the output factor


@dataclass(frozen=True)
class DecodePlan(ForwardPlan):
    """The plan of a decode bundle, the decode call convention's: the forward plan of its split
    kernel (parts[0]) plus what a decode call decides by (a kind fills these, the runtime reads them)."""

    max_splits: int = 1             # most key slices per (KV head, batch) the heuristic or a call may use
    paged: bool = False             # the kernel also reads paged caches, of any page size (page_size, page_shift
                                    # in Params); false: contiguous caches only
    combine: str = "kernel"         # kernel: a combine part; fused: every split function merges its group's
                                    # splits; auto: merging functions (merging_key) beside the plain ones
    append: bool = False            # the kernel writes a call's new tokens (k_new, v_new, rotated) into the cache
                                    # and attends them; false: no append fields in Params, no append code
    unsplit_in_flight: int = 0      # K/V bytes in flight per block the split heuristic weighs (IN_FLIGHT_PER_SM);
                                    # 0: the build does not stream at full speed unsplit, waves decide alone
    merge_rows: int = 1             # combine: auto or fused: group rows a warp of the merging block merges at once
    slice_cost_min_tiles: int = 0   # combine: kernel: the split rule takes the slice cost from this many tiles
                                    # (launch_rules.num_splits); 0: the wave rule at every length
    co_resident_blocks: int = 1     # blocks per SM the split rule counts where a call's grid and cache are large
                                    # (launch_rules.split_blocks_per_sm): 2 for an e4m3 cell two of whose blocks fit
    co_resident_min_tiles: int = 0  # merging cells: the tiles from which those blocks are counted; 0:
                                    # launch_rules.CO_RESIDENT_MIN_TILES
    kv_dtype: str = ""              # "e4m3": the K/V cache holds e4m3 (queries and output in the spec's dtype);
                                    # "": the cache is in the spec's dtype
    kv_mma: str = ""                # e4m3 cache: "fp16": the tensor cores take fp16 operands whatever the queries'
                                    # type (bf16 queries converted in registers); "": the queries' type
    kv_pitch_bytes: int = 0         # e4m3 cache: bytes per row of a K/V tile (head_dim, padded to an odd number
                                    # of 16-byte chunks so that 8 consecutive rows fall on 8 bank groups)
    combine_slices: int = 1         # warps sharing each output row's columns in the combine kernel (its grid y)
    combine_wide_slices: int = 0    # the same for the combine part's wide function (launch_rules.WIDE_COMBINE),
                                    # which calls of many splits launch; 0: the part has none
    v_in_k: bool = False            # V is the first v_dim columns of each K row (one latent cache, as MLA's): the
                                    # kernel reads V from K's tiles, and a call's v_cache must be k_cache[..., :v_dim]
    interleaved_splits: bool = False  # split s reads tiles s, s + num_splits, ... (split_tiles: interleaved); false:
                                      # a contiguous run of tiles_per_split tiles
    row_mods_per_tile: bool = False  # the score modifiers' per-row values (RowMods) are made again at every tile
                                    # instead of held across the key loop (registers: kinds' row_mods_per_tile)
    step_rows: bool = False         # the split part (and the combine part) also has rows functions (`_rows` keys) of
                                    # mask none: a serving step's single-query sequences decoded in place in its packed
                                    # q and o (query_rows), the varlen kernel taking the others in the same output

    @classmethod
    def of(cls, plan: ForwardPlan, **decode) -> "DecodePlan":
        """A decode plan from the forward plan of its split kernel and the decode fields (and any
        forward field to replace)."""
        return cls(**{f.name: getattr(plan, f.name) for f in fields(ForwardPlan)} | decode)

    @property
    def kv_fold(self) -> float:
        """The power of two an e4m3 cache's scales take back from the tiles' widened values: 1 where they
        widen to fp16 through cvt.rn.f16x2.e4m3x2 (exact values), KV_FOLD for bf16, whose bit moves
        read e4m3 x 2^-8 (templates/decode_mma/split.cu.j2, kv_bytes)."""
        return 1.0 if self.widens_to_fp16 else KV_FOLD

    @property
    def widens_to_fp16(self) -> bool:
        """An e4m3 cache's tiles widen to fp16 (cvt.rn.f16x2.e4m3x2) and the tensor cores take fp16: fp16
        queries, or bf16 ones with kv_mma fp16."""
        return bool(self.kv_dtype) and (self.spec.dtype == "fp16" or self.kv_mma == "fp16")

    @property
    def converts_q(self) -> bool:
        """bf16 queries become fp16 fragments in registers (kv_mma fp16), scaled by a power of two."""
        return self.widens_to_fp16 and self.spec.dtype != "fp16"

    @property
    def fused_combine(self) -> bool:
        """Every split function merges its group's splits itself."""
        return self.combine == "fused"

    @property
    def merging_functions(self) -> bool:
        """The split part has a merging function per mask beside the plain one (combine: auto)."""
        return self.combine == "auto"

    def split_key(self, mask: str, splits: int, step_rows: bool = False) -> str:
        """The split function a call of `splits` slices launches for `mask` (step_rows: its rows function)."""
        return split_key(self.combine, mask, splits, step_rows)

    def merges_in_kernel(self, splits: int) -> bool:
        """The split kernel a call launches merges the splits itself (no combine launch)."""
        return merges_in_kernel(self.combine, splits)

    def body(self, key: str) -> str:
        """The C++ function a split entry point runs: attention, attention_merging, or their rows twins."""
        plain = STEP_ROWS.mask(key)
        body = "attention_merging" if is_merging(plain) else super().body(plain)
        return body + "_rows" if is_rows(key) else body

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
        return merged_mask(STEP_ROWS.mask(key))

    @property
    def combine_part(self):
        """The combine kernel's part, or None where the split kernel merges the splits itself."""
        return self.parts[1] if len(self.parts) > 1 else None


is_merging = MERGING.has
is_rows = STEP_ROWS.has            # a serving step's rows function (split or combine)
merged_mask = MERGING.mask        # the mask of a split function key, merging or plain
