"""How often softmax.kept_max_first falls back to the usual step, counted on the CPU (numpy, no GPU): the share of
tiles after a row's first in which some row of a warp (16 rows) moves its max, on the scores of random normal q
and k (the bench's inputs: a score is q.k, scaled by head_dim^-1/2), full mask, 20 warps a cell.

Usage: python3 docs/hopper-h200/kept_max_first/fallback_rate.py
"""
import numpy as np

CELLS = [   # head dim, keys per tile, slack (log2 units), keys
    (128, 192, 0.75, 2048), (128, 192, 0.75, 8192), (128, 192, 0.75, 16384),   # e4m3 d128
    (64, 128, 0.75, 2048), (64, 128, 0.75, 8192),                              # e4m3 d64
    (64, 128, 8.0, 1024), (64, 128, 8.0, 8192), (128, 128, 8.0, 8192),         # 16-bit
    (128, 192, 2.75, 2048), (128, 192, 2.75, 8192), (64, 128, 2.75, 2048), (64, 128, 2.75, 8192),  # e4m3 P at 2^6
    (128, 192, 3.75, 2048), (128, 192, 3.75, 8192), (64, 128, 3.75, 2048), (64, 128, 3.75, 8192),  # e4m3 P at 2^5
]


def fallback_share(rng, d, tile, slack, keys, warps=20, rows=16):
    scale_log2 = np.log2(np.e) / np.sqrt(d)
    shares = []
    for _ in range(warps):
        s = rng.standard_normal((rows, keys)) * np.sqrt(d)
        row_max, fell, tiles = np.full(rows, -np.inf), 0, 0
        for t0 in range(0, keys, tile):
            m_tile = np.maximum(row_max, s[:, t0:t0 + tile].max(1))
            kept = (m_tile - row_max) * scale_log2 <= slack
            if t0:
                tiles += 1
                fell += not kept.all()
            row_max = np.where(kept, row_max, m_tile)
        shares.append(fell / tiles)
    return float(np.mean(shares))


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    for d, tile, slack, keys in CELLS:
        print(f"d{d} {tile}-key tiles, slack {slack}, {keys} keys: {fallback_share(rng, d, tile, slack, keys):.3f} "
              f"of the tiles after the first fall back")
