#!/bin/bash
# After the table took the snake members: attngen.attention at the shapes it sends them, checked against the fp32
# reference (entry_check_snake.py); the d128 cells the rebuilt entries changed, attngen.attention beside the members
# they named before and cuDNN (bf16, 3 rounds alternating); and eager time, host included (middle_pairs/entry_eager.py).
# About 150 s:
#   bash .whl/setup.sh >/dev/null && export PYTHONPATH=/tmp/site:$PWD && OUT=$OUT bash docs/hopper-h200/short_first/run_snake_entry.sh
set -uo pipefail
: "${OUT:?}"
source docs/hopper-h200/short_first/run_common.sh
timeout 150 python3 $D/entry_check_snake.py "$OUT/entry_check_snake.json" > "$OUT/entry_check_snake.txt" 2>&1
echo "entry_check rc=$?"; tail -2 "$OUT/entry_check_snake.txt"
export ATTNGEN_ENTRY=1 ATTNGEN_ROUNDS=3
timed 120 entry_d128 "2x16x768x128,3x16x768x128,4x16x768x128,3x16x896x128,2x16x1152x128,2x16x1408x128,3x16x1408x128,1x16x768x128,16x16x768x128,8x16x1152x128" \
    $(bf d128_n128c2ps2r24x240ppet d128_persistent_q2_pm d128_persistent_q2_kmpb)
timeout 150 python3 docs/hopper-h200/middle_pairs/entry_eager.py "$OUT/entry_eager_snake.json" \
    3x16x768x128,2x16x1408x128,3x16x768x192,3x16x768x256,2x16x1408x256 2>&1 | grep -v '^compiling'
