#!/bin/bash
# The final checks on main (144dedb9), one device call (out/before_pkg/attngen is
# attngen at 93b0d6c9, git archive 93b0d6c9 attngen): first calls, cold full verify, GPU tests, the e4m3 host A/B, host_time.py.
set -uo pipefail
: "${OUT:?set OUT to a folder for the results}"
export PYTHONUNBUFFERED=1
export ATTNGEN_CACHE_DIR=/tmp/cache_cold
rm -rf $ATTNGEN_CACHE_DIR
{ for m in fwd dec; do E=$(mktemp -d); ATTNGEN_CACHE_DIR=$E timeout 30 python3 docs/measurements/first_call.py $m 2>&1 | grep -v '^compiling'; done; } > $OUT/first_call.txt 2>&1
s=$(date +%s.%N); timeout 240 python3 -m attngen verify > $OUT/verify_cold.txt 2>$OUT/verify_cold.err; rc=$?
echo "verify rc=$rc wall=$(python3 -c "print(round($(date +%s.%N)-$s,1))")"; grep -v ' pass$' $OUT/verify_cold.txt | tail -1
{ for m in fwd fwd dec dec; do timeout 30 python3 docs/measurements/first_call.py $m 2>&1 | grep -v '^compiling'; done; } >> $OUT/first_call.txt 2>&1
cat $OUT/first_call.txt
s=$(date +%s); timeout 150 python3 -m pytest -m gpu -q tests/test_gpu_fp8_kv.py tests/test_gpu_mla_decode.py > $OUT/pytest.txt 2>&1; echo "pytest rc=$? secs=$(( $(date +%s)-s ))"; tail -1 $OUT/pytest.txt; grep FAILED $OUT/pytest.txt | head -5
for d in specs templates generated; do ln -sfn $PWD/$d out/before_pkg/$d; done
for r in 1 2; do
  PYTHONPATH=/tmp/site:$PWD/out/before_pkg timeout 60 python3 docs/decode-h200/e4m3_host/host_ab.py before $OUT/host_before_$r.json 2>&1 | grep -v '^compiling'
  timeout 60 python3 docs/decode-h200/e4m3_host/host_ab.py after $OUT/host_after_$r.json 2>&1 | grep -v '^compiling'
done
timeout 100 python3 docs/measurements/host_time.py --json $OUT/host_time.json 2>&1 | grep -v '^compiling' | tail -30
