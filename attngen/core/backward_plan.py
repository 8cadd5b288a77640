"""What every backward kind shares: the Params fields the gradients add to the forward ones, and
the numbers of its row kernels (preprocess and convert). The backward call
(attngen/runtime/calls/backward.py) and each backward kind read these; none of it names a kind.

A backward bundle runs three kernels on one Params:
- preprocess: delta = rowsum(dO * O) per query row (fp32), and zeros in the fp32 dQ accumulator;
- main: one block per key block (and KV head, batch) recomputes P from Q, K and the forward's LSE,
  keeps dK and dV in registers and adds its share of dQ into the accumulator (fp32 atomics);
- convert: dQ = scale * accumulator, in the element type, with the caller's strides.
"""
from __future__ import annotations

from .abi import float32, float_pointer, pointer
from .forward_plan import stride_fields

ROW_THREADS = 128           # threads per block of the preprocess and convert kernels
VECTOR = 8                  # elements each of their threads reads per row (one 16-byte vector)


BACKWARD_ABI_FIELDS = (
    pointer("dout", "dO, the gradient of the output, shaped like o"),
    pointer("dq", "gradient of q, shaped like q (written by the convert kernel)", const=False),
    pointer("dk", "gradient of k, shaped like k", const=False),
    pointer("dv", "gradient of v, shaped like v", const=False),
    *stride_fields("dout", "dout"), *stride_fields("dq", "dq"), *stride_fields("dk", "dk"),
    *stride_fields("dv", "dv"),
    float_pointer("dq_accum", "fp32 (batch, heads, seqlen_q, head_dim), contiguous: dQ / scale as the main kernel's "
                  "blocks add it up; zeroed by the preprocess kernel"),
    float_pointer("delta", "fp32 (batch, heads, seqlen_q), contiguous: rowsum(dO * O) of every query row"),
    float32("scale", "the softmax scale: dQ and dK carry it (dS is the gradient of the scaled score)"),
)

# The Params fields the main kernel leaves to the row kernels (it reads every other one).
MAIN_UNREAD = ("o", "o_batch_stride", "o_head_stride", "o_row_stride", "batch", "dq", "dq_batch_stride",
               "dq_head_stride", "dq_row_stride")
# The Params fields each row kernel reads (they launch with the main kernel's bytes).
PREPROCESS_READS = ("o", "o_batch_stride", "o_head_stride", "o_row_stride", "dout", "dout_batch_stride",
                    "dout_head_stride", "dout_row_stride", "dq_accum", "delta", "heads", "seqlen_q")
CONVERT_READS = ("dq", "dq_batch_stride", "dq_head_stride", "dq_row_stride", "dq_accum", "heads", "seqlen_q",
                 "scale")


def rows_per_row_block(head_dim: int) -> int:
    """Query rows one preprocess or convert block covers: ROW_THREADS threads, head_dim / VECTOR per row."""
    return ROW_THREADS // (head_dim // VECTOR)


def row_grid(head_dim: int, batch: int, heads: int, seqlen_q: int) -> tuple[int, int, int]:
    """The grid of the preprocess and convert kernels: (row blocks, heads, batch)."""
    return (-(-seqlen_q // rows_per_row_block(head_dim)), heads, batch)
