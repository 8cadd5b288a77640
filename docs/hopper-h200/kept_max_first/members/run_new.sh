#!/bin/bash
# One device call (at most about 580 s) after the three specs made from run_next.sh's trials: `attngen verify` of the
# three specs (fp16 and bf16), attngen.attention on a call each now serves beside the spec and the cell served before
# (entry_members.py next), d256 causal from 8192 keys with a kept max (members_ab.py causal_long, its trial verified
# first), a fresh process's first call from an empty cache (the table changed), `attngen verify` over every spec (text
# output), then the GPU test files through the entry points that reach the changed entries, as long as the call lasts.
# Usage (repository root, GPU machine): OUT=DIR bash docs/hopper-h200/kept_max_first/members/run_new.sh
set -uo pipefail
: "${OUT:?set OUT to the folder the reports go to}"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -m compileall -q attngen
s=$(date +%s)
timeout 120 python3 -m attngen verify specs/h100_wgmma_d128_softcap_persistent_kmpb.yaml \
  specs/h100_wgmma_d128_sink_window_persistent_kmpb.yaml specs/h100_wgmma_d256_km.yaml specs/h100_wgmma_d256_km_bf16.yaml \
  docs/hopper-h200/kept_max_first/members/next/t_d256_km_causal*.yaml > $OUT/verify_new.txt 2>&1
echo "verify rc=$?"; grep -v ' pass$' $OUT/verify_new.txt | tail -3
timeout 120 python3 docs/hopper-h200/kept_max_first/members/entry_members.py $OUT/entry_new.json next 2>&1 | grep -v '^compiling'
timeout 80 python3 docs/hopper-h200/kept_max_first/members/members_ab.py $OUT/causal_long_ab.json causal_long 2>&1 | grep -v '^compiling'
export ATTNGEN_CACHE_DIR=$(mktemp -d)
for m in fwd fwd dec dec; do timeout 60 python3 docs/measurements/first_call.py $m; done 2>&1 | tee $OUT/first_call_empty.txt
unset ATTNGEN_CACHE_DIR
v=$(date +%s)
timeout 240 python3 -m attngen verify > $OUT/verify_all.txt 2> $OUT/verify_all.err
echo "verify all rc=$? secs=$(( $(date +%s)-v ))"; grep -v ' pass$' $OUT/verify_all.txt | tail -4; tail -3 $OUT/verify_all.err
left=$(( 560 - ($(date +%s)-s) ))
timeout $left python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_window_softcap.py tests/test_gpu_model_zoo.py \
  tests/test_gpu_ops.py > $OUT/gpu_tests.txt 2>&1
echo "pytest rc=$? left=$left"; tail -3 $OUT/gpu_tests.txt
