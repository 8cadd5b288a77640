#!/bin/bash
# longest_alone beside the served members over a grid of batches and odd/even ramps, bf16, 3 rounds alternating:
#   bash .whl/setup.sh >/dev/null && export PYTHONPATH=/tmp/site:$PWD && OUT=$OUT bash docs/hopper-h200/short_first/run_la_grid.sh
set -uo pipefail
: "${OUT:?}"
source docs/hopper-h200/short_first/run_common.sh
export ATTNGEN_ENTRY=1 ATTNGEN_ROUNDS=3
timed 200 la_wide_d256 "$(wide_shapes 256)" $(bf d256_persistent_n64_pm_ot_sf d256_persistent_n64_la_ot_sf)
timed 200 la_wide_d192 "$(wide_shapes 192)" $(bf d192_persistent_n96_pm_ot d192_persistent_n64s3_pm_ot d192_persistent_n96_la_ot d192_persistent_n64s3_la_ot)
timed 150 la_wide_d128 "$(wide_shapes 128)" $(bf d128_persistent_q2_pm d128_persistent_q2_la)
