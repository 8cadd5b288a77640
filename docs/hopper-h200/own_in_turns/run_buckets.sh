#!/bin/bash
# The own_in_turns members across the d192 and d256 table's buckets, beside the cells served there now
# (attngen.attention, the table's pick, in the alternation too), fp16 and bf16, 3 rounds alternating with cuDNN;
# the members without middle_pairs and the hints take both masks. verify first. About 450 s:
#   bash .whl/setup.sh >/dev/null && export PYTHONPATH=/tmp/site:$PWD && OUT=$OUT bash docs/hopper-h200/own_in_turns/run_buckets.sh
set -uo pipefail
: "${OUT:?}"
S=specs/h100_wgmma
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
both() { for s in "$@"; do echo "${S}_$s.yaml ${S}_${s}_bf16.yaml"; done; }
timeout 200 python3 -m attngen verify $(both d256_persistent_n64_ot d192_persistent_n96_ot) \
  > "$OUT/verify_ot2.txt" 2> "$OUT/verify_ot2.err"
echo "verify rc=$?"; tail -1 "$OUT/verify_ot2.txt"
export ATTNGEN_ROUNDS=3 ATTNGEN_ENTRY=1
t() { timeout "$1" python3 docs/hopper-h200/forward_specs_vs_cudnn.py "$OUT/$2.json" "$3" "${@:4}" 2>&1 | grep -v '^compiling' | grep -E 'causal|none' | cut -c1-300; }
t 250 buckets_d192 1x8x384x192,16x16x384x192,16x16x512x192,8x16x640x192,16x16x640x192,8x16x1280x192,4x16x2048x192,2x16x4096x192,1x16x8192x192 \
  $(both d192_persistent_n96_pm_ot d192_persistent_n96_ot)
t 250 buckets_d256 1x8x384x256,16x16x384x256,16x16x512x256,8x16x640x256,16x16x640x256,8x16x1280x256,4x16x2048x256,2x16x4096x256,1x16x8192x256 \
  $(both d256_persistent_n64_pm_ot d256_persistent_n64_ot)
