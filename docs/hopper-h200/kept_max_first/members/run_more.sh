#!/bin/bash
# One device call (at most about 560 s): the kept-max trials of window/ (d128: the plain window's and the softcap
# window's persistent walks, two Q tiles or one, and the window cell's ping-pong tiles) and of d192/ (the d192 and
# d192_v128 base and persistent cells) verified, then timed beside the cells the table serves, fp16 and bf16:
# Mistral's, Gemma 3 27B's and Gemma 2 27B's window calls (members_ab.py OUT window), d192 causal and full
# (members_ab.py OUT d192), the d128 ALiBi cell (members_ab.py OUT alibi).
# Usage (repository root, GPU machine): OUT=DIR bash docs/hopper-h200/kept_max_first/members/run_more.sh
set -uo pipefail
: "${OUT:?set OUT to the folder the reports go to}"
export PYTHONUNBUFFERED=1
HERE=docs/hopper-h200/kept_max_first/members
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 150 python3 -m attngen verify $HERE/window/*.yaml $HERE/d192/*.yaml > $OUT/verify_more.txt 2>&1
echo "verify rc=$?"; grep -v ' pass$' $OUT/verify_more.txt | tail -3
timeout 150 python3 $HERE/members_ab.py $OUT/window_ab.json window 2>&1 | grep -v '^compiling'
timeout 180 python3 $HERE/members_ab.py $OUT/d192_ab.json d192 2>&1 | grep -v '^compiling'
timeout 60 python3 $HERE/members_ab.py $OUT/alibi_ab.json alibi 2>&1 | grep -v '^compiling'
