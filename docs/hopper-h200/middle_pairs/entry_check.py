"""attngen.attention at the shapes the table now sends to the middle_pairs members (and the cells around them),
checked against the fp32 reference with the error rule (<= 2x torch's own low-precision attention's error, plus
the floor); random inputs (a NaN anywhere fails), both dtypes, causal. Prints one line per call and exits 1 on any
failure. Usage: python3 docs/hopper-h200/middle_pairs/entry_check.py OUT.json
"""
import sys
from pathlib import Path

SHAPES = ["8x16x256x128", "24x16x256x128", "16x16x384x128", "32x16x384x128", "8x16x640x128", "16x16x576x128",
          "4x16x704x128", "16x16x640x192", "8x16x768x192", "16x16x640x256", "8x16x640x256", "8x16x1024x256",
          "9x25x384x128"]


def main(out_path):
    # The check itself is own_in_turns/entry_check.py's (it takes full masks too); these shapes are causal only.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "own_in_turns"))
    from entry_check import main as check
    return check(out_path, [(shape, "causal") for shape in SHAPES], seed=7)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
