#!/bin/bash
# schedule.short_first on the short causal cells: verify and the persistent walks' GPU test of the trial members,
# Nsight Compute's DRAM bytes and SM activity of each member beside its short_first twin, then the members against
# cuDNN and attngen.attention, 3 rounds alternating, bf16. About 400 s:
#   bash .whl/setup.sh >/dev/null && export PYTHONPATH=/tmp/site:$PWD && OUT=$OUT bash docs/hopper-h200/short_first/run_trial.sh
set -uo pipefail
: "${OUT:?}"
source docs/hopper-h200/short_first/run_common.sh
SF="d128_persistent_q2_sf d128_persistent_q2_pm_sf d192_persistent_n96_pm_ot_sf d256_persistent_n64_pm_ot_sf"
timeout 200 python3 -m attngen verify $(both $SF) > "$OUT/verify_sf.txt" 2> "$OUT/verify_sf.err"
echo "verify rc=$?"; tail -1 "$OUT/verify_sf.txt"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_verify.py -k "persistent_walks and sf" > "$OUT/walks_sf.txt" 2>&1
echo "walks test rc=$?"; tail -1 "$OUT/walks_sf.txt"
timeout 150 ncu --clock-control none --profile-from-start off -k 'regex:attngen' \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_active.min \
  --csv python3 $D/ncu_specs.py 16x16x512x256,16x16x640x256,8x16x640x256,16x16x512x192,8x16x640x192,16x16x512x128,8x16x640x128 \
  $(bf d256_persistent_n64_pm_ot d256_persistent_n64_pm_ot_sf d192_persistent_n96_pm_ot d192_persistent_n96_pm_ot_sf \
       d128_persistent_q2 d128_persistent_q2_sf) > "$OUT/ncu_sf.csv" 2> "$OUT/ncu_sf.err"
echo "ncu rc=$?"
export ATTNGEN_ENTRY=1 ATTNGEN_ROUNDS=3
timed 150 sf_d256 16x16x512x256,8x16x640x256,16x16x640x256,8x16x768x256,16x16x1024x256 \
  $(bf d256_persistent_n64_pm_ot d256_persistent_n64_pm_ot_sf)
timed 120 sf_d192 16x16x512x192,8x16x640x192,16x16x640x192,16x16x1024x192 $(bf d192_persistent_n96_pm_ot d192_persistent_n96_pm_ot_sf)
timed 150 sf_d128 16x16x512x128,8x16x640x128,16x16x640x128,16x16x1024x128,4x16x2048x128 \
  $(bf d128_persistent_q2 d128_persistent_q2_sf d128_persistent_q2_pm d128_persistent_q2_pm_sf)
