#!/bin/bash
# d128 at 512 keys (four query blocks, nothing to pair), both masks: the cells of the persistent_q2 family (with the
# pm member, whose L2 hints are the only difference from persistent_q2 there, and a trial io_l2 member: io with the
# hints) beside ppet and kmpb; attngen bench, both dtypes, 1x8 to 32x16 heads: the report the d128 entries rebuild
# from last. About 90 s:
#   bash .whl/setup.sh >/dev/null && export PYTHONPATH=/tmp/site:$PWD && OUT=$OUT bash docs/hopper-h200/middle_pairs/run_512.sh
set -uo pipefail
: "${OUT:?}"
S=specs/h100_wgmma
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 60 python3 -m attngen verify ${S}_d128_persistent_q2_io_l2.yaml ${S}_d128_persistent_q2_io_l2_bf16.yaml > "$OUT/verify_io_l2.txt" 2>&1
echo "verify rc=$?"; grep "attngen verify:" "$OUT/verify_io_l2.txt" | cut -c1-200
specs=(); for s in d128_n128c2ps2r24x240ppet d128_persistent_q2 d128_persistent_q2_kmpb; do specs+=("${S}_$s.yaml" "${S}_${s}_bf16.yaml"); done
timeout 200 python3 -m attngen bench --json "$OUT/d128_512.json" --causal both --reps 25 --backends cudnn \
  --shapes 1x8x512x128,4x16x512x128,8x16x512x128,16x16x512x128,32x16x512x128 "${specs[@]}" > "$OUT/d128_512.txt" 2>&1
echo "bench rc=$?"; grep -E '[0-9]+\.[0-9]' "$OUT/d128_512.txt" | grep -v "^compil" | cut -c1-100
