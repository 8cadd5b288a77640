#!/bin/bash
# softmax.lazy_rescale's trials on the H200, one device call (its timeouts add to 580 s): warm the trials and their committed
# specs, verify the trials and run tests/test_gpu_lazy_rescale.py, then time each trial against its committed spec
# alternating in one process: e4m3 through softmax_block/fp8_ab.py, 16-bit through forward_specs_vs_cudnn.py (cuDNN
# beside; the bf16 trial is verified only), the varlen cell by `attngen bench --varlen` in both orders. Each trial
# names its spec on its first line.
# Usage (repository root, GPU machine): OUT=DIR bash docs/hopper-h200/lazy_rescale/run_trials.sh
set -uo pipefail
: "${OUT:?set OUT to the folder the reports go to}"
export PYTHONUNBUFFERED=1
T=docs/hopper-h200/lazy_rescale/trial_specs
base_of() { sed -n '1s/^# Trial: \(specs\/[^ ]*\.yaml\).*/\1/p' "$1"; }   # the committed spec a trial was made from
FP8_PAIRS=; D64=; D128=
for t in $T/*.yaml; do
  b=$(base_of $t)
  case $t in
    *varlen*) ;;
    *fp8*) FP8_PAIRS=${FP8_PAIRS:+$FP8_PAIRS,}$b:$t ;;
    *d64*) [[ $t == *_bf16.yaml ]] || D64="$D64 $b $t" ;;
    *d128*) D128="$D128 $b $t" ;;
  esac
done
s=$(date +%s); timeout 100 python3 -m attngen warm --no-native --jobs 16 $T/*.yaml $(for t in $T/*.yaml; do base_of $t; done | sort -u) > $OUT/warm.txt 2>&1
echo "warm rc=$? secs=$(( $(date +%s)-s ))"
s=$(date +%s); timeout 100 python3 -m attngen verify $T/*.yaml --json $OUT/verify_trials.json > $OUT/verify_trials.txt 2>&1
echo "verify rc=$? secs=$(( $(date +%s)-s ))"; grep -v ' pass$' $OUT/verify_trials.txt | tail -2
s=$(date +%s); timeout 110 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_lazy_rescale.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? secs=$(( $(date +%s)-s ))"; tail -1 $OUT/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $OUT/gpu_tests.txt | head
timeout 80 python3 docs/hopper-h200/softmax_block/fp8_ab.py $OUT/fp8_ab.json 5 $FP8_PAIRS \
  2x16x8192x128,1x16x16384x128,4x16x2048x128,2x16x8192x64,4x16x2048x64 2>&1 | grep -v '^compiling'
ATTNGEN_ROUNDS=5 timeout 80 python3 docs/hopper-h200/forward_specs_vs_cudnn.py $OUT/d64_ab.json \
  16x16x512x64,8x16x1024x64,4x16x2048x64,2x16x1024x64,1x8x2048x64,1x8x1024x64 $D64 2>&1 | grep -v '^compiling'
ATTNGEN_ROUNDS=5 timeout 50 python3 docs/hopper-h200/forward_specs_vs_cudnn.py $OUT/d128_ab.json \
  16x16x512x128,8x16x1024x128,4x16x2048x128,1x8x512x128 $D128 2>&1 | grep -v '^compiling'
V=$T/h100_wgmma_d64_varlen_lz.yaml; n=0
for order in "$(base_of $V) $V" "$V $(base_of $V)"; do
  n=$((n + 1))   # here, not inside the pipeline below (a subshell)
  timeout 30 python3 -m attngen bench --varlen $order --heads 16/16 --reps 30 --backends flash --json $OUT/varlen_$n.json \
    2>&1 | grep -v '^compiling' | tail -4
done
