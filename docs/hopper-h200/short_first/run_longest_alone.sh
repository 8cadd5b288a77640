#!/bin/bash
# schedule.longest_alone on the odd ramps (384, 640, 896 keys with 128-row blocks): verify and the persistent walks'
# check of the trial members, Nsight Compute's DRAM bytes and SM activity beside the served members at 8x16x640, then
# 3 rounds alternating with cuDNN and attngen.attention, fp16 and bf16. About 300 s:
#   bash .whl/setup.sh >/dev/null && export PYTHONPATH=/tmp/site:$PWD && OUT=$OUT bash docs/hopper-h200/short_first/run_longest_alone.sh
set -uo pipefail
: "${OUT:?}"
source docs/hopper-h200/short_first/run_common.sh
LA="d128_persistent_q2_la d192_persistent_n96_la_ot d192_persistent_n64s3_la_ot d256_persistent_n64_la_ot_sf"
checked la $LA
timeout 120 ncu --clock-control none --profile-from-start off -k 'regex:attngen' \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct,sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_active.min \
  --csv python3 $D/ncu_specs.py 8x16x640x128,8x16x640x192,8x16x640x256 \
  $(bf d128_persistent_q2_pm d128_persistent_q2_la d192_persistent_n96_pm_ot d192_persistent_n96_la_ot d256_persistent_n64_pm_ot_sf \
       d256_persistent_n64_la_ot_sf) > "$OUT/ncu_la.csv" 2> "$OUT/ncu_la.err"
echo "ncu rc=$?"
export ATTNGEN_ENTRY=1 ATTNGEN_ROUNDS=3
timed 150 la_d256 16x16x384x256,8x16x640x256,16x16x640x256,8x16x896x256 $(both d256_persistent_n64_pm_ot_sf d256_persistent_n64_la_ot_sf)
timed 150 la_d192 16x16x384x192,8x16x640x192,16x16x640x192,8x16x896x192 \
  $(both d192_persistent_n96_pm_ot d192_persistent_n96_la_ot d192_persistent_n64s3_pm_ot d192_persistent_n64s3_la_ot)
timed 120 la_d128 16x16x384x128,8x16x640x128,16x16x640x128,8x16x896x128 $(both d128_persistent_q2_pm d128_persistent_q2_la)
