#!/bin/bash
# One device call (at most about 560 s): the Hopper kind's paged varlen member against the fp32 reference with NaN
# page tails, page sizes 1 to 512, bit for bit its packed call (tests/test_gpu_paged_varlen.py's Hopper tests), then
# paged_ab.py (beside the mma.sync paged cell and the packed Hopper cell), then the file's other tests.
# Usage (repository root, GPU machine): OUT=DIR bash docs/hopper-h200/paged_varlen/run.sh
set -uo pipefail
: "${OUT:?set OUT to the folder the reports go to}"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
s=$(date +%s)
timeout 180 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/test_gpu_paged_varlen.py -k hopper > $OUT/hopper_tests.txt 2>&1
echo "hopper tests rc=$? secs=$(( $(date +%s)-s ))"; tail -15 $OUT/hopper_tests.txt
timeout 280 python3 docs/hopper-h200/paged_varlen/paged_ab.py $OUT/paged_ab.json 2>&1 | grep -v '^compiling'
left=$(( 560 - ($(date +%s)-s) ))
timeout $left python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_paged_varlen.py -k "not hopper" > $OUT/paged_tests.txt 2>&1
echo "other paged tests rc=$? left=$left"; tail -3 $OUT/paged_tests.txt
