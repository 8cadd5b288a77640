"""attngen.attention at the causal shapes the table now sends to the members whose walk may deal the query blocks
out in a snake (schedule.snake), and a cell on each side, checked against the fp32 reference with the error rule
(own_in_turns/entry_check.py's check: random inputs, both dtypes, a NaN anywhere fails). Prints one line per call
and exits 1 on any failure. Usage: python3 docs/hopper-h200/short_first/entry_check_snake.py OUT.json
"""
import sys
from pathlib import Path

SHAPES = ["3x16x768x128", "2x16x1152x128", "3x16x1408x128", "6x16x768x128",
          "3x16x768x192", "4x16x640x192", "2x16x1408x192", "6x16x768x192",
          "3x16x768x256", "3x16x896x256", "2x16x1152x256", "4x16x768x256", "4x12x880x192"]


def main(out_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "own_in_turns"))
    from entry_check import main as check
    return check(out_path, [(shape, "causal") for shape in SHAPES], seed=13)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
