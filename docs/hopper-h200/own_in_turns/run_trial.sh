#!/bin/bash
# epilogue_tile: own_in_turns on the short causal d256 and d192 cells: the trial members beside the members the
# table serves there (fp16 and bf16, 3 rounds alternating with cuDNN). verify first (it compiles the new kernels in
# parallel). About 400 s:
#   bash .whl/setup.sh >/dev/null && export PYTHONPATH=/tmp/site:$PWD && OUT=$OUT bash docs/hopper-h200/own_in_turns/run_trial.sh
set -uo pipefail
: "${OUT:?}"
S=specs/h100_wgmma
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
both() { for s in "$@"; do echo "${S}_$s.yaml ${S}_${s}_bf16.yaml"; done; }
timeout 240 python3 -m attngen verify $(both d256_persistent_n64_pm_ot d192_persistent_n96_pm_ot d192_persistent_n96_pm) \
  > "$OUT/verify_ot.txt" 2> "$OUT/verify_ot.err"
echo "verify rc=$?"; tail -1 "$OUT/verify_ot.txt"; grep -v ' pass$' "$OUT/verify_ot.txt" | grep -c FAIL
export ATTNGEN_ROUNDS=3
t() { timeout "$1" python3 docs/hopper-h200/forward_specs_vs_cudnn.py "$OUT/$2.json" "$3" "${@:4}" 2>&1 | grep -v '^compiling' | grep causal | cut -c1-250; }
t 200 ot_d256 8x16x640x256,16x16x640x256,16x16x512x256,8x16x768x256,16x16x1024x256,4x16x2048x256 \
  $(both d256_persistent_n64_pm d256_persistent_n64_pm_ot)
t 200 ot_d192 8x16x640x192,16x16x640x192,16x16x512x192,8x16x768x192,16x16x1024x192,4x16x2048x192 \
  $(both d192_persistent_pm d192_persistent_n96_pm d192_persistent_n96_pm_ot)
