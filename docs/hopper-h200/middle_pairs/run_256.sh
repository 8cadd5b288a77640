#!/bin/bash
# The d128 causal bucket up to 443 keys reaches down to 256 keys (two query blocks, no middle block): the member
# beside the other cells there (attngen bench, both dtypes, the report the table's d128 entries are rebuilt from
# last); then d256's and d192's members beside the cells serving 702-1448 keys, 3 rounds alternating with cuDNN,
# both dtypes. About 150 s:
#   bash .whl/setup.sh >/dev/null && export PYTHONPATH=/tmp/site:$PWD && OUT=$OUT bash docs/hopper-h200/middle_pairs/run_256.sh
set -uo pipefail
: "${OUT:?}"
S=specs/h100_wgmma
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
specs=(); for s in d128_n128c2ps2r24x240ppet d128_persistent_q2 d128_persistent_q2_pm d128_persistent_q2_kmpb; do specs+=("${S}_$s.yaml" "${S}_${s}_bf16.yaml"); done
timeout 120 python3 -m attngen bench --json "$OUT/pm_d128_256.json" --causal yes --reps 25 --backends cudnn \
  --shapes 8x16x256x128,16x16x256x128,24x16x256x128,32x16x256x128,64x16x256x128 "${specs[@]}" > "$OUT/pm_d128_256.txt" 2>&1
echo "bench rc=$?"; grep causal "$OUT/pm_d128_256.txt" | grep -E '[0-9]+\.[0-9]' | cut -c1-100
export ATTNGEN_ROUNDS=3
both() { for s in "$@"; do echo "${S}_$s.yaml ${S}_${s}_bf16.yaml"; done; }
timeout 150 python3 docs/hopper-h200/forward_specs_vs_cudnn.py "$OUT/next_ab.json" \
  8x16x768x256,16x16x1024x256,8x16x1280x256,8x16x768x192,16x16x1024x192,8x16x1280x192 \
  $(both d256_persistent_n64 d256_persistent_n64_pm d192_persistent d192_persistent_pm) 2>&1 | grep -v '^compiling' | grep causal | cut -c1-250
