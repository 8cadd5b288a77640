#!/bin/bash
# Owed before the table takes d96's persistent_q2 and d192 v128's own_in_turns members (README, "More persistent
# cells"): with them added to tests/test_gpu_verify.py's PERSISTENT_SPECS and the table's buckets written, the
# persistent walks' GPU test for them, entry_check.py at the shapes they would serve, and attngen.attention at d96
# beside the cells served before (3 rounds alternating). About 150 s:
#   bash .whl/setup.sh >/dev/null && export PYTHONPATH=/tmp/site:$PWD && OUT=$OUT bash docs/hopper-h200/own_in_turns/run_more_final.sh
set -uo pipefail
: "${OUT:?}"
S=specs/h100_wgmma
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_verify.py -k "persistent_walks and (d96 or v128)" \
  > "$OUT/walks_test_more.txt" 2>&1
echo "walks test rc=$?"; tail -1 "$OUT/walks_test_more.txt"
timeout 120 python3 docs/hopper-h200/own_in_turns/entry_check.py "$OUT/entry_check_more.json" \
  1x8x576x96:causal+none,5x16x1000x96:causal+none,16x16x576x96:causal+none,2x16x4096x96:causal+none,1x16x8192x96:none,3x16x640x192x128:causal+none,16x16x1024x192x128:causal+none,4x16x2048x192x128:causal,1x16x4096x192x128:causal \
  > "$OUT/entry_check_more.txt" 2>&1
echo "entry_check rc=$?"; tail -1 "$OUT/entry_check_more.txt"
ATTNGEN_ENTRY=1 ATTNGEN_ROUNDS=3 timeout 100 python3 docs/hopper-h200/forward_specs_vs_cudnn.py "$OUT/final_d96.json" \
  16x16x576x96,8x16x1024x96,4x16x2048x96 ${S}_d96_persistent.yaml ${S}_d96_persistent_bf16.yaml ${S}_d96.yaml ${S}_d96_bf16.yaml \
  2>&1 | grep -v '^compiling' | grep -E 'causal|none' | cut -c1-250
