#!/bin/bash
# One device call (at most about 560 s) after the cells made from run_more.sh's trials (the d128 window, the d128 and
# d64 varlen cells, d192 full masks, the d64 three-warpgroup cells with lazy_rescale): `attngen verify` of the new
# cells (fp16 and bf16), attngen.attention on a call each now serves beside the new cell and the cell served before
# (entry_members.py more), the varlen cells on docs/varlen-h200's short batch beside attngen.attention_varlen
# (varlen_ab.py short), `attngen verify` over every spec (text output), then the GPU test files of varlen and
# variants as long as the call lasts. With `quick`, only the verify and the entry point (about 150 s).
# Usage (repository root, GPU machine): OUT=DIR bash docs/hopper-h200/kept_max_first/members/run_made.sh [quick]
set -uo pipefail
: "${OUT:?set OUT to the folder the reports go to}"
export PYTHONUNBUFFERED=1
HERE=docs/hopper-h200/kept_max_first/members
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -m compileall -q attngen
s=$(date +%s)
cells=""
for c in d128_window_persistent_kmpb d128_varlen_km d64_varlen_km d64_m192_varlen_km d192_km d192_v128_persistent_km \
         d64_persistent_q2_c3_window_lazy d64_persistent_q2_c3_sink_lazy; do
  cells="$cells specs/h100_wgmma_$c.yaml specs/h100_wgmma_${c}_bf16.yaml"
done
timeout 150 python3 -m attngen verify $cells > $OUT/verify_made.txt 2>&1
echo "verify rc=$?"; grep -v ' pass$' $OUT/verify_made.txt | tail -3
timeout 120 python3 $HERE/entry_members.py $OUT/entry_more.json more 2>&1 | grep -v '^compiling'
[ "${1:-}" = quick ] && exit
timeout 80 python3 $HERE/varlen_ab.py $OUT/varlen_short_ab.json short 2>&1 | grep -v '^compiling'
v=$(date +%s)
timeout 200 python3 -m attngen verify > $OUT/verify_all.txt 2> $OUT/verify_all.err
echo "verify all rc=$? secs=$(( $(date +%s)-v ))"; grep -v ' pass$' $OUT/verify_all.txt | tail -4; tail -3 $OUT/verify_all.err
left=$(( 540 - ($(date +%s)-s) ))
timeout $left python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_varlen_variants.py tests/test_gpu_window_softcap.py \
  > $OUT/gpu_tests.txt 2>&1
echo "pytest rc=$? left=$left"; tail -3 $OUT/gpu_tests.txt
