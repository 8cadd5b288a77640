#!/bin/bash
# After the members took schedule.l2_hints and the d128 entries were rebuilt: the walks' GPU test, attngen.attention
# beside the members and the cells they replaced (fp16 and bf16, 3 rounds alternating with cuDNN), and d256's and
# d192's members beside the cells serving 702-1448 keys (attngen bench, both dtypes) for the next table step.
# About 200 s:
#   bash .whl/setup.sh >/dev/null && export PYTHONPATH=/tmp/site:$PWD && OUT=$OUT bash docs/hopper-h200/middle_pairs/run_final.sh
set -uo pipefail
: "${OUT:?}"
S=specs/h100_wgmma
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_verify.py -k persistent_walks > "$OUT/walks_test_final.txt" 2>&1
echo "walks test rc=$?"; tail -1 "$OUT/walks_test_final.txt"
export ATTNGEN_ENTRY=1 ATTNGEN_ROUNDS=3
t() { timeout "$1" python3 docs/hopper-h200/forward_specs_vs_cudnn.py "$OUT/$2.json" "$3" "${@:4}" 2>&1 | grep -v '^compiling' | grep causal | cut -c1-250; }
both() { for s in "$@"; do echo "${S}_$s.yaml ${S}_${s}_bf16.yaml"; done; }
t 150 final_d128 16x16x384x128,8x16x640x128,16x16x640x128,4x16x704x128,8x16x768x128,16x16x800x128 \
  $(both d128_persistent_q2_pm d128_persistent_q2 d128_persistent_q2_kmpb)
t 80 final_d192_d256 16x16x640x192,16x16x640x256 $(both d192_persistent_pm d256_persistent_n64_pm)
b() {   # b SECONDS NAME SHAPES SPEC...: both dtypes of each spec
    local secs=$1 name=$2 shapes=$3; shift 3
    local specs=(); for s in "$@"; do specs+=("${S}_$s.yaml" "${S}_${s}_bf16.yaml"); done
    timeout "$secs" python3 -m attngen bench --json "$OUT/$name.json" --causal yes --reps 25 --backends cudnn \
        --shapes "$shapes" "${specs[@]}" > "$OUT/$name.txt" 2>&1
    echo "$name rc=$?"; grep causal "$OUT/$name.txt" | grep -E '[0-9]+\.[0-9]' | cut -c1-100
}
b 120 next_d256_d192 8x16x768x256,16x16x1024x256,8x16x1280x256,8x16x768x192,16x16x1024x192 \
  d256_persistent_n64 d256_persistent_n64_pm d192_persistent d192_persistent_pm
