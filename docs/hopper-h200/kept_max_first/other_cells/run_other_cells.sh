#!/bin/bash
# One device call (at most about 420 s): a kept max (and two P buffers at d128) on the other persistent cells:
# the d256 cells (persistent; the base cell that serves long full masks) and the d128 and d256 softcap and sink
# cells on the persistent walk. Verify the trials, then time them against their committed cells, alternating:
# d256 with cuDNN (../../forward_specs_vs_cudnn.py), the variants on the models' calls (variant_trials_ab.py).
# Usage (repository root, GPU machine): OUT=DIR bash docs/hopper-h200/kept_max_first/other_cells/run_other_cells.sh
set -uo pipefail
: "${OUT:?set OUT to the folder the reports go to}"
export PYTHONUNBUFFERED=1
HERE=docs/hopper-h200/kept_max_first/other_cells
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 120 python3 -m attngen verify $HERE/*.yaml > $OUT/verify_other.txt 2>&1
echo "verify rc=$?"; grep -v ' pass$' $OUT/verify_other.txt | tail -3
ATTNGEN_ROUNDS=3 timeout 180 python3 docs/hopper-h200/forward_specs_vs_cudnn.py $OUT/d256_km_ab.json \
  2x16x1024x256,4x16x2048x256,2x16x4096x256,2x16x8192x256 specs/h100_wgmma_d256_persistent_bf16.yaml \
  $HERE/t_d256_persistent_km_bf16.yaml specs/h100_wgmma_d256_bf16.yaml $HERE/t_d256_km_bf16.yaml 2>&1 | grep -v '^compiling'
timeout 120 python3 $HERE/variant_trials_ab.py $OUT/variant_trials_ab.json 2>&1 | grep -v '^compiling'
