#!/bin/bash
# One device call (at most about 330 s): is schedule.p_buffers: 2 worth a d128 cell of its own on the long full masks?
# The GPU tests of a kept max (tests/test_gpu_lazy_rescale.py), then the d128 persistent_q2 trials with kept_max_first and
# two P buffers (fp16, bf16) verified, then timed against the committed persistent_q2 cell and cuDNN in both dtypes
# (../forward_specs_vs_cudnn.py, 3 rounds alternating).
# Usage (repository root, GPU machine): OUT=DIR bash docs/hopper-h200/kept_max_first/run_p_buffers_16bit.sh
set -uo pipefail
: "${OUT:?set OUT to the folder the reports go to}"
export PYTHONUNBUFFERED=1
PB=docs/hopper-h200/kept_max_first/p_buffers_specs
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_lazy_rescale.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$?"; tail -1 $OUT/gpu_tests.txt
timeout 45 python3 -m attngen verify $PB/h100_wgmma_d128_persistent_q2_kmpb.yaml \
  $PB/h100_wgmma_d128_persistent_q2_kmpb_bf16.yaml > $OUT/verify_pb16.txt 2>&1
echo "verify rc=$?"; tail -1 $OUT/verify_pb16.txt
ATTNGEN_ROUNDS=3 timeout 180 python3 docs/hopper-h200/forward_specs_vs_cudnn.py $OUT/q2_pb_ab.json \
  16x16x512x128,4x16x2048x128,2x16x4096x128,2x16x8192x128,1x16x16384x128 \
  specs/h100_wgmma_d128_persistent_q2.yaml $PB/h100_wgmma_d128_persistent_q2_kmpb.yaml \
  specs/h100_wgmma_d128_persistent_q2_bf16.yaml $PB/h100_wgmma_d128_persistent_q2_kmpb_bf16.yaml 2>&1 | grep -v '^compiling'
