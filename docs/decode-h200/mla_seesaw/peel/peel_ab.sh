#!/bin/bash
# Run on the tree of 99dd6493 (main before the peel) with the peeled seesaw template (6f4c08d7's
# templates/decode_mla/split_seesaw.cu.j2) copied to out/split_seesaw_peel.cu.j2. OUT: a folder for the results.
set -uo pipefail
: "${OUT:?set OUT to a folder for the results}"
export PYTHONUNBUFFERED=1
S=templates/decode_mla/split_seesaw.cu.j2; cp $S /tmp/seesaw_main.j2
cp out/split_seesaw_peel.cu.j2 $S
python3 -m attngen compile specs/h200_decode_d576_mla.yaml > $OUT/compile_mla_peel.txt 2>&1; echo "mla compile rc=$? (0 expected)"
timeout 120 python3 -m attngen verify specs/h200_decode_d576_mla.yaml > $OUT/verify_mla_peel.txt 2>&1; tail -1 $OUT/verify_mla_peel.txt
for r in 1 2; do
  cp /tmp/seesaw_main.j2 $S; timeout 90 python3 docs/decode-h200/mla_seesaw/seesaw_ab.py $OUT/seesaw_main_$r.json 2 > /dev/null 2>&1
  cp out/split_seesaw_peel.cu.j2 $S; timeout 90 python3 docs/decode-h200/mla_seesaw/seesaw_ab.py $OUT/seesaw_peel_$r.json 2 > /dev/null 2>&1
done
cp /tmp/seesaw_main.j2 $S
