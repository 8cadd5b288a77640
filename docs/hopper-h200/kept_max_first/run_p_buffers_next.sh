#!/bin/bash
# One device call (at most about 480 s): is schedule.p_buffers: 2 worth a cell of its own?
#   the GPU tests of a kept max (tests/test_gpu_lazy_rescale.py: e4m3 P back at 2^8 under a kept max);
#   the two-buffer trials verified: d128 persistent_q2 with kept_max_first (fp16, bf16), and with the usual step
#     (P made ahead of the previous P.V's wait without a kept max: fp16, bf16, and the e4m3 d128, opbq2 and
#     pppbq2mc4 cells);
#   e4m3: each committed cell against its usual-step trial, alternating (../softmax_block/fp8_ab.py);
#   16-bit: the committed d128 persistent_q2 cell against both trials and cuDNN, fp16 and bf16
#     (../forward_specs_vs_cudnn.py, 3 rounds alternating).
# Usage (repository root, GPU machine): OUT=DIR bash docs/hopper-h200/kept_max_first/run_p_buffers_next.sh
set -uo pipefail
: "${OUT:?set OUT to the folder the reports go to}"
export PYTHONUNBUFFERED=1
PB=docs/hopper-h200/kept_max_first/p_buffers_specs
Q2="$PB/h100_wgmma_d128_persistent_q2_kmpb.yaml $PB/h100_wgmma_d128_persistent_q2_kmpb_bf16.yaml
    $PB/h100_wgmma_d128_persistent_q2_pbu.yaml $PB/h100_wgmma_d128_persistent_q2_pbu_bf16.yaml"
E4="$PB/h100_wgmma_d128_fp8_pbu.yaml $PB/h100_wgmma_d128_fp8_n192c2ps3r24x240opbq2_pbu.yaml
    $PB/h100_wgmma_d128_fp8_pppbq2mc4_pbu.yaml"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_lazy_rescale.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$?"; tail -1 $OUT/gpu_tests.txt
timeout 90 python3 -m attngen verify $Q2 $E4 > $OUT/verify_pb.txt 2>&1
echo "verify rc=$?"; grep -v ' pass$' $OUT/verify_pb.txt | tail -3
P=; for t in $E4; do P=${P:+$P,}$(sed -n '1s/^# Trial: \(specs\/[^ ]*\.yaml\).*/\1/p' $t):$t; done
timeout 100 python3 docs/hopper-h200/softmax_block/fp8_ab.py $OUT/fp8_pbu_ab.json 3 $P \
  2x16x8192x128,4x16x2048x128,8x16x1024x128 2>&1 | grep -v '^compiling'
ATTNGEN_ROUNDS=3 timeout 180 python3 docs/hopper-h200/forward_specs_vs_cudnn.py $OUT/q2_pb_ab.json \
  16x16x512x128,4x16x2048x128,2x16x8192x128,1x16x16384x128 \
  specs/h100_wgmma_d128_persistent_q2.yaml specs/h100_wgmma_d128_persistent_q2_bf16.yaml $Q2 2>&1 | grep -v '^compiling'
