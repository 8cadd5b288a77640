#!/bin/bash
# One device call for two changes of the wgmma forward:
#  - schedule.key_halves (this folder): the trials verified, then timed against the committed d64 persistent_q2 cell,
#    its item_overlap trial and cuDNN on the d64 cells of about one wave (../forward_specs_vs_cudnn.py, alternating);
#  - schedule.item_overlap with the copies' read wait after the next S's softmax (../item_overlap/): its trials
#    verified, the d128 persistent_q2 trial against its cell and cuDNN at 256-724 keys on small and large grids, the
#    d64 persistent_q2_c3 trial on the cells that cell serves;
#  with FULL=1 then the c3 cells and every spec verified with the time left.
# Usage (repository root, GPU machine): OUT=DIR [FULL=1] [LIMIT=S] bash docs/hopper-h200/key_halves/run_key_halves.sh
set -uo pipefail
: "${OUT:?}"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
s=$(date +%s)
K=docs/hopper-h200/key_halves/trial_specs
T=docs/hopper-h200/item_overlap/trial_specs
timeout 200 python3 -m attngen verify $K/*.yaml $T/h100_wgmma_d128_persistent_q2_io*.yaml $T/h100_wgmma_d64_persistent_q2_io*.yaml > $OUT/verify_trials.txt 2>&1
echo "verify rc=$? secs=$(( $(date +%s)-s ))"; grep -v ' pass$' $OUT/verify_trials.txt | tail -6 | cut -c1-300
ab() { local r=$1; shift; ATTNGEN_ROUNDS=$r timeout 150 python3 docs/hopper-h200/forward_specs_vs_cudnn.py "$@" 2>&1 \
         | grep -v '^compiling' | cut -c1-300; echo "ab secs=$(( $(date +%s)-s ))"; }
ab 3 $OUT/key_halves_ab.json 1x8x2048x64,2x16x1024x64,1x8x1024x64,4x16x2048x64 \
  specs/h100_wgmma_d64_persistent_q2{,_bf16}.yaml $T/h100_wgmma_d64_persistent_q2_io{,_bf16}.yaml $K/*.yaml
ab 4 $OUT/deferred_q2_ab.json 32x16x256x128,8x16x256x128,16x16x384x128,16x16x512x128,8x16x724x128 \
  specs/h100_wgmma_d128_persistent_q2{,_bf16}.yaml $T/h100_wgmma_d128_persistent_q2_io{,_bf16}.yaml
[ "${FULL:-0}" = 1 ] || exit 0   # FULL=1: the c3 trial's cells and every spec's verify too
ab 3 $OUT/deferred_c3_ab.json 16x16x512x64,8x16x1024x64,4x16x2048x64 \
  specs/h100_wgmma_d64_persistent_q2_c3{,_bf16}.yaml $T/h100_wgmma_d64_persistent_q2_c3_io{,_bf16}.yaml
t=$((${LIMIT:-570} - ($(date +%s)-s))); [ $t -gt 60 ] && timeout $t python3 -m attngen verify > $OUT/verify_all.txt 2>&1
echo "verify all rc=$? secs=$(( $(date +%s)-s ))"; tail -3 $OUT/verify_all.txt | cut -c1-300
