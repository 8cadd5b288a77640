#!/bin/bash
# Two device calls for an H200 (at most about 560 s each).
#   trials:  the full-mask trials (next/ and ../other_cells/) and the d128 sink window trials verified and timed beside
#            the cells the table serves there (members_ab.py next), then the d256 base and persistent cells on full
#            masks (the persistent one serves them since 2026-12-05) with the d256 trial, beside cuDNN;
#   members: members_ab.py again (the table's entries for the three kept-max specs cite an H100 run).
# Usage (repository root, GPU machine): OUT=DIR bash docs/hopper-h200/kept_max_first/members/run_next.sh trials|members
set -uo pipefail
: "${OUT:?set OUT to the folder the reports go to}"
export PYTHONUNBUFFERED=1
HERE=docs/hopper-h200/kept_max_first/members
OC=docs/hopper-h200/kept_max_first/other_cells
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ "${1:-}" = members ]; then
  timeout 540 python3 $HERE/members_ab.py $OUT/members_ab.json 2>&1 | grep -v '^compiling'
  exit
fi
timeout 150 python3 -m attngen verify $HERE/next/*.yaml $OC/t_d256_km_bf16.yaml $OC/t_d128_softcap_persistent_kmpb_bf16.yaml \
  > $OUT/verify_next.txt 2>&1
echo "verify rc=$?"; grep -v ' pass$' $OUT/verify_next.txt | tail -3
timeout 250 python3 $HERE/members_ab.py $OUT/next_ab.json next 2>&1 | grep -v '^compiling'
ATTNGEN_ROUNDS=3 timeout 150 python3 docs/hopper-h200/forward_specs_vs_cudnn.py $OUT/d256_full_cudnn.json \
  2x16x4096x256,2x16x8192x256,1x16x16384x256 specs/h100_wgmma_d256_bf16.yaml specs/h100_wgmma_d256_persistent_bf16.yaml \
  $OC/t_d256_km_bf16.yaml specs/h100_wgmma_d256.yaml specs/h100_wgmma_d256_persistent.yaml 2>&1 | grep -v '^compiling'
