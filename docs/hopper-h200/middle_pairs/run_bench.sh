#!/bin/bash
# The reports the dispatch table's entries for schedule.middle_pairs come from: `attngen bench` (fp16 and bf16,
# causal, 25 reps, cuDNN beside) at odd ramps of 128-row query blocks (384 and 640 keys) over grids from 1x8 to
# 32x16 heads: d128 (rebuilt with `attngen dispatch --from`), d192 and d256 (written by hand). About 250 s:
#   bash .whl/setup.sh >/dev/null && export PYTHONPATH=/tmp/site:$PWD && OUT=$OUT bash docs/hopper-h200/middle_pairs/run_bench.sh
set -uo pipefail
: "${OUT:?}"
S=specs/h100_wgmma
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
b() {   # b SECONDS NAME SHAPES SPEC...: both dtypes of each spec
    local secs=$1 name=$2 shapes=$3; shift 3
    local specs=(); for s in "$@"; do specs+=("${S}_$s.yaml" "${S}_${s}_bf16.yaml"); done
    timeout "$secs" python3 -m attngen bench --json "$OUT/$name.json" --causal yes --reps 25 --backends cudnn \
        --shapes "$shapes" "${specs[@]}" > "$OUT/$name.txt" 2>&1
    echo "$name rc=$?"; grep causal "$OUT/$name.txt" | grep -E '[0-9]+\.[0-9]' | cut -c1-110
}
b 200 pm_d128 1x8x384x128,8x16x384x128,12x16x384x128,16x16x384x128,24x16x384x128,32x16x384x128,1x8x640x128,8x16x640x128,16x16x640x128,24x16x640x128,32x16x640x128 \
  d128_n128c2ps2r24x240ppet d128_persistent_q2 d128_persistent_q2_pm d128_persistent_q2_kmpb
b 150 pm_d192 1x8x640x192,8x16x384x192,16x16x384x192,24x16x384x192,8x16x640x192,16x16x640x192,24x16x640x192 \
  d192_km d192_persistent d192_persistent_pm
b 150 pm_d256 1x8x640x256,8x16x384x256,16x16x384x256,24x16x384x256,8x16x640x256,16x16x640x256,24x16x640x256 \
  d256 d256_persistent_n64 d256_persistent_n64_pm
