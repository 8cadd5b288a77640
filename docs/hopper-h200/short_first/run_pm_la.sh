#!/bin/bash
# schedule.longest_alone beside schedule.middle_pairs (the walk chooses per call) after the table took the members:
# verify, the persistent walks' checks, entry_check.py at the shapes they serve, then each member beside the one it
# replaced, attngen.attention and cuDNN (3 rounds alternating) over 384-1408 keys and 1-16 x 16 heads (bf16; fp16
# at a few cells), and the eager time of some calls. About 300 s:
#   bash .whl/setup.sh >/dev/null && export PYTHONPATH=/tmp/site:$PWD && OUT=$OUT bash docs/hopper-h200/short_first/run_pm_la.sh
set -uo pipefail
: "${OUT:?}"
source docs/hopper-h200/short_first/run_common.sh
NEW="d128_persistent_q2_pm_la d192_persistent_n96_pm_la_ot d192_persistent_n64s3_pm_la_ot d256_persistent_n64_pm_la_ot_sf"
checked pm_la $NEW
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_verify.py -k "persistent_walks and pm_la" > "$OUT/walks_test.txt" 2>&1
echo "walks test rc=$?"; tail -1 "$OUT/walks_test.txt"
timeout 150 python3 docs/hopper-h200/own_in_turns/entry_check.py "$OUT/entry_check_pm_la.json" \
  2x16x384x256:causal,8x16x640x256:causal,16x16x640x256:causal,3x16x1152x256:causal,16x16x896x256:causal,3x16x384x192:causal,8x16x640x192:causal,1x16x768x192:causal,8x16x896x192:causal,3x16x1152x192:causal \
  > "$OUT/entry_check_pm_la.txt" 2>&1
echo "entry_check rc=$?"; tail -1 "$OUT/entry_check_pm_la.txt"
export ATTNGEN_ENTRY=1 ATTNGEN_ROUNDS=3
timed 200 pm_la_d256 "$(wide_shapes 256)" $(bf d256_persistent_n64_pm_ot_sf d256_persistent_n64_pm_la_ot_sf)
timed 200 pm_la_d192 "$(wide_shapes 192)" $(bf d192_persistent_n96_pm_ot d192_persistent_n96_pm_la_ot d192_persistent_n64s3_pm_la_ot)
timed 150 pm_la_d128 "$(wide_shapes 128)" $(bf d128_persistent_q2_pm d128_persistent_q2_pm_la)
timed 120 pm_la_fp16 3x16x384x256,8x16x640x256,16x16x896x256,3x16x384x192,8x16x640x192,16x16x896x192 \
  $(fp d256_persistent_n64_pm_ot_sf d256_persistent_n64_pm_la_ot_sf d192_persistent_n96_pm_ot d192_persistent_n96_pm_la_ot d192_persistent_n64s3_pm_la_ot)
timeout 120 python3 docs/hopper-h200/middle_pairs/entry_eager.py "$OUT/entry_eager_pm_la.json" \
  4x16x384x256,8x16x640x256,16x16x896x256,8x16x640x192,16x16x896x192 2>&1 | grep -v '^compiling'
