#!/bin/bash
# One device call on the H200 (carry [".whl","out"]); out/split_decode_before.cu.j2 is templates/decode_mma/split.cu.j2
# as of b831b5d6 (git show b831b5d6:templates/decode_mma/split.cu.j2), the template before the change.
set -uo pipefail
export PYTHONUNBUFFERED=1
T=templates/decode_mma/split.cu.j2; cp $T /tmp/after.j2
cp out/split_decode_before.cu.j2 $T; timeout 100 python3 -m attngen warm --jobs 16 specs/h200_decode_d96.yaml > /dev/null 2>&1
cp /tmp/after.j2 $T; timeout 100 python3 -m attngen warm --jobs 16 specs/h200_decode_d96.yaml > /dev/null 2>&1; echo "warmed $(date +%T)"
for r in 1 2; do
  cp out/split_decode_before.cu.j2 $T; timeout 50 python3 docs/decode-h200/d96_copy/small_ab.py $OUT/small_before_$r.json 5 2>&1 | grep -v compiling | tail -6
  cp /tmp/after.j2 $T; timeout 50 python3 docs/decode-h200/d96_copy/small_ab.py $OUT/small_after_$r.json 5 2>&1 | grep -v compiling | tail -6
done
cp /tmp/after.j2 $T
