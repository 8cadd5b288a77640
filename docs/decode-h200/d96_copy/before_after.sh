#!/bin/bash
# The d96 decode copy before / after, one device call on the H200 (carry [".whl","out"]): out/split_decode_before.cu.j2 is
# templates/decode_mma/split.cu.j2 as of b831b5d6 (git show b831b5d6:templates/decode_mma/split.cu.j2). Warms and verifies
# the d96 file and every e4m3 cell, then times both templates in turn, twice, and the e4m3 / 16-bit cache ratio at d96.
set -uo pipefail
export PYTHONUNBUFFERED=1
T=templates/decode_mma/split.cu.j2; cp $T /tmp/after.j2
E4=$(python3 - <<'PY'
import yaml
for d in (64, 128, 256):
    for c in yaml.safe_load(open(f"specs/h200_decode_d{d}.yaml"))["cells"]:
        if "e4m3" in c: print(f"specs/h200_decode_d{d}_{c}.yaml specs/h200_decode_d{d}_{c}_bf16.yaml")
PY
)
cp out/split_decode_before.cu.j2 $T; timeout 120 python3 -m attngen warm --jobs 16 specs/h200_decode_d96.yaml $E4 > /dev/null 2>&1
cp /tmp/after.j2 $T; timeout 120 python3 -m attngen warm --jobs 16 specs/h200_decode_d96.yaml $E4 > /dev/null 2>&1; echo "warmed $(date +%T)"
timeout 200 python3 -m attngen verify specs/h200_decode_d96.yaml $E4 > $OUT/verify.txt 2>&1; echo "verify rc=$?"; tail -1 $OUT/verify.txt
for r in 1 2; do
  cp out/split_decode_before.cu.j2 $T; timeout 100 python3 docs/decode-h200/d96_copy/copy_ab.py $OUT/before_$r.json 3 --no-d96-e4m3 2>&1 | grep -v compiling | tail -1
  cp /tmp/after.j2 $T; timeout 100 python3 docs/decode-h200/d96_copy/copy_ab.py $OUT/after_$r.json 3 2>&1 | grep -v compiling | tail -1
done
cp /tmp/after.j2 $T
timeout 70 python3 docs/measurements/fp8_kv_decode.py --cases d96 --rounds 3 --json $OUT/fp8_kv_decode_d96.json 2>&1 | grep -v '^compiling'
