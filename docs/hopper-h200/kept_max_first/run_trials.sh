#!/bin/bash
# softmax.lazy_rescale's and softmax.kept_max_first's trials on the H200 in two device calls (each one's timeouts add
# to at most 580 s), in place of ../lazy_rescale/run_trials.sh:
#   check: warm every trial and its committed spec, verify the trials, run tests/test_gpu_lazy_rescale.py (both keys:
#          every verify case, rising scores, planted faults) and the e4m3 P-layout planted faults of tests/test_gpu_fp8.py;
#   time:  (warm again: a fresh machine has no cache) each committed spec, its lazy_rescale trial and its kept_max_first
#          trial alternating in one process: e4m3
#          through softmax_block/fp8_ab.py (committed:lazy and committed:kept pairs), 16-bit through
#          forward_specs_vs_cudnn.py (the three and cuDNN), the lazy varlen cell by `attngen bench --varlen` both ways.
# Each trial names its spec on its first line. bf16 trials are verified only.
# Usage (repository root, GPU machine): OUT=DIR bash docs/hopper-h200/kept_max_first/run_trials.sh check|time
set -uo pipefail
: "${OUT:?set OUT to the folder the reports go to}"
export PYTHONUNBUFFERED=1
LZ=docs/hopper-h200/lazy_rescale/trial_specs
KM=docs/hopper-h200/kept_max_first/trial_specs
base_of() { sed -n '1s/^# Trial: \(specs\/[^ ]*\.yaml\).*/\1/p' "$1"; }   # the committed spec a trial was made from
lazy_of() { local b; b=$(basename "$(base_of "$1")" .yaml); ls $LZ/${b}_lz.yaml $LZ/${b}lz.yaml 2>/dev/null | head -1; }   # its lazy trial
case "${1:-}" in
check)
  s=$(date +%s); timeout 120 python3 -m attngen warm --no-native --jobs 16 $LZ/*.yaml $KM/*.yaml \
    $(for t in $LZ/*.yaml $KM/*.yaml; do base_of $t; done | sort -u) > $OUT/warm.txt 2>&1
  echo "warm rc=$? secs=$(( $(date +%s)-s ))"
  s=$(date +%s); timeout 180 python3 -m attngen verify $LZ/*.yaml $KM/*.yaml --json $OUT/verify_trials.json > $OUT/verify_trials.txt 2>&1
  echo "verify rc=$? secs=$(( $(date +%s)-s ))"; grep -v ' pass$' $OUT/verify_trials.txt | tail -2
  s=$(date +%s); timeout 220 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_lazy_rescale.py \
    tests/test_gpu_fp8.py -k "lazy_rescale or kept or planted_p_layout" > $OUT/gpu_tests.txt 2>&1
  echo "gpu tests rc=$? secs=$(( $(date +%s)-s ))"; tail -1 $OUT/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $OUT/gpu_tests.txt | head ;;
time)
  FP8=; D64=; D128=
  for t in $KM/*.yaml; do
    b=$(base_of $t); l=$(lazy_of $t)
    case $t in
      *_bf16.yaml) ;;
      *fp8*) FP8=${FP8:+$FP8,}$b:$l,$b:$t ;;
      *d64*) D64="$D64 $b $l $t" ;;
      *d128*) D128="$D128 $b $l $t" ;;
    esac
  done
  for t in $LZ/*.yaml; do   # the 16-bit lazy trials with no kept_max_first twin (softmax_block cells), beside their specs
    b=$(base_of $t); n=$(basename $b .yaml)
    case $t in *_bf16.yaml|*varlen*|*fp8*) continue ;; esac
    { [ -e $KM/${n}_km.yaml ] || [ -e $KM/${n}km.yaml ]; } && continue
    case $t in *d64*) D64="$D64 $b $t" ;; *d128*) D128="$D128 $b $t" ;; esac
  done
  # a machine held since `check` keeps its cubin cache; a fresh one compiles here first, all at once
  s=$(date +%s); timeout 90 python3 -m attngen warm --no-native --jobs 16 $LZ/*.yaml $KM/*.yaml \
    $(for t in $LZ/*.yaml $KM/*.yaml; do base_of $t; done | sort -u) > $OUT/warm_time.txt 2>&1
  echo "warm rc=$? secs=$(( $(date +%s)-s ))"
  timeout 130 python3 docs/hopper-h200/softmax_block/fp8_ab.py $OUT/fp8_ab.json 5 $FP8 \
    2x16x8192x128,1x16x16384x128,4x16x2048x128,8x16x1024x128,2x16x8192x64,4x16x2048x64 2>&1 | grep -v '^compiling'
  ATTNGEN_ROUNDS=5 timeout 150 python3 docs/hopper-h200/forward_specs_vs_cudnn.py $OUT/d64_ab.json \
    16x16x512x64,8x16x1024x64,4x16x2048x64,2x16x1024x64,1x8x2048x64,1x8x1024x64,2x16x8192x64 $D64 2>&1 | grep -v '^compiling'
  ATTNGEN_ROUNDS=5 timeout 100 python3 docs/hopper-h200/forward_specs_vs_cudnn.py $OUT/d128_ab.json \
    16x16x512x128,8x16x1024x128,4x16x2048x128,1x8x512x128,2x16x8192x128 $D128 2>&1 | grep -v '^compiling'
  V=$LZ/h100_wgmma_d64_varlen_lz.yaml; n=0
  for order in "$(base_of $V) $V" "$V $(base_of $V)"; do
    n=$((n + 1))   # here, not inside the pipeline below (a subshell)
    timeout 35 python3 -m attngen bench --varlen $order --heads 16/16 --reps 30 --backends flash --json $OUT/varlen_$n.json \
      2>&1 | grep -v '^compiling' | tail -4
  done ;;
*) echo "usage: OUT=DIR bash docs/hopper-h200/kept_max_first/run_trials.sh check|time"; exit 2 ;;
esac
