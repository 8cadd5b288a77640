#!/bin/bash
# One device call (at most about 570 s) after the three specs' commit: `attngen verify` over every spec from an empty
# cache, a process's first call with the cache it left, attngen.attention on the new cells (entry_members.py), then
# the GPU tests through the entry points on the same cache, as long as the call lasts.
# Usage (repository root, GPU machine): OUT=DIR bash docs/hopper-h200/kept_max_first/members/run_after.sh
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
timeout 60 python3 docs/hopper-h200/kept_max_first/members/entry_members.py $OUT/entry_members.json 2>&1 | grep -v '^compiling'
timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_window_softcap.py tests/test_gpu_ops.py \
  tests/test_gpu_model_zoo.py tests/test_gpu_first_call.py tests/test_gpu_lazy_rescale.py > $OUT/gpu_tests.txt 2>&1
echo "pytest rc=$?"; tail -5 $OUT/gpu_tests.txt
