#!/bin/bash
# schedule.snake (causal query blocks dealt out longest first, forward then back over the resident blocks): verify,
# the persistent walks' check, then each trial member beside the members the table serves, attngen.attention and
# cuDNN (3 rounds alternating, bf16) over 384-1408 keys and 1-16 x 16 heads. About 250 s:
#   bash .whl/setup.sh >/dev/null && export PYTHONPATH=/tmp/site:$PWD && OUT=$OUT bash docs/hopper-h200/short_first/run_snake.sh
set -uo pipefail
: "${OUT:?}"
source docs/hopper-h200/short_first/run_common.sh
SNK="d128_persistent_q2_snake d192_persistent_n96_snk_ot d192_persistent_n64s3_snk_ot d256_persistent_n64_snk_ot"
timeout 150 python3 -m attngen verify $(both $SNK) > "$OUT/verify_snake.txt" 2> "$OUT/verify_snake.err"
echo "verify rc=$?"; tail -1 "$OUT/verify_snake.txt"
timeout 120 python3 $D/walks_check.py $(bf $SNK) 2>&1 | tee "$OUT/walks_snake.txt"
export ATTNGEN_ENTRY=1 ATTNGEN_ROUNDS=3
timed 200 snake_d256 "$(wide_shapes 256)" $(bf d256_persistent_n64_pm_ot_sf d256_persistent_n64_pm_la_ot_sf d256_persistent_n64_snk_ot)
timed 200 snake_d192 "$(wide_shapes 192)" $(bf d192_persistent_n96_pm_la_ot d192_persistent_n64s3_pm_la_ot d192_persistent_n96_snk_ot d192_persistent_n64s3_snk_ot)
timed 150 snake_d128 "$(wide_shapes 128)" $(bf d128_persistent_q2_pm d128_persistent_q2_snake)
