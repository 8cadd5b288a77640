# entry_ab.py's two modes in turn, ROUNDS processes each: OUT_DIR/{before,after}[d64][bf16][op][eager]_N.json, then a summary
# (HEAD_DIM=64 in the environment: the d64 calls).
# Usage (GPU machine, repository root): bash docs/decode-h200/e4m3_b1/entry_ab.sh OUT_DIR OLD_TABLE [ROUNDS] [bf16|fp16] [op|b2b] [eager]
set -e
out=$1; old=$2; rounds=${3:-2}; q=${4:-}; op=${5:-}; eager=${6:-}
[ "$q" = fp16 ] && q=""
[ "$op" = b2b ] && op=""
[ -n "$op" ] && q="${q}op"
[ -n "$eager" ] && q="${q}eager"
[ "${HEAD_DIM:-128}" = 64 ] && q="d64${q}"
mkdir -p "$out"
for r in $(seq "$rounds"); do
  python3 docs/decode-h200/e4m3_b1/entry_ab.py "$out/before${q}_$r.json" before "$old" ${4:-} $op $eager > /dev/null
  python3 docs/decode-h200/e4m3_b1/entry_ab.py "$out/after${q}_$r.json" after "$old" ${4:-} $op $eager > /dev/null
done
python3 - "$out" "$rounds" "$q" <<'PY'
import json, sys
out, rounds, q = sys.argv[1], int(sys.argv[2]), sys.argv[3]
runs = {m: [json.load(open(f"{out}/{m}{q}_{r}.json"))["rows"] for r in range(1, rounds + 1)] for m in ("before", "after")}
for i, row in enumerate(runs["before"][0]):
    b = min(x[i]["us"] for x in runs["before"]); a = min(x[i]["us"] for x in runs["after"])
    f = min(x[i]["fp16_us"] for x in runs["after"])
    s = lambda m: ",".join(x.replace("h200_decode_", "") for x in runs[m][0][i]["specs"])
    e = ""
    if "eager_us" in row:
        eb = min(x[i]["eager_us"] for x in runs["before"]); ea = min(x[i]["eager_us"] for x in runs["after"])
        e = f"; eager {eb:7.2f} -> {ea:7.2f} ({eb / ea:.3f}x)"
    print(f'{row["dtype"]}{"op" in q and " op" or ""} {row["grid"]:18s} before {b:7.2f} ({s("before")}) after {a:7.2f} ({s("after")})  {b / a:.3f}x; 16-bit cache {f:7.2f}: {f / b:.2f}x -> {f / a:.2f}x{e}')
PY
