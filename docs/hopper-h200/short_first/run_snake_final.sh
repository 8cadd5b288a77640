#!/bin/bash
# After the walk's choice of the snake took its final rule (a tenth less work): verify and the walks' check of the
# four members with the snake; the `attngen bench` report the d128 causal entries are rebuilt from (fp16 and bf16,
# 25 reps, cuDNN beside; 768-1408 keys, 1-16 x 16 heads; the table's d128 members and the one with the snake); then
# attngen.attention with the table's d192/d256 snake entries beside the members it served before and cuDNN (bf16,
# 3 rounds alternating; fp16 at the 768-key cells). About 150 s on a warm cache:
#   bash .whl/setup.sh >/dev/null && export PYTHONPATH=/tmp/site:$PWD && OUT=$OUT bash docs/hopper-h200/short_first/run_snake_final.sh
set -uo pipefail
: "${OUT:?}"
source docs/hopper-h200/short_first/run_common.sh
SNK="d128_persistent_q2_pm_snk d192_persistent_n96_pm_snk_ot d192_persistent_n64s3_pm_snk_ot d256_persistent_n64_pm_snk_ot_sf"
checked final $SNK
specs=(); for s in d128_n128c2ps2r24x240ppet d128_persistent_q2_pm d128_persistent_q2_kmpb d128_persistent_q2_pm_la d128_persistent_q2_pm_snk; do
    specs+=("${S}_$s.yaml" "${S}_${s}_bf16.yaml"); done
shapes=""; for k in 768 896 1152 1408; do for b in 1 2 3 4 6 8 12 16; do shapes="$shapes,${b}x16x${k}x128"; done; done
timeout 300 python3 -m attngen bench --json "$OUT/snake_d128_bench.json" --causal yes --reps 25 --backends cudnn \
    --shapes "${shapes#,}" "${specs[@]}" > "$OUT/snake_d128_bench.txt" 2>&1
echo "bench rc=$?"
export ATTNGEN_ENTRY=1 ATTNGEN_ROUNDS=3
cells() { local d=$1 s=""; for c in 1x16x768 2x16x768 3x16x768 4x16x768 6x16x768 4x16x640 3x16x896 4x16x896 2x16x1152 3x16x1152 2x16x1408 3x16x1408 4x16x1408; do s="$s,${c}x$d"; done; echo ${s#,}; }
timed 120 final_d256 "$(cells 256)" $(bf d256_persistent_n64_pm_la_ot_sf d256_persistent_n64_pm_ot_sf)
timed 120 final_d192 "$(cells 192)" $(bf d192_persistent_n64s3_pm_la_ot d192_persistent_n96_pm_la_ot d192_persistent_n64s3_pm_ot)
timed 100 final_fp16 "2x16x768x192,3x16x768x192,2x16x768x256,3x16x768x256" $(fp d192_persistent_n64s3_pm_ot d256_persistent_n64_pm_ot_sf)
# The d128 report's bf16 rows of the grids where the snake may be taken, last (the output's tail is what returns).
grep -E "^(2|3|4)x16x(768|896|1152|1408)x128 bf16 causal" "$OUT/snake_d128_bench.txt" | cut -c1-90
