#!/bin/bash
# After the table took d192's 64-key, 3-stage member for causal calls to 886 keys: the persistent walks' GPU test of
# it, entry_check.py at the shapes it serves (and just past), attngen.attention beside the member served before and
# cuDNN (3 rounds alternating, fp16 and bf16), and the eager time of those calls. About 120 s:
#   bash .whl/setup.sh >/dev/null && export PYTHONPATH=/tmp/site:$PWD && OUT=$OUT bash docs/hopper-h200/short_first/run_final_d192.sh
set -uo pipefail
: "${OUT:?}"
source docs/hopper-h200/short_first/run_common.sh
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_verify.py -k "persistent_walks and n64s3" > "$OUT/walks_n64s3.txt" 2>&1
echo "walks test rc=$?"; tail -1 "$OUT/walks_n64s3.txt"
timeout 120 python3 docs/hopper-h200/own_in_turns/entry_check.py "$OUT/entry_check_d192.json" \
  16x16x384x192:causal,16x16x512x192:causal,8x16x640x192:causal,3x16x800x192:causal,8x16x886x192:causal,8x16x887x192:causal \
  > "$OUT/entry_check_d192.txt" 2>&1
echo "entry_check rc=$?"; tail -1 "$OUT/entry_check_d192.txt"
ATTNGEN_ENTRY=1 ATTNGEN_ROUNDS=3 timeout 150 python3 docs/hopper-h200/forward_specs_vs_cudnn.py "$OUT/final_d192.json" \
  1x8x384x192,2x16x512x192,1x16x768x192,16x16x384x192,16x16x512x192,8x16x640x192,16x16x640x192,8x16x768x192,16x16x1024x192 \
  ${S}_d192_persistent_n96_pm_ot.yaml ${S}_d192_persistent_n96_pm_ot_bf16.yaml 2>&1 | grep -v '^compiling' | grep causal | cut -c1-250
timeout 120 python3 docs/hopper-h200/middle_pairs/entry_eager.py "$OUT/entry_eager_d192.json" \
  16x16x384x192,16x16x512x192,8x16x640x192,16x16x640x192,8x16x768x192 2>&1 | grep -v '^compiling'
