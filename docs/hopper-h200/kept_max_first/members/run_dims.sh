#!/bin/bash
# One device call (about 200 s): the d32, d40, d80 and d160 base cells' trials with a kept max (d32, d40) and with
# softmax.lazy_rescale alone (all four) verified, then timed beside the cells the table serves, causal and full,
# fp16 and bf16 (members_ab.py OUT dims).
# Usage (repository root, GPU machine): OUT=DIR bash docs/hopper-h200/kept_max_first/members/run_dims.sh
set -uo pipefail
: "${OUT:?set OUT to the folder the reports go to}"
export PYTHONUNBUFFERED=1
HERE=docs/hopper-h200/kept_max_first/members
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 90 python3 -m attngen verify $HERE/dims/*.yaml > $OUT/verify_dims.txt 2>&1
echo "verify rc=$?"; grep -v ' pass$' $OUT/verify_dims.txt | tail -3
timeout 200 python3 $HERE/members_ab.py $OUT/dims_ab.json dims 2>&1 | grep -v '^compiling'
