#!/bin/bash
# schedule.middle_pairs (two heads' middle query blocks in one unit of the persistent walk): verify the four
# members that set it, the walks' GPU test, then time them beside the cells the table serves at odd causal ramps
# (3 and 5 query blocks of 128 rows: 257-384 and 513-640 keys), bf16, alternating with cuDNN in one process
# (3 rounds). Run from the repository root on the device (about 400 s):
#   bash .whl/setup.sh >/dev/null && export PYTHONPATH=/tmp/site:$PWD && OUT=$OUT bash docs/hopper-h200/middle_pairs/run_middle_pairs.sh
# (the d64 member it names, h100_wgmma_d64_persistent_q2_mc4_pm, was dropped after this call: no gain)
set -uo pipefail
: "${OUT:?}"
S=specs/h100_wgmma
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
PM="${S}_d128_persistent_q2_pm.yaml ${S}_d128_persistent_q2_pm_bf16.yaml ${S}_d64_persistent_q2_mc4_pm.yaml
    ${S}_d64_persistent_q2_mc4_pm_bf16.yaml ${S}_d192_persistent_pm.yaml ${S}_d192_persistent_pm_bf16.yaml
    ${S}_d256_persistent_n64_pm.yaml ${S}_d256_persistent_n64_pm_bf16.yaml"
timeout 200 python3 -m attngen verify $PM > "$OUT/verify_pm.txt" 2> "$OUT/verify_pm.err"
echo "verify rc=$?"; grep -v ' pass$' "$OUT/verify_pm.txt" | tail -3 | cut -c1-250
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_verify.py -k persistent_walks > "$OUT/walks_test.txt" 2>&1
echo "walks test rc=$?"; tail -2 "$OUT/walks_test.txt"
export ATTNGEN_ENTRY=1 ATTNGEN_ROUNDS=3
t() { timeout "$1" python3 docs/hopper-h200/forward_specs_vs_cudnn.py "$OUT/$2.json" "$3" "${@:4}" 2>&1 | grep -v '^compiling' | grep causal | cut -c1-250; }
t 150 ab_d128 8x16x384x128,12x16x384x128,16x16x384x128,24x16x384x128,32x16x384x128,8x16x640x128,16x16x640x128,24x16x640x128 \
  ${S}_d128_n128c2ps2r24x240ppet_bf16.yaml ${S}_d128_persistent_q2_bf16.yaml ${S}_d128_persistent_q2_pm_bf16.yaml
t 90 ab_d64 16x16x384x64,32x16x384x64,8x16x640x64,16x16x640x64 \
  ${S}_d64_n128c1hs2oet_bf16.yaml ${S}_d64_persistent_q2_mc4_bf16.yaml ${S}_d64_persistent_q2_mc4_pm_bf16.yaml
t 120 ab_d192 8x16x384x192,16x16x384x192,8x16x640x192,16x16x640x192 \
  ${S}_d192_bf16.yaml ${S}_d192_km_bf16.yaml ${S}_d192_persistent_bf16.yaml ${S}_d192_persistent_pm_bf16.yaml
t 120 ab_d256 8x16x384x256,16x16x384x256,8x16x640x256,16x16x640x256 \
  ${S}_d256_bf16.yaml ${S}_d256_persistent_n64_bf16.yaml ${S}_d256_persistent_n64_pm_bf16.yaml
