#!/bin/bash
# The device calls of a serving step's decode rows in place (DecodeKernel.rows_call, single_queries_apart).
#   check: every spec verified from an empty cache (compiles every spec in parallel, so the tests after it run on a
#          full cache), tests/test_gpu_paged_varlen.py whole, eager_paged.py (d128: the step's host and GPU time).
#   ab:    step_rows_ab.py in the tree before (BEFORE, its own cache) and this one, alternating, ROUNDS rounds
#          (plain paged decode calls, a plain paged prefill, the step, the ragged batch), then `attngen bench
#          --serving` in both trees.
#   tests: after the review's changes: every spec the table serves compiled (attngen warm), the step's tests of
#          tests/test_gpu_paged_varlen.py, then the decode call's GPU test files whole (their plain calls' prepared path
#          changed), within LIMIT seconds.
# Everything under $OUT is also packed into $OUT/step_rows_out.tar.gz (the device tool returns few files).
# Usage (repository root, GPU machine): OUT=DIR [BEFORE=DIR] [ROUNDS=N] [LIMIT=S] bash run_step_rows.sh check|ab|tests
set -uo pipefail
: "${OUT:?set OUT to the folder the reports go to}"
export PYTHONUNBUFFERED=1
HERE=docs/hopper-h200/paged_varlen
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
s=$(date +%s)
python3 -m compileall -q attngen
if [ "${1:-}" = check ]; then
  export ATTNGEN_CACHE_DIR=$(mktemp -d)
  timeout 240 python3 -m attngen verify > $OUT/verify.txt 2> $OUT/verify.err
  echo "verify rc=$? secs=$(( $(date +%s)-s ))"; grep -v ' pass$' $OUT/verify.txt | tail -3 | cut -c1-300; tail -2 $OUT/verify.err
  (head -3 $OUT/verify.txt; grep -v ' pass$' $OUT/verify.txt | tail -n +3) > $OUT/verify_summary.txt; rm $OUT/verify.txt
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_paged_varlen.py > $OUT/paged_tests.txt 2>&1
  echo "paged tests rc=$? secs=$(( $(date +%s)-s ))"; grep -E "^(FAILED|ERROR)" $OUT/paged_tests.txt | head; tail -1 $OUT/paged_tests.txt
  timeout 100 python3 $HERE/eager_paged.py $OUT/eager_paged.json 2>&1 | grep -v '^compiling'
elif [ "${1:-}" = ab ]; then
  : "${BEFORE:?set BEFORE to the tree before (its attngen, templates, specs)}"
  before_cache=$(mktemp -d); after_cache=$(mktemp -d)
  for r in $(seq 1 ${ROUNDS:-3}); do
    (cd $BEFORE && ATTNGEN_CACHE_DIR=$before_cache PYTHONPATH=/tmp/site:$BEFORE timeout 150 python3 \
      $OLDPWD/$HERE/step_rows/step_rows_ab.py $OUT/before_$r.json 2>&1 | grep -v '^compiling' | sed "s/^/before $r /")
    ATTNGEN_CACHE_DIR=$after_cache timeout 150 python3 $HERE/step_rows/step_rows_ab.py $OUT/after_$r.json 2>&1 \
      | grep -v '^compiling' | sed "s/^/after $r /"
    echo "round $r secs=$(( $(date +%s)-s ))"
  done
  (cd $BEFORE && ATTNGEN_CACHE_DIR=$before_cache PYTHONPATH=/tmp/site:$BEFORE timeout 90 python3 -m attngen bench \
    --serving --json $OUT/serving_before.json 2>&1 | grep -v '^compiling' | tail -8)
  ATTNGEN_CACHE_DIR=$after_cache timeout 90 python3 -m attngen bench --serving --json $OUT/serving_after.json 2>&1 \
    | grep -v '^compiling' | tail -8
elif [ "${1:-}" = tests ]; then
  timeout 200 python3 -m attngen warm --no-native 2>&1 | tail -1; echo "warm secs=$(( $(date +%s)-s ))"
  timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_paged_varlen.py \
    -k "in_place or rows_call or cannot_take or score_modifiers or mixed_step" > $OUT/step_tests.txt 2>&1
  echo "step tests rc=$? secs=$(( $(date +%s)-s ))"; grep -E "^(FAILED|ERROR)" $OUT/step_tests.txt | head; tail -1 $OUT/step_tests.txt
  t=$(( ${LIMIT:-540} - ($(date +%s) - s) ))
  timeout $t python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_paged.py tests/test_gpu_decode.py \
    tests/test_gpu_kv_append.py tests/test_gpu_runtime.py > $OUT/decode_tests.txt 2>&1
  echo "decode tests rc=$? secs=$(( $(date +%s)-s ))"; grep -E "^(FAILED|ERROR)" $OUT/decode_tests.txt | head; tail -1 $OUT/decode_tests.txt
fi
tar czf $OUT/step_rows_out.tar.gz -C $OUT $(cd $OUT && ls | grep -v step_rows_out) 2>/dev/null
true
