#!/bin/bash
# softmax.fma_exp2's trials on the H200, two device calls of under 600 s each. `check`: the exponentials' rate per SM
# with k of 8 on the FMA pipes (exp_rates.py), warm (compile) the trials and their committed specs, verify the
# trials. `time` (warms again: a new machine has no cache): each trial against its committed spec, alternating in one
# process: e4m3 through softmax_block/fp8_ab.py, 16-bit through forward_specs_vs_cudnn.py (cuDNN beside), varlen.
# Usage (repository root, GPU machine): OUT=DIR bash docs/hopper-h200/fma_exp2/run_trials.sh check|time
set -uo pipefail
: "${OUT:?set OUT to the folder the reports go to}"
export PYTHONUNBUFFERED=1
T=docs/hopper-h200/fma_exp2/trial_specs
FP8_BASES="specs/h100_wgmma_d128_fp8.yaml specs/h100_wgmma_d64_fp8_n128c3ps4r32x160pb.yaml specs/h100_wgmma_d128_fp8_n192c2ps3r24x240opbq2.yaml specs/h100_wgmma_d128_fp8_n192c2ps3r24x240pppbq2mc4.yaml"
D64="specs/h100_wgmma_d64_persistent_q2.yaml specs/h100_wgmma_d64_persistent_q2_c3.yaml specs/h100_wgmma_d64_n128c1hs2oet.yaml specs/h100_wgmma_d64_n128c1ps3opb.yaml"
VARLEN="specs/h100_wgmma_d64_varlen.yaml"
D128="specs/h100_wgmma_d128_persistent_q2.yaml specs/h100_wgmma_d128_n128c2ps2r24x240ppet.yaml"
[ "${1:-}" = check ] || [ "${1:-}" = time ] || { echo "usage: run_trials.sh check|time"; exit 2; }
[ "$1" = check ] && timeout 60 python3 docs/hopper-h200/fma_exp2/exp_rates.py $OUT/exp_rates.json 2>&1 | tail -9
s=$(date +%s); timeout 150 python3 -m attngen warm --no-native --jobs 16 $T/*.yaml $FP8_BASES $D64 $D128 $VARLEN > $OUT/warm.txt 2>&1
echo "warm rc=$? secs=$(( $(date +%s)-s ))"
if [ "$1" = check ]; then
s=$(date +%s); timeout 200 python3 -m attngen verify $T/*.yaml --json $OUT/verify_trials.json > $OUT/verify_trials.txt 2>&1
echo "verify rc=$? secs=$(( $(date +%s)-s ))"; grep -v ' pass$' $OUT/verify_trials.txt | tail -3
exit 0
fi
PAIRS=specs/h100_wgmma_d128_fp8.yaml:$T/h100_wgmma_d128_fp8_fe1.yaml,specs/h100_wgmma_d128_fp8.yaml:$T/h100_wgmma_d128_fp8_fe2.yaml
PAIRS=$PAIRS,specs/h100_wgmma_d128_fp8.yaml:$T/h100_wgmma_d128_fp8_fe3.yaml,specs/h100_wgmma_d128_fp8.yaml:$T/h100_wgmma_d128_fp8_fe4.yaml
PAIRS=$PAIRS,specs/h100_wgmma_d64_fp8_n128c3ps4r32x160pb.yaml:$T/h100_wgmma_d64_fp8_n128c3ps4r32x160pb_fe2.yaml
PAIRS=$PAIRS,specs/h100_wgmma_d128_fp8_n192c2ps3r24x240opbq2.yaml:$T/h100_wgmma_d128_fp8_n192c2ps3r24x240opbq2_fe2.yaml
PAIRS=$PAIRS,specs/h100_wgmma_d128_fp8_n192c2ps3r24x240pppbq2mc4.yaml:$T/h100_wgmma_d128_fp8_n192c2ps3r24x240pppbq2mc4fe2.yaml
timeout 130 python3 docs/hopper-h200/softmax_block/fp8_ab.py $OUT/fp8_ab.json 5 $PAIRS \
  2x16x8192x128,1x16x16384x128,4x16x2048x128,2x16x8192x64,4x16x2048x64 2>&1 | grep -v '^compiling'
ATTNGEN_ROUNDS=5 timeout 130 python3 docs/hopper-h200/forward_specs_vs_cudnn.py $OUT/d64_ab.json \
  16x16x512x64,8x16x1024x64,4x16x2048x64,2x16x1024x64,1x8x2048x64,1x8x1024x64 $D64 \
  $T/h100_wgmma_d64_persistent_q2_fe1.yaml $T/h100_wgmma_d64_persistent_q2_fe2.yaml $T/h100_wgmma_d64_persistent_q2_fe3.yaml \
  $T/h100_wgmma_d64_persistent_q2_c3_fe2.yaml $T/h100_wgmma_d64_n128c1hs2oet_fe2.yaml $T/h100_wgmma_d64_n128c1ps3opb_fe2.yaml \
  2>&1 | grep -v '^compiling'
ATTNGEN_ROUNDS=5 timeout 90 python3 docs/hopper-h200/forward_specs_vs_cudnn.py $OUT/d128_ab.json \
  16x16x512x128,8x16x1024x128,4x16x2048x128,1x8x512x128 $D128 \
  $T/h100_wgmma_d128_persistent_q2_fe1.yaml $T/h100_wgmma_d128_persistent_q2_fe2.yaml \
  $T/h100_wgmma_d128_n128c2ps2r24x240ppet_fe2.yaml 2>&1 | grep -v '^compiling'
timeout 45 python3 -m attngen bench --varlen specs/h100_wgmma_d64_varlen.yaml $T/h100_wgmma_d64_varlen_fe2.yaml --heads 16/16 \
  --reps 30 --backends flash --json $OUT/varlen_a.json 2>&1 | grep -v '^compiling' | tail -6
timeout 45 python3 -m attngen bench --varlen $T/h100_wgmma_d64_varlen_fe2.yaml specs/h100_wgmma_d64_varlen.yaml --heads 16/16 \
  --reps 30 --backends flash --json $OUT/varlen_b.json 2>&1 | grep -v '^compiling' | tail -6
