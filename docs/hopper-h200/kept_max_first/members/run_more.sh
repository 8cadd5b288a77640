#!/bin/bash
# Two device calls (at most about 450 and 400 s), the kept-max trials verified, then timed beside the cells the table
# serves, fp16 and bf16:
#   1: window/ (d128: the plain window's and the softcap window's persistent walks, two Q tiles or one, the window
#      cell's ping-pong tiles; the ALiBi cell; d256's window_persistent) on Mistral's, Gemma 3 27B's and 12B's and
#      Gemma 2 27B's window calls
#      (members_ab.py OUT window) and ALiBi calls (members_ab.py OUT alibi), and varlen/ (the d64 and d128 varlen
#      cells) on a mixed ragged batch (varlen_ab.py);
#   2: d192/ (the d192 and d192_v128 base and persistent cells), causal and full (members_ab.py OUT d192), and d64/
#      (the three-warpgroup d64 cells with lazy_rescale alone) on gpt-oss's sink calls and d64 windows and masks
#      (members_ab.py OUT d64).
# Usage (repository root, GPU machine): OUT=DIR bash docs/hopper-h200/kept_max_first/members/run_more.sh 1|2
set -uo pipefail
: "${OUT:?set OUT to the folder the reports go to}"
export PYTHONUNBUFFERED=1
HERE=docs/hopper-h200/kept_max_first/members
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ "${1:-}" = 2 ]; then
  timeout 90 python3 -m attngen verify $HERE/d192/*.yaml $HERE/d64/*.yaml > $OUT/verify_d192_d64.txt 2>&1
  echo "verify rc=$?"; grep -v ' pass$' $OUT/verify_d192_d64.txt | tail -3
  timeout 170 python3 $HERE/members_ab.py $OUT/d192_ab.json d192 2>&1 | grep -v '^compiling'
  timeout 130 python3 $HERE/members_ab.py $OUT/d64_ab.json d64 2>&1 | grep -v '^compiling'
  exit
fi
timeout 120 python3 -m attngen verify $HERE/window/*.yaml $HERE/varlen/*.yaml > $OUT/verify_more.txt 2>&1
echo "verify rc=$?"; grep -v ' pass$' $OUT/verify_more.txt | tail -3
timeout 150 python3 $HERE/members_ab.py $OUT/window_ab.json window 2>&1 | grep -v '^compiling'
timeout 60 python3 $HERE/members_ab.py $OUT/alibi_ab.json alibi 2>&1 | grep -v '^compiling'
timeout 100 python3 $HERE/varlen_ab.py $OUT/varlen_ab.json 2>&1 | grep -v '^compiling'
