#!/bin/bash
# One device call (at most about 240 s): the d128 window trials of window/ (a kept max on the plain window's and the
# softcap window's persistent walks, two Q tiles or one, and on the window cell's ping-pong tiles) verified, then timed
# beside the cells the table serves on Mistral's, Gemma 3 27B's and Gemma 2 27B's window calls, fp16 and bf16
# (members_ab.py OUT window).
# Usage (repository root, GPU machine): OUT=DIR bash docs/hopper-h200/kept_max_first/members/run_window.sh
set -uo pipefail
: "${OUT:?set OUT to the folder the reports go to}"
export PYTHONUNBUFFERED=1
HERE=docs/hopper-h200/kept_max_first/members
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 90 python3 -m attngen verify $HERE/window/*.yaml > $OUT/verify_window.txt 2>&1
echo "verify rc=$?"; grep -v ' pass$' $OUT/verify_window.txt | tail -3
timeout 150 python3 $HERE/members_ab.py $OUT/window_ab.json window 2>&1 | grep -v '^compiling'
