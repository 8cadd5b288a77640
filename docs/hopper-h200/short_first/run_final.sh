#!/bin/bash
# After the table took d256's short_first member for its causal calls from 384 to 1448 keys: entry_check.py at the
# shapes it serves, attngen.attention beside the member served before and cuDNN (3 rounds alternating, fp16 and
# bf16), and the eager time of those calls (docs/hopper-h200/middle_pairs/entry_eager.py). About 120 s:
#   bash .whl/setup.sh >/dev/null && export PYTHONPATH=/tmp/site:$PWD && OUT=$OUT bash docs/hopper-h200/short_first/run_final.sh
set -uo pipefail
: "${OUT:?}"
source docs/hopper-h200/short_first/run_common.sh
timeout 120 python3 docs/hopper-h200/own_in_turns/entry_check.py "$OUT/entry_check_sf.json" \
  16x16x384x256:causal,16x16x512x256:causal,3x16x640x256:causal,16x16x640x256:causal,8x16x768x256:causal,4x16x1448x256:causal \
  > "$OUT/entry_check_sf.txt" 2>&1
echo "entry_check rc=$?"; tail -1 "$OUT/entry_check_sf.txt"
ATTNGEN_ENTRY=1 ATTNGEN_ROUNDS=3 timeout 150 python3 docs/hopper-h200/forward_specs_vs_cudnn.py "$OUT/final_sf_d256.json" \
  16x16x384x256,16x16x512x256,16x16x640x256,8x16x768x256,16x16x1024x256 \
  ${S}_d256_persistent_n64_pm_ot.yaml ${S}_d256_persistent_n64_pm_ot_bf16.yaml 2>&1 | grep -v '^compiling' | grep causal | cut -c1-250
timeout 120 python3 docs/hopper-h200/middle_pairs/entry_eager.py "$OUT/entry_eager_sf.json" \
  16x16x384x256,16x16x512x256,16x16x640x256,8x16x768x256,16x16x1024x256 2>&1 | grep -v '^compiling'
