#!/bin/bash
# One device call on the H200 (carry [".whl","out"]); out/split_decode_before.cu.j2 is templates/decode_mma/split.cu.j2
# as of b831b5d6 (git show b831b5d6:templates/decode_mma/split.cu.j2), the template before the change.
set -uo pipefail
export PYTHONUNBUFFERED=1
T=templates/decode_mma/split.cu.j2; cp $T /tmp/after.j2
F="specs/h200_decode_d64.yaml specs/h200_decode_d96.yaml specs/h200_decode_d128.yaml specs/h200_decode_d256.yaml"
timeout 150 python3 -m attngen warm --jobs 16 $F > /dev/null 2>&1; echo "warmed $(date +%T)"
timeout 150 python3 -m attngen verify $F > $OUT/verify_decode.txt 2>&1; echo "verify rc=$?"; tail -1 $OUT/verify_decode.txt
s=$(date +%s); timeout 200 python3 -m pytest -m gpu -q tests/test_gpu_kv_append.py tests/test_gpu_paged.py tests/test_gpu_decode.py tests/test_gpu_paged_varlen.py tests/test_gpu_fp8_kv.py > $OUT/pytest.txt 2>&1; echo "pytest rc=$? secs=$(( $(date +%s)-s ))"; tail -1 $OUT/pytest.txt; grep -E "^FAILED" $OUT/pytest.txt | head
for r in 1 2; do
  cp out/split_decode_before.cu.j2 $T; timeout 60 python3 docs/zoo-h200/model_zoo.py --only phi3_mini --cells paged_decode --out $OUT/zoo_phi3_before_$r.json 2>&1 | grep -v compiling | tail -3
  cp /tmp/after.j2 $T; timeout 60 python3 docs/zoo-h200/model_zoo.py --only phi3_mini --cells paged_decode --out $OUT/zoo_phi3_after_$r.json 2>&1 | grep -v compiling | tail -3
done
cp /tmp/after.j2 $T
