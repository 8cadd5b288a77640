#!/bin/bash
# One device call for this branch (the last P.V's fence in each arm of p_buffers 2's parity branch):
# verify the kmpb specs, time them against main's tree (old) in alternating processes (ABBA), then the
# e4m3 d128 base at 8192 keys over batch sizes (the waves' tail) beside two persistent trials of it.
set -uo pipefail
: "${OUT:?}" "${OLD:?}"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
s=$(date +%s); SITE=${PYTHONPATH%%:*}
R=$(mktemp -d); pack() { tar czf "$OUT/fo.tgz" -C "$R" .; }
left() { echo $(( ${LIMIT:-560} - ($(date +%s)-s) )); }
SPECS="specs/h100_wgmma_d128_persistent_q2_kmpb.yaml specs/h100_wgmma_d128_persistent_q2_kmpb_bf16.yaml"
SHAPES=${SHAPES:-16x16x384x128,16x16x512x128,8x16x1024x128,4x16x2048x128,2x16x8192x128}
side() {   # side NAME DIR ROUND
  [ "$(left)" -gt 70 ] || return 0
  (cd "$2" && PYTHONPATH=$SITE:$2 ATTNGEN_ROUNDS=2 timeout ${PROC_S:-80} python3 docs/hopper-h200/forward_specs_vs_cudnn.py \
     "$R/ab_$1_$3.json" $SHAPES $SPECS 2>&1 | grep -v '^compiling' | cut -c1-160)
  pack; echo "$1 $3 secs=$(( $(date +%s)-s ))"
}
(cd "$OLD" && PYTHONPATH=$SITE:$OLD timeout 200 python3 -m attngen verify --quick --no-mps --jobs 3 $SPECS > $R/quick_old.txt 2>&1) &
T=docs/fp8-h200/tile_trials/specs   # e4m3 trials: the base with persistent blocks (2 stages; one or two Q tiles)
timeout 200 python3 -m attngen verify --failures-only specs/h100_wgmma_d128_*kmpb.yaml $T/t_fp8_pb2s.yaml $T/t_fp8_pb2sq2.yaml > $R/verify_kmpb.txt 2>&1
echo "verify rc=$? secs=$(( $(date +%s)-s ))"; tail -2 $R/verify_kmpb.txt | cut -c1-300
wait; pack; tail -qn1 $R/quick_old.txt | cut -c1-200
for r in 1 2 3 4; do
  if [ $((r % 2)) = 1 ]; then side old "$OLD" $r; side new "$PWD" $r; else side new "$PWD" $r; side old "$OLD" $r; fi
done
[ "$(left)" -gt 40 ] && timeout $(( $(left) + 50 )) python3 -m attngen bench --json $R/fp8_8k.json --causal no --reps 20 \
  --shapes 2x16x8192x128,4x16x8192x128,1x16x8192x128,2x32x8192x128 specs/h100_wgmma_d128_fp8.yaml $T/t_fp8_pb2s.yaml \
  $T/t_fp8_pb2sq2.yaml > $R/fp8_8k.txt 2>&1
echo "fp8 rc=$? secs=$(( $(date +%s)-s ))"; grep -v '^compiling' $R/fp8_8k.txt | tail -12 | cut -c1-200
pack; echo "done secs=$(( $(date +%s)-s ))"
