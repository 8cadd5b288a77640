#!/bin/bash
# d192's short causal cells with 64-key tiles (a 128-row block's diagonal falls on a tile's edge; 96-key tiles
# compute about 10 % more keys at 640): verify of the trial cells, Nsight Compute beside the served n96 member at
# 8x16x640 and 16x16x512, then 3 rounds alternating with cuDNN and attngen.attention, fp16 and bf16. About 150 s:
#   bash .whl/setup.sh >/dev/null && export PYTHONPATH=/tmp/site:$PWD && OUT=$OUT bash docs/hopper-h200/short_first/run_d192_n64.sh
set -uo pipefail
: "${OUT:?}"
source docs/hopper-h200/short_first/run_common.sh
timeout 150 python3 -m attngen verify $(both d192_persistent_n64_pm_ot d192_persistent_n64s3_pm_ot) \
  > "$OUT/verify_n64.txt" 2> "$OUT/verify_n64.err"
echo "verify rc=$?"; tail -1 "$OUT/verify_n64.txt"
timeout 100 ncu --clock-control none --profile-from-start off -k 'regex:attngen' \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct,sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_active.min,sm__inst_executed_pipe_tensor_op_gmma.sum \
  --csv python3 $D/ncu_specs.py 16x16x512x192,8x16x640x192 \
  $(bf d192_persistent_n96_pm_ot d192_persistent_n64_pm_ot d192_persistent_n64s3_pm_ot) > "$OUT/ncu_n64.csv" 2> "$OUT/ncu_n64.err"
echo "ncu rc=$?"
ATTNGEN_ENTRY=1 ATTNGEN_ROUNDS=3 timeout 240 python3 docs/hopper-h200/forward_specs_vs_cudnn.py "$OUT/n64_d192.json" \
  16x16x384x192,16x16x512x192,8x16x640x192,16x16x640x192,8x16x768x192,16x16x1024x192,4x16x2048x192,2x16x4096x192 \
  $(both d192_persistent_n96_pm_ot d192_persistent_n64_pm_ot d192_persistent_n64s3_pm_ot) 2>&1 | grep -v '^compiling' | grep causal | cut -c1-250
