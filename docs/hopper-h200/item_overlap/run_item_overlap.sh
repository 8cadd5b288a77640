#!/bin/bash
# One device call: the schedule.item_overlap trials verified, then each timed against its committed cell and cuDNN,
# alternating (../forward_specs_vs_cudnn.py, 3 rounds), on the short cells those cells serve and one long one per head dim.
# cells: once the d128 persistent_q2 family took its io member (full masks up to 724 keys): the family's four cells
#   verified, then the member against the base cells, attngen.attention (the table's pick) and cuDNN, 5 rounds
#   alternating, on cells the table gives it; then tests/test_gpu_ops.py with the time left.
# deferred: once the copies' read wait moved after the next S's softmax (retire_done): the trials verified, then the
#   d128 persistent_q2 trial against its cell and cuDNN at 256-724 keys on small and large grids, the kmpb trial at
#   1024-8192 keys and the d64 persistent_q2 and persistent_q2_c3 trials on their short cells, 5 rounds alternating;
#   then every spec verified with the time left.
# bucket: the io member (full masks from 363 keys) verified, then the base, the member and the non-persistent cell at
#   256 keys on small and large grids and at 16x16x512, 4 rounds alternating (the table's buckets from these).
# served: the member in the table: every spec verified, the member against its base, attngen.attention and cuDNN
#   (3 rounds), then tests/test_gpu_ops.py with the time left.
# Usage (repository root, GPU machine): OUT=DIR [LIMIT=S] bash docs/hopper-h200/item_overlap/run_item_overlap.sh [cells|deferred|bucket|served]
set -uo pipefail
: "${OUT:?}"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
s=$(date +%s)
T=docs/hopper-h200/item_overlap/trial_specs
if [ "${1:-}" = cells ]; then
  F="specs/h100_wgmma_d128_persistent_q2.yaml specs/h100_wgmma_d128_persistent_q2_bf16.yaml
     specs/h100_wgmma_d128_persistent_q2_io.yaml specs/h100_wgmma_d128_persistent_q2_io_bf16.yaml"
  timeout 150 python3 -m attngen verify $F > $OUT/verify_io_cells.txt 2>&1
  echo "verify rc=$? secs=$(( $(date +%s)-s ))"; grep -v ' pass$' $OUT/verify_io_cells.txt | tail -3 | cut -c1-300
  ATTNGEN_ENTRY=1 ATTNGEN_ROUNDS=5 timeout $((${LIMIT:-300} - ($(date +%s)-s))) python3 docs/hopper-h200/forward_specs_vs_cudnn.py \
    $OUT/io_cells_ab.json 16x16x512x128,32x16x256x128,8x16x724x128 $F 2>&1 | grep -v '^compiling' | cut -c1-250
  echo "ab secs=$(( $(date +%s)-s ))"
  t=$((${LIMIT:-300} + 60 - ($(date +%s)-s))); [ $t -gt 20 ] && timeout $t python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_gpu_ops.py > $OUT/gpu_ops.txt 2>&1; echo "gpu ops tests rc=$?"; tail -1 $OUT/gpu_ops.txt
  exit 0
fi
if [ "${1:-}" = served ]; then   # the member in the table: every spec verified, the entry point's pick timed, ops tests
  timeout 230 python3 -m attngen verify > $OUT/verify_all.txt 2>&1
  echo "verify all rc=$? secs=$(( $(date +%s)-s ))"; grep -v ' pass$' $OUT/verify_all.txt | tail -3 | cut -c1-300
  ATTNGEN_ENTRY=1 ATTNGEN_ROUNDS=3 timeout 90 python3 docs/hopper-h200/forward_specs_vs_cudnn.py $OUT/io_served_ab.json \
    16x16x512x128,16x16x384x128,32x16x256x128 specs/h100_wgmma_d128_persistent_q2{,_bf16,_io,_io_bf16}.yaml 2>&1 \
    | grep -v '^compiling' | cut -c1-250
  echo "ab secs=$(( $(date +%s)-s ))"
  t=$((${LIMIT:-330} - ($(date +%s)-s))); [ $t -gt 20 ] && timeout $t python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_gpu_ops.py > $OUT/gpu_ops_served.txt 2>&1; echo "gpu ops tests rc=$?"; tail -1 $OUT/gpu_ops_served.txt
  exit 0
fi
if [ "${1:-}" = bucket ]; then   # the io member committed: verified, then timed at 256 keys on small and large grids
  F="specs/h100_wgmma_d128_persistent_q2.yaml specs/h100_wgmma_d128_persistent_q2_bf16.yaml
     specs/h100_wgmma_d128_persistent_q2_io.yaml specs/h100_wgmma_d128_persistent_q2_io_bf16.yaml
     specs/h100_wgmma_d128_n128c2ps2r24x240ppet.yaml specs/h100_wgmma_d128_n128c2ps2r24x240ppet_bf16.yaml"
  timeout 150 python3 -m attngen verify specs/h100_wgmma_d128_persistent_q2_io.yaml specs/h100_wgmma_d128_persistent_q2_io_bf16.yaml > $OUT/verify_io_member.txt 2>&1
  echo "verify rc=$? secs=$(( $(date +%s)-s ))"; grep -v ' pass$' $OUT/verify_io_member.txt | tail -3 | cut -c1-300
  ATTNGEN_ROUNDS=4 timeout 200 python3 docs/hopper-h200/forward_specs_vs_cudnn.py $OUT/io_bucket_ab.json \
    1x8x256x128,2x16x256x128,4x16x256x128,8x16x256x128,16x16x256x128,32x16x256x128,16x16x512x128 $F 2>&1 \
    | grep -v '^compiling' | cut -c1-250
  echo "ab secs=$(( $(date +%s)-s ))"
  exit 0
fi
if [ "${1:-}" = deferred ]; then
  timeout 200 python3 -m attngen verify $T/*.yaml > $OUT/verify_deferred.txt 2>&1
  echo "verify rc=$? secs=$(( $(date +%s)-s ))"; grep -v ' pass$' $OUT/verify_deferred.txt | tail -4 | cut -c1-300
  ab() { ATTNGEN_ROUNDS=5 timeout 200 python3 docs/hopper-h200/forward_specs_vs_cudnn.py "$@" 2>&1 | grep -v '^compiling' | cut -c1-250
         echo "ab secs=$(( $(date +%s)-s ))"; }
  ab $OUT/deferred_q2_ab.json 32x16x256x128,8x16x256x128,16x16x384x128,6x16x384x128,16x16x512x128,4x16x512x128,8x16x724x128 \
    specs/h100_wgmma_d128_persistent_q2{,_bf16}.yaml $T/h100_wgmma_d128_persistent_q2_io{,_bf16}.yaml
  ab $OUT/deferred_kmpb_ab.json 8x16x1024x128,4x16x2048x128,2x16x8192x128 \
    specs/h100_wgmma_d128_persistent_q2_kmpb{,_bf16}.yaml $T/h100_wgmma_d128_persistent_q2_kmpb_io{,_bf16}.yaml
  ab $OUT/deferred_d64_ab.json 2x16x1024x64,1x8x2048x64,16x16x512x64 \
    specs/h100_wgmma_d64_persistent_q2{,_bf16}.yaml $T/h100_wgmma_d64_persistent_q2_io{,_bf16}.yaml
  ab $OUT/deferred_c3_ab.json 16x16x512x64,8x16x1024x64,4x16x2048x64 \
    specs/h100_wgmma_d64_persistent_q2_c3{,_bf16}.yaml $T/h100_wgmma_d64_persistent_q2_c3_io{,_bf16}.yaml
  t=$((${LIMIT:-570} - ($(date +%s)-s))); [ $t -gt 60 ] && timeout $t python3 -m attngen verify > $OUT/verify_all.txt 2>&1
  echo "verify all rc=$? secs=$(( $(date +%s)-s ))"; tail -3 $OUT/verify_all.txt | cut -c1-300
  exit 0
fi
C="specs/h100_wgmma_d128_persistent_q2.yaml specs/h100_wgmma_d128_persistent_q2_bf16.yaml
   specs/h100_wgmma_d128_persistent_q2_kmpb.yaml specs/h100_wgmma_d128_persistent_q2_kmpb_bf16.yaml
   specs/h100_wgmma_d64_persistent_q2.yaml specs/h100_wgmma_d64_persistent_q2_bf16.yaml
   specs/h100_wgmma_d64_persistent_q2_c3.yaml specs/h100_wgmma_d64_persistent_q2_c3_bf16.yaml"
timeout 150 python3 -m attngen warm --no-native $C > $OUT/warm.txt 2>&1 &   # the committed cells, compiled beside the verify
timeout 200 python3 -m attngen verify $T/*.yaml > $OUT/verify_io.txt 2>&1
echo "verify rc=$? secs=$(( $(date +%s)-s ))"; grep -v ' pass$' $OUT/verify_io.txt | tail -4 | cut -c1-300
wait; tail -1 $OUT/warm.txt
ATTNGEN_ROUNDS=3 timeout $((${LIMIT:-400} - ($(date +%s)-s))) python3 docs/hopper-h200/forward_specs_vs_cudnn.py $OUT/io_ab.json \
  16x16x512x128,8x16x1024x128,2x16x1024x128,1x16x16384x128,16x16x512x64,8x16x1024x64,2x16x1024x64,4x16x2048x64,2x16x8192x64 \
  $C $T/*.yaml 2>&1 | grep -v '^compiling' | cut -c1-250
echo "ab secs=$(( $(date +%s)-s ))"
