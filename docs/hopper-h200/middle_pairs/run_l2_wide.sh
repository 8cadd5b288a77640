#!/bin/bash
# schedule.l2_hints: verify the pm members (which now set it) and the trial members that add it to the persistent
# cells the table serves; the pm members' bench reports again (the d128 entries are rebuilt from them); then each
# trial member beside its cell in that cell's buckets, bf16, 3 rounds alternating with cuDNN. About 300 s:
#   bash .whl/setup.sh >/dev/null && export PYTHONPATH=/tmp/site:$PWD && OUT=$OUT bash docs/hopper-h200/middle_pairs/run_l2_wide.sh
set -uo pipefail
: "${OUT:?}"
S=specs/h100_wgmma
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
V=""; for s in d128_persistent_q2_pm d192_persistent_pm d256_persistent_n64_pm d128_persistent_q2_l2 d128_persistent_q2_kmpb_l2 \
               d192_persistent_l2 d256_persistent_l2 d256_persistent_n64_l2 d256_persistent_km_l2; do V="$V ${S}_$s.yaml ${S}_${s}_bf16.yaml"; done
timeout 150 python3 -m attngen verify $V > "$OUT/verify_l2_wide.txt" 2> "$OUT/verify_l2_wide.err"
echo "verify rc=$?"; grep -v ' pass$' "$OUT/verify_l2_wide.txt" | tail -2 | cut -c1-250
b() {   # b SECONDS NAME SHAPES SPEC...: both dtypes of each spec
    local secs=$1 name=$2 shapes=$3; shift 3
    local specs=(); for s in "$@"; do specs+=("${S}_$s.yaml" "${S}_${s}_bf16.yaml"); done
    timeout "$secs" python3 -m attngen bench --json "$OUT/$name.json" --causal yes --reps 25 --backends cudnn \
        --shapes "$shapes" "${specs[@]}" > "$OUT/$name.txt" 2>&1
    echo "$name rc=$?"
}
b 150 pm_l2_d128 1x8x384x128,8x16x384x128,12x16x384x128,16x16x384x128,24x16x384x128,32x16x384x128,1x8x640x128,8x16x640x128,16x16x640x128,24x16x640x128,32x16x640x128 \
  d128_n128c2ps2r24x240ppet d128_persistent_q2 d128_persistent_q2_pm d128_persistent_q2_kmpb
b 100 pm_l2_d192_d256 1x8x640x192,8x16x640x192,16x16x640x192,24x16x640x192,1x8x640x256,8x16x640x256,16x16x640x256,24x16x640x256 \
  d192_km d192_persistent_pm d256_persistent_n64_pm
grep causal "$OUT/pm_l2_d192_d256.txt" | grep -E '_pm |_pm_bf16 |sdpa' | cut -c1-100
export ATTNGEN_ROUNDS=3
t() { timeout "$1" python3 docs/hopper-h200/forward_specs_vs_cudnn.py "$OUT/$2.json" "$3" "${@:4}" 2>&1 | grep -v '^compiling' | grep -E 'causal|none' | cut -c1-250; }
t 80 l2_q2 16x16x512x128,8x16x640x128 ${S}_d128_persistent_q2_l2_bf16.yaml ${S}_d128_persistent_q2_bf16.yaml
t 120 l2_kmpb 8x16x1024x128,4x16x2048x128,2x16x8192x128 ${S}_d128_persistent_q2_kmpb_l2_bf16.yaml ${S}_d128_persistent_q2_kmpb_bf16.yaml
t 120 l2_d256 8x16x768x256,16x16x1024x256,4x16x2048x256,2x16x4096x256,1x16x8192x256 \
  ${S}_d256_persistent_n64_l2_bf16.yaml ${S}_d256_persistent_n64_bf16.yaml ${S}_d256_persistent_km_l2_bf16.yaml \
  ${S}_d256_persistent_km_bf16.yaml ${S}_d256_persistent_l2_bf16.yaml ${S}_d256_persistent_bf16.yaml
t 100 l2_d192 8x16x768x192,4x16x2048x192,1x16x8192x192 ${S}_d192_persistent_l2_bf16.yaml ${S}_d192_persistent_bf16.yaml
