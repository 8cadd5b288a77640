#!/bin/bash
# On next/e4m3-d96-rows's tree (git checkout next/e4m3-d96-rows first): three modes in turn, twice:
#   main: main's template (out/split_decode_main.cu.j2) and main's table (out/table_main.yaml);
#   rows: the branch's template (the one-chunk-a-thread e4m3 d96 copy), main's table;
#   cell: the branch's template and table (contiguous d96 e4m3 calls on h200_decode_d96_kv_e4m3_contiguous).
# out/split_decode_main.cu.j2 and out/table_main.yaml are 99dd6493's template and table (git show 99dd6493:PATH). OUT: a folder.
set -uo pipefail
: "${OUT:?set OUT to a folder for the results}"
export PYTHONUNBUFFERED=1
T=templates/decode_mma/split.cu.j2; cp $T /tmp/decode_rows.j2
timeout 120 python3 -m attngen warm --jobs 16 specs/h200_decode_d96.yaml > /dev/null 2>&1
timeout 120 python3 -m attngen verify specs/h200_decode_d96.yaml > $OUT/d96_verify.txt 2>&1; tail -1 $OUT/d96_verify.txt
for r in 1 2; do
  cp out/split_decode_main.cu.j2 $T; timeout 90 python3 docs/decode-h200/d96_copy/copy_ab.py $OUT/main_$r.json 3 --table out/table_main.yaml > /dev/null 2>&1
  cp /tmp/decode_rows.j2 $T; timeout 90 python3 docs/decode-h200/d96_copy/copy_ab.py $OUT/rows_$r.json 3 --table out/table_main.yaml > /dev/null 2>&1
  timeout 90 python3 docs/decode-h200/d96_copy/copy_ab.py $OUT/cell_$r.json 3 > /dev/null 2>&1
done
cp /tmp/decode_rows.j2 $T
python3 - <<'PY'
import json, os
o = os.environ["OUT"]
k = lambda x: (x["cache"], x["query"], x["batch"], x["kv_heads"], x["head_dim"], x["keys"], x["layout"])
for r in (1, 2):
    m, w, c = ({k(x): x for x in json.load(open(f"{o}/{n}_{r}.json"))["rows"]} for n in ("main", "rows", "cell"))
    for key in m:
        print(r, key, "main", m[key]["us"], "rows", w[key]["us"], "cell", c[key]["us"], c[key]["specs"])
PY
