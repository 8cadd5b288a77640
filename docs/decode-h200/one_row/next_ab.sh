# The one-row route with and without forward()'s prepared call (branch next/one-row-prepared), alternating
# processes, two rounds, then SDPA through attngen.enable() with each: OUT_DIR/{plain,prepared}_N.json,
# OUT_DIR/enabled_{plain,prepared}.json; then 2, 4 and 8 query rows per head, causal bottom-right, forward kernel
# (before) against the route (after): OUT_DIR/sq{2,4,8}_{before,after}.json. Usage (GPU machine, repository root): bash docs/decode-h200/one_row/next_ab.sh OUT_DIR
set -e
out=$1; mkdir -p "$out"
for r in 1 2; do
  PREPARED=0 MODE=after python3 docs/decode-h200/one_row/one_row.py "$out/plain_$r.json" > /dev/null 2>&1
  MODE=after python3 docs/decode-h200/one_row/one_row.py "$out/prepared_$r.json" > /dev/null 2>&1
done
PREPARED=0 ENABLE=1 python3 docs/decode-h200/one_row/one_row.py "$out/enabled_plain.json" > /dev/null 2>&1
ENABLE=1 python3 docs/decode-h200/one_row/one_row.py "$out/enabled_prepared.json" > /dev/null 2>&1
for sq in 2 4 8; do   # speculative decoding's drafts: the route past one row (ROUTE_MAX_SEQLEN_Q), causal bottom-right
  SQ=$sq MODE=before python3 docs/decode-h200/one_row/one_row.py "$out/sq${sq}_before.json" > /dev/null 2>&1
  SQ=$sq MODE=after python3 docs/decode-h200/one_row/one_row.py "$out/sq${sq}_after.json" > /dev/null 2>&1
done
for variant in softcap sinks window; do   # forward_variant's route (err: against plain attention, not the variant's)
  VARIANT=$variant MODE=before python3 docs/decode-h200/one_row/one_row.py "$out/${variant}_before.json" > /dev/null 2>&1
  VARIANT=$variant MODE=after python3 docs/decode-h200/one_row/one_row.py "$out/${variant}_after.json" > /dev/null 2>&1
done
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
runs = {m: [json.load(open(f"{out}/{m}_{r}.json"))["rows"] for r in (1, 2)] for m in ("plain", "prepared")}
en = {m: json.load(open(f"{out}/enabled_{m}.json"))["rows"] for m in ("plain", "prepared")}
for i, row in enumerate(runs["plain"][0]):
    g = lambda m, w: min(x[i][w]["attention"] for x in runs[m])
    print(f'{row["grid"]:22s} GPU {g("plain", "gpu_us"):8.2f} -> {g("prepared", "gpu_us"):8.2f}  eager '
          f'{g("plain", "eager_us"):8.2f} -> {g("prepared", "eager_us"):8.2f}  sdpa eager '
          f'{en["plain"][i]["eager_us"]["sdpa_through_attngen"]:8.2f} -> {en["prepared"][i]["eager_us"]["sdpa_through_attngen"]:8.2f}')
for sq in ("sq2", "sq4", "sq8", "softcap", "sinks", "window"):
    b, a = (json.load(open(f"{out}/{sq}_{m}.json"))["rows"] for m in ("before", "after"))
    for x, y in zip(b, a):
        print(f'{sq} {x["grid"]:22s} GPU {x["gpu_us"]["attention"]:8.2f} -> {y["gpu_us"]["attention"]:8.2f} '
              f'(sdpa {y["gpu_us"]["sdpa_default"]:8.2f}) eager {x["eager_us"]["attention"]:8.2f} -> '
              f'{y["eager_us"]["attention"]:8.2f}; err {x["err"]["attention"]:.1e} / {y["err"]["attention"]:.1e}')
PY
