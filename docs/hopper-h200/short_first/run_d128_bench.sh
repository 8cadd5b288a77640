#!/bin/bash
# The report the d128 causal entries would need for the member with both walks (the d128 entries are rebuilt from
# `attngen bench` reports: tests/test_dispatch.py): fp16 and bf16, causal, 25 reps, cuDNN beside, at the odd ramps
# where it ran ahead of the table's cells (384 and 896 keys) over 1x16 to 16x16 heads, beside those cells. About 200 s:
#   bash .whl/setup.sh >/dev/null && export PYTHONPATH=/tmp/site:$PWD && OUT=$OUT bash docs/hopper-h200/short_first/run_d128_bench.sh
set -uo pipefail
: "${OUT:?}"
source docs/hopper-h200/short_first/run_common.sh
specs=(); for s in d128_n128c2ps2r24x240ppet d128_persistent_q2_pm d128_persistent_q2_kmpb d128_persistent_q2_pm_la; do
    specs+=("${S}_$s.yaml" "${S}_${s}_bf16.yaml"); done
shapes=""; for k in 384 896; do for b in 1 2 3 4 6 8 12 16; do shapes="$shapes,${b}x16x${k}x128"; done; done
timeout 400 python3 -m attngen bench --json "$OUT/pm_la_d128_bench.json" --causal yes --reps 25 --backends cudnn \
    --shapes "${shapes#,}" "${specs[@]}" > "$OUT/pm_la_d128_bench.txt" 2>&1
echo "bench rc=$?"; grep causal "$OUT/pm_la_d128_bench.txt" | grep -E '[0-9]+\.[0-9]' | cut -c1-110
