#!/bin/bash
# schedule.snake beside middle_pairs and longest_alone (the walk chooses per call; run with the first rule, which also
# took the snake at equal work where four or more blocks share each head): verify, the persistent walks'
# check, then each member beside the member without the snake, attngen.attention and cuDNN (3 rounds alternating,
# bf16) over 384-1408 keys and 1-6 x 16 heads (the snake may be taken up to 4x16; 6x16 keeps the units). About 130 s:
#   bash .whl/setup.sh >/dev/null && export PYTHONPATH=/tmp/site:$PWD && OUT=$OUT bash docs/hopper-h200/short_first/run_snake_choice.sh
set -uo pipefail
: "${OUT:?}"
source docs/hopper-h200/short_first/run_common.sh
SNK="d128_persistent_q2_pm_snk d192_persistent_n96_pm_snk_ot d192_persistent_n64s3_pm_snk_ot d256_persistent_n64_pm_snk_ot_sf"
checked choice $SNK
export ATTNGEN_ENTRY=1 ATTNGEN_ROUNDS=3
narrow() { local d=$1 s=""; for k in 384 512 640 768 896 1152 1408; do for b in 1 2 3 4 6; do s="$s,${b}x16x${k}x$d"; done; done; echo ${s#,}; }
timed 150 choice_d256 "$(narrow 256)" $(bf d256_persistent_n64_pm_la_ot_sf d256_persistent_n64_pm_snk_ot_sf)
timed 150 choice_d192 "$(narrow 192)" $(bf d192_persistent_n96_pm_la_ot d192_persistent_n64s3_pm_la_ot d192_persistent_n96_pm_snk_ot d192_persistent_n64s3_pm_snk_ot)
timed 150 choice_d128 "$(narrow 128)" $(bf d128_persistent_q2_pm d128_persistent_q2_pm_la d128_persistent_q2_pm_snk)
