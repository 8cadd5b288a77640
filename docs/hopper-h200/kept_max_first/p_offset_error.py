"""What the power of two an e4m3 P is kept at costs in accuracy, emulated on the CPU (numpy, no GPU): q, k and v
rounded to e4m3, S in float64, P = exp2(s - max + offset) rounded to e4m3 (round to nearest even, subnormals, no
value near 448 here), the output P.V over the row sums against the exact softmax of the same e4m3 inputs. The row
sums are taken of P before its rounding (as the kernels add them) and, for comparison, after.

A lower offset moves P's small end into e4m3's subnormals (below 2^-(offset + 6) of the row's max) and flushes
what is below 2^-(offset + 10) to zero; the error is set by the rounding of the large values (3 mantissa bits), so
it does not move. (Under a kept max it does: kept_max_error.py. So core/fp8.py keeps P at 2^8 there too.)

Usage: python3 docs/hopper-h200/kept_max_first/p_offset_error.py
"""
import numpy as np


def to_e4m3(x):
    """x rounded to the nearest e4m3 value (ties to even), saturating at 448."""
    a = np.abs(x)
    exponent = np.maximum(np.floor(np.log2(np.maximum(a, 2.0 ** -30))), -6)   # -6: the subnormals' exponent
    step = 2.0 ** (exponent - 3)
    return np.sign(x) * np.minimum(np.round(a / step) * step, 448.0)


def errors(rng, offset, spread, d=128, keys=8192, rows=64):
    """Largest and mean absolute error of the output, row sums of unrounded P and of rounded P."""
    q, k = (to_e4m3(rng.standard_normal((n, d)) * spread) for n in (rows, keys))
    v = to_e4m3(rng.standard_normal((keys, d)))
    s = q @ k.T / np.sqrt(d)
    p = np.exp(s - s.max(1, keepdims=True))
    ref = p @ v / p.sum(1, keepdims=True)
    s2 = s * np.log2(np.e)
    p_exact = 2.0 ** (s2 - s2.max(1, keepdims=True) + offset)
    p_rounded = to_e4m3(p_exact)
    out = []
    for sums in (p_exact, p_rounded):
        e = np.abs(p_rounded @ v / sums.sum(1, keepdims=True) - ref)
        out.append((e.max(), e.mean()))
    return out


if __name__ == "__main__":
    print("spread  offset  sums of P: max / mean error   sums of rounded P: max / mean error")
    for spread in (1.0, 2.0, 3.0):   # q and k standard normal times spread: the scores' spread
        for offset in (8, 7, 6, 5, 4):
            (a, b), (c, e) = errors(np.random.default_rng(1), offset, spread)
            print(f"{spread:6.1f}  {offset:6d}  {a:.3e} / {b:.3e}            {c:.3e} / {e:.3e}")
