#!/bin/bash
# One device call (at most about 580 s) owed after the table's last changes (b010faca, d2711592): `attngen verify` over
# every spec from an empty cache, a process's first call with the cache it left, then the GPU test files that the last
# run did not finish on a cold cache (backward, wide head dims with variants, varlen with variants) on the warm one.
# Usage (repository root, GPU machine): OUT=DIR bash docs/hopper-h200/kept_max_first/members/run_owed.sh
set -uo pipefail
: "${OUT:?set OUT to the folder the reports go to}"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
export ATTNGEN_CACHE_DIR=$(mktemp -d)
python3 -m compileall -q attngen
s=$(date +%s)
timeout 280 python3 -m attngen verify > $OUT/verify_cold.txt 2> $OUT/verify_cold.err
echo "verify rc=$? secs=$(( $(date +%s)-s ))"; grep -v ' pass$' $OUT/verify_cold.txt | tail -4; tail -3 $OUT/verify_cold.err
for m in fwd fwd dec dec; do timeout 60 python3 docs/measurements/first_call.py $m; done 2>&1 | tee $OUT/first_call.txt
left=$(( 560 - ($(date +%s)-s) ))
timeout $left python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_backward.py tests/test_gpu_variants_wide_dims.py \
  tests/test_gpu_varlen_variants.py > $OUT/gpu_tests.txt 2>&1
echo "pytest rc=$? left=$left"; tail -5 $OUT/gpu_tests.txt
