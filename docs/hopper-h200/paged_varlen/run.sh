#!/bin/bash
# One device call (at most LIMIT seconds, default 560): the Hopper kind's paged varlen members against the fp32
# reference with NaN page tails, page sizes 1 to 512, bit for bit their packed calls (tests/test_gpu_paged_varlen.py's
# Hopper tests), then paged_ab.py at d128 (beside the mma.sync paged cell and the packed Hopper cell), then d64 and
# d256, then the file's other tests, each as long as the call lasts.
# Usage (repository root, GPU machine): OUT=DIR [LIMIT=S] bash docs/hopper-h200/paged_varlen/run.sh
set -uo pipefail
: "${OUT:?set OUT to the folder the reports go to}"
LIMIT=${LIMIT:-560}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
s=$(date +%s)
left() { echo $(( LIMIT - ($(date +%s) - s) )); }
timeout 200 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/test_gpu_paged_varlen.py -k hopper > $OUT/hopper_tests.txt 2>&1
echo "hopper tests rc=$? secs=$(( $(date +%s)-s ))"; tail -15 $OUT/hopper_tests.txt
t=$(left); [ $t -gt 20 ] && timeout $(( t < 170 ? t : 170 )) python3 docs/hopper-h200/paged_varlen/paged_ab.py $OUT/paged_ab_d128.json 128 2>&1 | grep -v '^compiling'
t=$(left); [ $t -gt 20 ] && timeout $t python3 docs/hopper-h200/paged_varlen/paged_ab.py $OUT/paged_ab_d64_d256.json 64 256 2>&1 | grep -v '^compiling'
t=$(left); [ $t -gt 20 ] && { timeout $t python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_paged_varlen.py -k "not hopper" > $OUT/paged_tests.txt 2>&1
  echo "other paged tests rc=$? left=$t"; tail -3 $OUT/paged_tests.txt; }
true
