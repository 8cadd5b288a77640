#!/bin/bash
# One device call on the H200 (carry [".whl"]): every e4m3 decode cell warmed, then the e4m3 GPU tests.
set -uo pipefail
export PYTHONUNBUFFERED=1
E4=$(python3 - <<'PY'
import yaml
for d in (64, 96, 128, 256):
    for c in yaml.safe_load(open(f"specs/h200_decode_d{d}.yaml"))["cells"]:
        if "e4m3" in c: print(f"specs/h200_decode_d{d}_{c}.yaml specs/h200_decode_d{d}_{c}_bf16.yaml")
PY
)
timeout 60 python3 -m attngen warm --jobs 16 $E4 > /dev/null 2>&1; echo "warmed $(date +%T)"
s=$(date +%s); timeout 120 python3 -m pytest -m gpu -q tests/test_gpu_fp8_kv.py > $OUT/pytest_fp8_kv.txt 2>&1; echo "pytest rc=$? secs=$(( $(date +%s)-s ))"; tail -1 $OUT/pytest_fp8_kv.txt; grep -E "^FAILED" $OUT/pytest_fp8_kv.txt | head
