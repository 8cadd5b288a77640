#!/bin/bash
# schedule.snake_tail (trial): verify and the walks' check of its members, then each beside the member with the
# snake alone (pm_snk), attngen.attention and cuDNN (bf16, 3 rounds alternating) at the grids where the walk takes
# whole rounds of units before the snake (6x16 at 512 and 768 keys) and the cells around them. About 150 s:
#   bash .whl/setup.sh >/dev/null && export PYTHONPATH=/tmp/site:$PWD && OUT=$OUT bash docs/hopper-h200/short_first/run_snake_tail.sh
set -uo pipefail
: "${OUT:?}"
source docs/hopper-h200/short_first/run_common.sh
checked tail d128_persistent_q2_pm_snt d192_persistent_n64s3_pm_snt_ot d256_persistent_n64_pm_snt_ot_sf
export ATTNGEN_ENTRY=1 ATTNGEN_ROUNDS=3
cells() { local d=$1 s=""; for c in 6x16x512 6x16x768 5x16x768 7x16x768 6x16x640 6x16x896 4x16x768 8x16x768 12x16x768; do s="$s,${c}x$d"; done; echo ${s#,}; }
timed 120 tail_d128 "$(cells 128)" $(bf d128_persistent_q2_pm_snk d128_persistent_q2_pm_snt)
timed 120 tail_d192 "$(cells 192)" $(bf d192_persistent_n64s3_pm_snk_ot d192_persistent_n64s3_pm_snt_ot)
timed 120 tail_d256 "$(cells 256)" $(bf d256_persistent_n64_pm_snk_ot_sf d256_persistent_n64_pm_snt_ot_sf)
