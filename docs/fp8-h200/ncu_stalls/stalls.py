"""Where the e4m3 forward's warps wait: the stall samples of Nsight Compute's source page, per reason and per
instruction, for the main loop (the instructions run once per K/V tile by every consumer warp).

Usage: python3 docs/fp8-h200/ncu_stalls/stalls.py [SASS_CSV(.gz)] [TOP]
The CSV is `ncu --import REPORT --page source --csv --print-source sass` of a report taken with
`ncu --clock-control none --kernel-name regex:attngen_.*fp8 --launch-skip 2 --launch-count 1 --section SourceCounters
--section WarpStateStats ... python3 docs/fp8-h200/ncu_stalls/ncu_fp8_calls.py` (default: ncu_d128_fp8_sass.csv.gz here).
"""
import collections
import csv
import gzip
import io
import sys
from pathlib import Path


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main(path: Path, top: int = 25):
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    rows = list(csv.reader(io.StringIO(text)))
    header, body = rows[1], rows[2:]
    col = {name: i for i, name in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    samples = col["Warp Stall Sampling (All Samples)"]
    executed = col["Instructions Executed"]
    # The main loop: the instructions executed most often (once per tile by every consumer warp).
    count = collections.Counter(number(r[executed]) for r in body)
    loop_count = max(c for c in count if count[c] >= 50)
    loop = [r for r in body if number(r[executed]) == loop_count]
    total = sum(number(r[samples]) for r in body)
    in_loop = sum(number(r[samples]) for r in loop)
    print(f"{path.name}: {total:.0f} samples, {in_loop:.0f} ({100 * in_loop / total:.1f} %) in the loop "
          f"({len(loop)} instructions, each executed {loop_count:.0f} times)")
    by_reason = {r[6:]: sum(number(x[col[r]]) for x in loop) for r in reasons}
    for name, n in sorted(by_reason.items(), key=lambda kv: -kv[1])[:10]:
        print(f"  {name:16} {n:8.0f}  {100 * n / in_loop:5.1f} %")
    by_opcode = collections.Counter()
    for r in loop:
        by_opcode[r[1].split()[0] if not r[1].strip().startswith("@") else r[1].split()[1]] += 1
    print("  loop instructions by opcode:", ", ".join(f"{op.split('.')[0]} {n}" for op, n in by_opcode.most_common(14)))
    print(f"the {top} loop instructions with the most samples:")
    for r in sorted(loop, key=lambda r: -number(r[samples]))[:top]:
        main_reasons = sorted(((number(r[col[x]]), x[6:]) for x in reasons), reverse=True)[:2]
        print(f"  {number(r[samples]):6.0f}  {r[1].strip()[:58]:58}  " + ", ".join(f"{n} {v:.0f}" for v, n in main_reasons if v))


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else here / "ncu_d128_fp8_sass.csv.gz",
         int(sys.argv[2]) if len(sys.argv) > 2 else 25)
