#!/bin/bash
# O's own tile on more persistent cells: d192 with V of 128 (MLA prefill shapes; own_in_turns, with and without
# middle_pairs and the hints) and d96 (Phi-3; three consumer warpgroups, so a whole own tile, or two Q tiles).
# verify first; d96 alternating 3 rounds with cuDNN and attngen.attention (the cell served now); d192_v128 in
# `attngen bench` (queued timing; its calls have V of 128, which the alternating script does not make). About 300 s:
#   bash .whl/setup.sh >/dev/null && export PYTHONPATH=/tmp/site:$PWD && OUT=$OUT bash docs/hopper-h200/own_in_turns/run_more.sh
set -uo pipefail
: "${OUT:?}"
S=specs/h100_wgmma
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
both() { for s in "$@"; do echo "${S}_$s.yaml ${S}_${s}_bf16.yaml"; done; }
timeout 200 python3 -m attngen verify $(both d96_persistent_own d96_persistent_q2 d192_v128_persistent_ot d192_v128_persistent_pm_ot) \
  > "$OUT/verify_more.txt" 2> "$OUT/verify_more.err"
echo "verify rc=$?"; tail -1 "$OUT/verify_more.txt"
ATTNGEN_ROUNDS=3 ATTNGEN_ENTRY=1 timeout 200 python3 docs/hopper-h200/forward_specs_vs_cudnn.py "$OUT/more_d96.json" \
  1x8x576x96,16x16x576x96,8x16x1024x96,4x16x2048x96,2x16x4096x96,1x16x8192x96 \
  $(both d96_persistent d96_persistent_own d96_persistent_q2) 2>&1 | grep -v '^compiling' | grep -E 'causal|none' | cut -c1-250
timeout 240 python3 -m attngen bench --json "$OUT/more_v128.json" --reps 25 --backends cudnn \
  --shapes 16x16x512x192x128,16x16x640x192x128,8x16x1024x192x128,4x16x2048x192x128,2x16x4096x192x128,1x16x8192x192x128 \
  $(both d192_v128_persistent d192_v128_persistent_ot d192_v128_persistent_pm_ot) > "$OUT/more_v128.txt" 2>&1
echo "bench rc=$?"; grep -E 'causal|none' "$OUT/more_v128.txt" | grep -E '[0-9]+\.[0-9]' | cut -c1-110
timeout 60 python3 docs/hopper-h200/own_in_turns/cudnn_kernels.py "$OUT/cudnn_kernels.json" 2>&1 | grep -v '^compiling' | cut -c1-260
