#!/bin/bash
# One device call (at most about 400 s): split_tiles: interleaved on the GPU. Verifies every cell of the trial family
# (docs/decode-h200/split_interleaved/il_decode_d128.yaml: six cells of the d128 decode family, interleaved), then
# times the contiguous cells the table picks against their interleaved twins and cuDNN
# (interleaved_ab.py).
# Usage (repository root, GPU machine): OUT=DIR bash docs/decode-h200/split_interleaved/run_interleaved.sh
set -uo pipefail
: "${OUT:?set OUT to the folder the reports go to}"
export PYTHONUNBUFFERED=1
HERE=docs/decode-h200/split_interleaved
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
s=$(date +%s); timeout 200 python3 -m attngen verify $HERE/il_decode_d128.yaml > $OUT/verify_il.txt 2>&1
echo "verify rc=$? secs=$(( $(date +%s)-s ))"; grep -v ' pass$' $OUT/verify_il.txt | tail -5
timeout 180 python3 $HERE/interleaved_ab.py $OUT/interleaved_ab.json 5 2>&1 | grep -v '^compiling'
