#!/bin/bash
# One device call (main at 5032d5cd, fp8_kv_decode.py with --eager): e4m3 d96 before (out/split_decode_main.cu.j2, 99dd6493's
# template) and after, in turn, GPU and eager; the MLA seesaw's eager before (out/split_seesaw_main.cu.j2) and after, twice.
set -uo pipefail
: "${OUT:?set OUT to a folder for the results}"
export PYTHONUNBUFFERED=1
T=templates/decode_mma/split.cu.j2; cp $T /tmp/decode_now.j2
for m in before after; do
  if [ $m = before ]; then cp out/split_decode_main.cu.j2 $T; else cp /tmp/decode_now.j2 $T; fi
  echo "== e4m3 d96 $m"; timeout 200 python3 docs/measurements/fp8_kv_decode.py --cases d96 --rounds 3 --eager --json $OUT/fp8_kv_decode_d96_$m.json 2>&1 | grep -v '^compiling'
done
cp /tmp/decode_now.j2 $T
S=templates/decode_mla/split_seesaw.cu.j2; cp $S /tmp/seesaw_now.j2
for r in 1 2; do
  cp out/split_seesaw_main.cu.j2 $S; echo "== mla before $r"; timeout 80 python3 docs/decode-h200/mla_seesaw/peel/eager_ab.py $OUT/eager_before_$r.json 3 2>&1 | grep -v '^compiling'
  cp /tmp/seesaw_now.j2 $S; echo "== mla after $r"; timeout 80 python3 docs/decode-h200/mla_seesaw/peel/eager_ab.py $OUT/eager_after_$r.json 3 2>&1 | grep -v '^compiling'
done
cp /tmp/seesaw_now.j2 $S
