#!/bin/bash
# schedule.snake (causal query blocks dealt out longest first, forward then back over the resident blocks): verify,
# the persistent walks' check, then each trial member beside the members the table serves, attngen.attention and
# cuDNN (3 rounds alternating, bf16) over 384-1408 keys and 1-16 x 16 heads. About 250 s:
#   bash .whl/setup.sh >/dev/null && export PYTHONPATH=/tmp/site:$PWD && OUT=$OUT bash docs/hopper-h200/short_first/run_snake.sh
set -uo pipefail
: "${OUT:?}"
S=specs/h100_wgmma
D=docs/hopper-h200/short_first
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
SNK="d128_persistent_q2_snake d192_persistent_n96_snk_ot d192_persistent_n64s3_snk_ot d256_persistent_n64_snk_ot"
both() { for s in "$@"; do echo "${S}_$s.yaml ${S}_${s}_bf16.yaml"; done; }
bf() { for s in "$@"; do echo "${S}_${s}_bf16.yaml"; done; }
timeout 150 python3 -m attngen verify $(both $SNK) > "$OUT/verify_snake.txt" 2> "$OUT/verify_snake.err"
echo "verify rc=$?"; tail -1 "$OUT/verify_snake.txt"
timeout 120 python3 $D/walks_check.py $(bf $SNK) 2>&1 | tee "$OUT/walks_snake.txt"
export ATTNGEN_ENTRY=1 ATTNGEN_ROUNDS=3
sh() { local d=$1 s=""; for k in 384 512 640 768 896 1152 1408; do for b in 1 2 3 4 6 8 12 16; do s="$s,${b}x16x${k}x$d"; done; done; echo ${s#,}; }
t() { timeout "$1" python3 docs/hopper-h200/forward_specs_vs_cudnn.py "$OUT/$2.json" "$3" "${@:4}" 2>&1 | grep causal | cut -c1-300; }
t 200 snake_d256 "$(sh 256)" $(bf d256_persistent_n64_pm_ot_sf d256_persistent_n64_pm_la_ot_sf d256_persistent_n64_snk_ot)
t 200 snake_d192 "$(sh 192)" $(bf d192_persistent_n96_pm_la_ot d192_persistent_n64s3_pm_la_ot d192_persistent_n96_snk_ot d192_persistent_n64s3_snk_ot)
t 150 snake_d128 "$(sh 128)" $(bf d128_persistent_q2_pm d128_persistent_q2_snake)
