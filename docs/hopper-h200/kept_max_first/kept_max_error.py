"""What an e4m3 P made at a kept max costs in accuracy, against the peer `attngen verify` judges e4m3 kernels by, on
the CPU (numpy, no GPU).

The verifier's inputs: standard normal q, k and v rounded to e4m3, the default scale. The peer
(attngen/eval/verify/forward_fp8.py) is torch's attention with P = exp(s - rowmax) x 2^8 rounded to e4m3, row sums
of the unrounded P. The kernel's rule is max|out - ref| <= 2 x max|peer - ref| (+ 1e-5), ref the exact softmax of
the same inputs.

Emulated here, tile by tile as the wgmma kernels walk the keys (192-key tiles at d128, 128 at d64):
- `usual`: the online step (the row's max moves at every tile that passes it), P at 2^offset;
- `kept`: softmax.lazy_rescale, the max kept until a tile's passes it by more than the slack left below 448
  (0.75 at 2^8, 1.75 at 2^7, 2.75 at 2^6, 3.75 at 2^5), P at 2^offset.

For each shape, 30 seeds of 200 query rows; per seed the ratio of the largest error to the peer's; the mean and the
largest ratio are printed. The usual step maps a row's largest score to exactly 2^offset, so the weight that
dominates a peaked row is not rounded; under a kept max it lands anywhere in [2^offset, 2^(offset + slack)] and is.
Row sums of the rounded P (the last column) do not mend it.

Usage: python3 docs/hopper-h200/kept_max_first/kept_max_error.py
"""
import numpy as np

from p_offset_error import to_e4m3

SHAPES = ((64, 511, 128), (64, 1023, 128), (128, 300, 192), (128, 511, 192), (128, 2048, 192))   # (d, keys, tile)
OFFSETS = ((8, 0.75), (7, 1.75), (6, 2.75), (5, 3.75))   # (P's power of two, the slack below 448)


def tiles_output(s2, v, tile, offset, slack, kept, rounded_sums=False):
    """The kernel's output from log2-unit scores s2: P rounded to e4m3 at 2^offset, row sums of the unrounded P (or,
    rounded_sums, of the rounded P that P.V multiplies)."""
    rows = s2.shape[0]
    m = np.full((rows, 1), -np.inf)
    o, l = np.zeros((rows, v.shape[1])), np.zeros((rows, 1))
    for t0 in range(0, s2.shape[1], tile):
        st = s2[:, t0:t0 + tile]
        tm = st.max(1, keepdims=True)
        moved = tm > m + slack if kept else tm > m
        m_new = np.where(moved, np.maximum(m, tm), m)
        alpha = np.where(np.isinf(m), 0.0, 2.0 ** (m - m_new))
        o, l, m = o * alpha, l * alpha, m_new
        p = 2.0 ** (st - m + offset)
        assert p.max() <= 448.0
        p8 = to_e4m3(p)
        o += p8 @ v[t0:t0 + tile]
        l += (p8 if rounded_sums else p).sum(1, keepdims=True)
    return o / l


def errors(seed, d, keys, tile, rows=200):
    rng = np.random.default_rng(seed)
    q, k, v = (to_e4m3(rng.standard_normal((n, d))) for n in (rows, keys, keys))
    s = q @ k.T / np.sqrt(d)
    p = np.exp(s - s.max(1, keepdims=True))
    ref = p @ v / p.sum(1, keepdims=True)
    s2 = s * np.log2(np.e)
    peer_p = 2.0 ** (s2 - s2.max(1, keepdims=True) + 8)
    peer = np.abs(to_e4m3(peer_p) @ v / peer_p.sum(1, keepdims=True) - ref).max()
    out = {"usual 2^8": np.abs(tiles_output(s2, v, tile, 8, 0, False) - ref).max() / peer,
           "usual 2^5": np.abs(tiles_output(s2, v, tile, 5, 0, False) - ref).max() / peer}
    for offset, slack in OFFSETS:
        out[f"kept 2^{offset}"] = np.abs(tiles_output(s2, v, tile, offset, slack, True) - ref).max() / peer
    out["kept 2^5, sums of rounded P"] = np.abs(tiles_output(s2, v, tile, 5, 3.75, True, True) - ref).max() / peer
    return out


if __name__ == "__main__":
    print("largest error / the peer's, mean / largest over 30 seeds (the rule allows 2)")
    for d, keys, tile in SHAPES:
        runs = [errors(seed, d, keys, tile) for seed in range(30)]
        print(f"d{d} {keys:5d} keys:", "  ".join(f"{name} {np.mean([r[name] for r in runs]):.2f}/"
                                                  f"{np.max([r[name] for r in runs]):.2f}" for name in runs[0]),
              flush=True)
