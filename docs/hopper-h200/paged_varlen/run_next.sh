#!/bin/bash
# One device call (at most LIMIT seconds, default 560), owed after the paged Hopper members entered the table:
# tests/test_gpu_paged_varlen.py whole (the members' Params without the pools' strides, the tests that now compare
# the served paged cell's own packed call), trials_ab.py (every lane copying; d64 with a producer warpgroup), then
# FlashAttention's test_flash_attn_varlen_causal (paged pools of 256 and 512 keys, FA_SAMPLE=4) where out/fa holds
# FA's test file (`bash docs/fa-tests/run.sh prepare` here, then carry out/fa), each as long as the call lasts.
# Usage (repository root, GPU machine): OUT=DIR [LIMIT=S] bash docs/hopper-h200/paged_varlen/run_next.sh
set -uo pipefail
: "${OUT:?set OUT to the folder the reports go to}"
LIMIT=${LIMIT:-560}
export PYTHONUNBUFFERED=1
HERE=docs/hopper-h200/paged_varlen
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
s=$(date +%s)
left() { echo $(( LIMIT - ($(date +%s) - s) )); }
timeout 230 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_paged_varlen.py > $OUT/paged_tests.txt 2>&1
echo "paged tests rc=$? secs=$(( $(date +%s)-s ))"; grep -E "^(FAILED|ERROR)" $OUT/paged_tests.txt | head; tail -1 $OUT/paged_tests.txt
t=$(left); [ $t -gt 20 ] && timeout $(( t < 240 ? t : 240 )) python3 $HERE/trials_ab.py $OUT/trials_ab.json 2>&1 | grep -v '^compiling'
t=$(left); [ $t -gt 60 ] && [ -f out/fa/test_flash_attn.py ] && {
  FA_SAMPLE=4 FA_TIME_BUDGET=$(( t - 30 )) FA_REPORT=$OUT/fa_varlen_causal.json timeout $t \
    bash docs/fa-tests/run.sh "test_flash_attn_varlen_causal" -n 8 > $OUT/fa_varlen_causal.txt 2>&1
  echo "FA varlen causal rc=$?"; tail -4 $OUT/fa_varlen_causal.txt; }
true
