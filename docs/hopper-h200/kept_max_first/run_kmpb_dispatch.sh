#!/bin/bash
# One device call (at most about 560 s): h100_wgmma_d128_persistent_q2_kmpb (fp16, bf16) verified, then
# timed beside every d128 spec the forward table serves and cuDNN on the table's cells (`attngen bench
# --json`, the report `attngen dispatch --from` reads), then the long cells 5 rounds alternating.
# Usage (repository root, GPU machine): OUT=DIR bash docs/hopper-h200/kept_max_first/run_kmpb_dispatch.sh
set -uo pipefail
: "${OUT:?set OUT to the folder the reports go to}"
export PYTHONUNBUFFERED=1
S=specs/h100_wgmma_d128
NEW=${S}_persistent_q2_kmpb.yaml
SERVED="${S}_n128c2ps2r24x240ppet.yaml ${S}_persistent_q2.yaml ${S}_n176c2ps2r24x240ppet.yaml"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 90 python3 -m attngen verify $NEW > $OUT/verify_kmpb.txt 2>&1
echo "verify rc=$?"; grep -v ' pass$' $OUT/verify_kmpb.txt | tail -3
timeout 90 python3 -m attngen warm --no-native --jobs 16 $SERVED $NEW > $OUT/warm.txt 2>&1; echo "warm rc=$?"
s=$(date +%s)
timeout 300 python3 -m attngen bench --json $OUT/walk_kmpb.json --backends cudnn --reps 30 \
  --shapes 1x8x512x128,16x16x512x128,8x16x1024x128,4x16x2048x128,2x16x8192x128,1x16x16384x128 \
  $SERVED $NEW > $OUT/walk_kmpb.txt 2>&1
echo "bench rc=$? secs=$(( $(date +%s)-s ))"; grep -v '^compiling' $OUT/walk_kmpb.txt | tail -60
T=; for f in $SERVED $NEW; do [ $f = ${S}_n128c2ps2r24x240ppet.yaml ] || T="$T $f ${f%.yaml}_bf16.yaml"; done
ATTNGEN_ROUNDS=5 timeout 200 python3 docs/hopper-h200/forward_specs_vs_cudnn.py $OUT/long_kmpb_ab.json \
  8x16x1024x128,4x16x2048x128,2x16x8192x128,1x16x16384x128 $T 2>&1 | grep -v '^compiling'
