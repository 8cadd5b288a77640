"""The d128 full-mask backward, 80-row query blocks against 64-row ones, where seqlen_q and seqlen_k differ.

The table picked h100_bwd_d128_wgmma_m80[_bf16] by seqlen_k (from 725 keys), but the 80-row blocks' wasted tail
rows depend on seqlen_q (512 queries: 7 blocks of 80 = 560 rows, 48 of them empty). These cells measured that;
since then the backward looks the table up by seqlen_q (docs/performance/backward.md).

Usage: python3 docs/backward-h200/m80_cross_bench.py OUT.json [ROUNDS]

Timing as docs/backward-h200/m80_bench.py: one backward call (preprocess + main + convert) given attngen's
forward o and LSE, the two cells alternating over ROUNDS rounds (default 5), median of the rounds.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from m80_bench import compare, write   # the timing and the report of the self-attention cells

# (batch, query heads, kv heads, seqlen_q, seqlen_k)
CELLS = ((32, 16, 16, 128, 2048), (16, 16, 16, 256, 4096), (16, 16, 16, 512, 2048), (8, 16, 16, 512, 8192),
         (8, 16, 16, 1000, 2048), (4, 16, 16, 1024, 4096), (4, 16, 16, 2048, 512), (2, 16, 16, 4096, 512),
         (8, 16, 16, 2048, 1024), (4, 32, 8, 512, 4096))


def main(out, rounds=5):
    write(out, compare(((cell, {}) for cell in CELLS), rounds))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 5)
