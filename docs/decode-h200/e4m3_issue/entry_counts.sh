# entry_counts.py's two modes in turn, ROUNDS processes each: OUT_DIR/{before,after}_N.json, then the table.
# Usage (GPU machine, repository root): bash docs/decode-h200/e4m3_issue/entry_counts.sh OUT_DIR [ROUNDS]
set -e
out=$1; rounds=${2:-2}
mkdir -p "$out"
for r in $(seq "$rounds"); do
  for m in before after; do python3 docs/decode-h200/e4m3_issue/entry_counts.py "$out/${m}_$r.json" $m > /dev/null; done
done
python3 - "$out" "$rounds" <<'PY'
import json, sys
out, rounds = sys.argv[1], int(sys.argv[2])
runs = {m: [json.load(open(f"{out}/{m}_{r}.json"))["rows"] for r in range(1, rounds + 1)] for m in ("before", "after")}
for i, row in enumerate(runs["before"][0]):
    b = min(x[i]["us"] for x in runs["before"]); a = min(x[i]["us"] for x in runs["after"])
    print(f'{row["dtype"]} {row["grid"]:18s} before {b:7.2f} after {a:7.2f}  {b / a:.3f}x')
PY
