#!/bin/bash
# One device call (at most 590 s): e4m3 under a kept max, and schedule.p_buffers: 2, on the GPU (run once with e4m3 P
# at 2^5, since back at 2^8: README.md).
#   the full `attngen verify` from an empty cache (every committed spec), then the trials warmed, then
#   e4m3: each committed spec against its kept_max_first trial and its p_buffers trial, alternating
#         (../softmax_block/fp8_ab.py); 16-bit: the kept_max_first cells against their p_buffers trials and cuDNN
#         (../forward_specs_vs_cudnn.py); then `attngen verify` of every trial.
# Usage (repository root, GPU machine): OUT=DIR bash docs/hopper-h200/kept_max_first/run_p_buffers.sh
set -uo pipefail
: "${OUT:?set OUT to the folder the reports go to}"
export PYTHONUNBUFFERED=1 ATTNGEN_CACHE_DIR=${ATTNGEN_CACHE_DIR:-/tmp/attngen_cold}
HERE=docs/hopper-h200/kept_max_first
KM=$HERE/trial_specs; PB=$HERE/p_buffers_specs
base_of() { sed -n '1s/^# Trial: \(specs\/[^ ]*\.yaml\).*/\1/p' "$1"; }
E4=$(ls $KM/*fp8*.yaml $PB/*fp8*.yaml)
P16="$(ls $PB/*.yaml | grep -v fp8) $KM/h100_wgmma_d128_persistent_q2_km.yaml $KM/h100_wgmma_d64_persistent_q2_km.yaml"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
s=$(date +%s); timeout 240 python3 -m attngen verify > $OUT/verify_cold.txt 2> $OUT/verify_cold.err
echo "verify rc=$? secs=$(( $(date +%s)-s ))"; grep -v ' pass$' $OUT/verify_cold.txt | tail -4; tail -3 $OUT/verify_cold.err
gzip -9 $OUT/verify_cold.txt
s=$(date +%s); timeout 80 python3 -m attngen warm --no-native --jobs 16 $E4 $P16 > $OUT/warm.txt 2>&1
echo "warm rc=$? secs=$(( $(date +%s)-s ))"
P=; for t in $E4; do P=${P:+$P,}$(base_of $t):$t; done
timeout 120 python3 docs/hopper-h200/softmax_block/fp8_ab.py $OUT/fp8_ab.json 3 $P \
  2x16x8192x128,4x16x2048x128,8x16x1024x128,2x16x8192x64,4x16x2048x64 2>&1 | grep -v '^compiling'
ATTNGEN_ROUNDS=3 timeout 60 python3 docs/hopper-h200/forward_specs_vs_cudnn.py $OUT/d128_ab.json \
  16x16x512x128,4x16x2048x128,2x16x8192x128 specs/h100_wgmma_d128_n128c2ps2r24x240ppet.yaml \
  $PB/h100_wgmma_d128_n128c2ps2r24x240ppet_pb.yaml $KM/h100_wgmma_d128_persistent_q2_km.yaml \
  $PB/h100_wgmma_d128_persistent_q2_kmpb.yaml 2>&1 | grep -v '^compiling'
ATTNGEN_ROUNDS=3 timeout 60 python3 docs/hopper-h200/forward_specs_vs_cudnn.py $OUT/d64_ab.json \
  16x16x512x64,4x16x2048x64,2x16x8192x64 specs/h100_wgmma_d64_n128c1hs2oet.yaml \
  $PB/h100_wgmma_d64_n128c1hs2oet_pb.yaml $KM/h100_wgmma_d64_persistent_q2_km.yaml \
  $PB/h100_wgmma_d64_persistent_q2_kmpb.yaml 2>&1 | grep -v '^compiling'
timeout 30 python3 -m attngen verify $E4 $P16 > $OUT/verify_trials.txt 2>&1
echo "verify trials rc=$?"; grep -v ' pass$' $OUT/verify_trials.txt | tail -3
