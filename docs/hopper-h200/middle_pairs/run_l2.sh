#!/bin/bash
# Trial: schedule.l2_hints (Q loads and O stores evict_first, K/V loads evict_last) on the d256, d192 and d128
# members and d256's base cell: verify, then bf16 causal, 3 rounds alternating with cuDNN. About 200 s:
#   bash .whl/setup.sh >/dev/null && export PYTHONPATH=/tmp/site:$PWD && OUT=$OUT bash docs/hopper-h200/middle_pairs/run_l2.sh
set -uo pipefail
: "${OUT:?}"
S=specs/h100_wgmma
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
V=""; for s in d256_persistent_n64_pm_l2 d256_l2 d192_persistent_pm_l2 d128_persistent_q2_pm_l2; do V="$V ${S}_$s.yaml ${S}_${s}_bf16.yaml"; done
timeout 120 python3 -m attngen verify $V > "$OUT/verify_l2.txt" 2> "$OUT/verify_l2.err"
echo "verify rc=$?"; grep -v ' pass$' "$OUT/verify_l2.txt" | tail -2 | cut -c1-250
export ATTNGEN_ROUNDS=3
t() { timeout "$1" python3 docs/hopper-h200/forward_specs_vs_cudnn.py "$OUT/$2.json" "$3" "${@:4}" 2>&1 | grep -v '^compiling' | grep causal | cut -c1-250; }
t 150 l2_d256 8x16x384x256,8x16x512x256,16x16x512x256,32x16x512x256,16x16x640x256,16x16x1024x256,4x16x2048x256 \
  ${S}_d256_persistent_n64_pm_l2_bf16.yaml ${S}_d256_persistent_n64_pm_bf16.yaml ${S}_d256_l2_bf16.yaml ${S}_d256_bf16.yaml
t 100 l2_d192 8x16x384x192,16x16x512x192,16x16x640x192,16x16x1024x192 \
  ${S}_d192_persistent_pm_l2_bf16.yaml ${S}_d192_persistent_pm_bf16.yaml ${S}_d192_km_bf16.yaml
t 100 l2_d128 16x16x384x128,16x16x512x128,16x16x640x128,32x16x640x128,4x16x2048x128 \
  ${S}_d128_persistent_q2_pm_l2_bf16.yaml ${S}_d128_persistent_q2_pm_bf16.yaml
