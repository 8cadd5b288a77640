#!/bin/bash
# Run on the tree of main with out/split_seesaw_main.cu.j2 (main's template) and out/split_seesaw_branch.cu.j2
# (next/mla-seesaw-arrive's, 8c9b48a9) copied in; carry [".whl","out"].
set -uo pipefail
export PYTHONUNBUFFERED=1
t=templates/decode_mla/split_seesaw.cu.j2
cp out/split_seesaw_branch.cu.j2 $t
python3 -m attngen compile specs/h200_decode_d576_mla.yaml > $OUT/compile.txt 2>&1; echo "compile rc=$? (0 expected: no C7519)"
timeout 200 python3 -m attngen verify specs/h200_decode_d576_mla.yaml > $OUT/verify_mla.txt 2>&1; tail -1 $OUT/verify_mla.txt
for r in 1 2; do
  cp out/split_seesaw_main.cu.j2 $t; timeout 100 python3 docs/decode-h200/mla_seesaw/seesaw_ab.py $OUT/main_$r.json 2 2>&1 | grep -v compiling | tail -8
  cp out/split_seesaw_branch.cu.j2 $t; timeout 100 python3 docs/decode-h200/mla_seesaw/seesaw_ab.py $OUT/branch_$r.json 2 2>&1 | grep -v compiling | tail -8
done
cp out/split_seesaw_main.cu.j2 $t
