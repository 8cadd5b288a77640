#!/bin/bash
# Two device calls owed after the paged members' Params lost the pools' strides and the table took `min_page`.
#   verify: `attngen verify` over every spec from an empty cache; a process's first call from another empty cache and
#           then with the cache verify left; tests/test_gpu_paged_varlen.py whole on the warm cache.
#   tests:  tests/test_gpu_paged_varlen.py whole, eager_paged.py (host and GPU time through the entry point),
#           FlashAttention's test_flash_attn_varlen_causal (out/fa carried).
#   trials: trials_ab.py.
#   after:  once the members took the trials' copies: their GPU tests, paged_ab.py and eager_paged.py again.
#   next:   every spec verified again (from an empty cache), the paged tests whole, eager_paged.py --profile and its
#           host and GPU times (a prefill of equal chunks now skips the decode split), and trials_ab.py at d256 (the
#           64-key tiles beside the 80-key ones).
#   n64:    once d256's 64-key member served pages of 64 and more: every served cell compiled, the member verified, the
#           paged tests whole, eager_paged.py's serving step (host profile, host and GPU times), paged_ab.py at d256.
#   grid:   every served cell compiled, the paged tests of d256 and of the Hopper members (the 64-key member's
#           entries), then the short forward cells against cuDNN (forward_vs_cudnn.py, 3 rounds) after the kept-max
#           members changed.
#   owed:   after d256's 64-key member: `attngen verify` over every spec from an empty cache (its text report), a
#           process's first call from another empty cache and then warm, eager_paged.py at d256 (host and GPU times).
# Usage (repository root, GPU machine): OUT=DIR [LIMIT=S] bash docs/hopper-h200/paged_varlen/run_owed.sh
#        verify|tests|trials|after|next|n64|grid|owed
set -uo pipefail
: "${OUT:?set OUT to the folder the reports go to}"
LIMIT=${LIMIT:-570}
export PYTHONUNBUFFERED=1
HERE=docs/hopper-h200/paged_varlen
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
s=$(date +%s)
left() { echo $(( LIMIT - ($(date +%s) - s) )); }
# paged_tests FILE SECONDS [PYTEST ARGS]: tests/test_gpu_paged_varlen.py into $OUT/FILE, then its failures and count
paged_tests() {
  local file=$1 limit=$2; shift 2
  timeout $limit python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_paged_varlen.py "$@" > $OUT/$file 2>&1
  echo "paged tests rc=$? secs=$(( $(date +%s)-s ))"; grep -E "^(FAILED|ERROR)" $OUT/$file | head; tail -1 $OUT/$file
}
# cold_verify NAME SECONDS: `attngen verify` of every spec from an empty cache into $OUT/NAME.txt and .err (that cache
# then kept), then a process's first call from another empty cache and with that one, into $OUT/first_call*.txt
cold_verify() {
  export ATTNGEN_CACHE_DIR=$(mktemp -d)
  timeout $2 python3 -m attngen verify > $OUT/$1.txt 2> $OUT/$1.err
  echo "verify rc=$? secs=$(( $(date +%s)-s ))"; grep -v ' pass$' $OUT/$1.txt | tail -3; tail -3 $OUT/$1.err
  for m in fwd dec; do ATTNGEN_CACHE_DIR=$(mktemp -d) timeout 90 python3 docs/measurements/first_call.py $m; done \
    2>&1 | tee $OUT/first_call_empty_cache.txt
  for m in fwd fwd dec dec; do timeout 60 python3 docs/measurements/first_call.py $m; done 2>&1 | tee $OUT/first_call.txt
}
python3 -m compileall -q attngen
if [ "${1:-}" = verify ]; then
  cold_verify verify_cold 280
  paged_tests paged_tests.txt $(left)
elif [ "${1:-}" = tests ]; then
  timeout 200 python3 -m attngen warm --no-native 2>&1 | tail -1     # every spec the table serves, 16 nvcc at once
  paged_tests paged_tests.txt 240
  timeout 120 python3 $HERE/eager_paged.py $OUT/eager_paged.json 2>&1 | grep -v '^compiling'
  t=$(left); [ $t -gt 60 ] && [ -f out/fa/test_flash_attn.py ] && {
    FA_SAMPLE=4 FA_TIME_BUDGET=$(( t - 30 )) FA_REPORT=$OUT/fa_varlen_causal.json timeout $t \
      bash docs/fa-tests/run.sh "test_flash_attn_varlen_causal" -n 8 > $OUT/fa_varlen_causal.txt 2>&1
    echo "FA varlen causal rc=$?"; tail -4 $OUT/fa_varlen_causal.txt; }
elif [ "${1:-}" = next ]; then
  export ATTNGEN_CACHE_DIR=$(mktemp -d)
  timeout 200 python3 -m attngen verify > $OUT/verify_after.txt 2> $OUT/verify_after.err   # compiles in parallel too
  echo "verify rc=$? secs=$(( $(date +%s)-s ))"; grep -v ' pass$' $OUT/verify_after.txt | tail -2; tail -2 $OUT/verify_after.err
  paged_tests paged_tests_next.txt 200
  timeout 60 python3 $HERE/eager_paged.py --profile > $OUT/eager_profile.txt 2>&1; head -40 $OUT/eager_profile.txt
  timeout 120 python3 $HERE/eager_paged.py $OUT/eager_paged_next.json 2>&1 | grep -v '^compiling'
  t=$(left); [ $t -gt 30 ] && timeout $t python3 $HERE/trials_ab.py $OUT/trials_d256.json 256 2>&1 | grep -v '^compiling'
elif [ "${1:-}" = n64 ]; then
  timeout 200 python3 -m attngen warm --no-native 2>&1 | tail -1; echo "warm secs=$(( $(date +%s)-s ))"
  timeout 90 python3 -m attngen verify specs/h100_wgmma_d256_varlen_paged_n64{,_bf16}.yaml > $OUT/verify_n64.txt 2>&1
  echo "verify rc=$?"; tail -2 $OUT/verify_n64.txt | cut -c1-300
  paged_tests paged_tests_n64.txt 150
  timeout 60 python3 $HERE/eager_paged.py --profile > $OUT/eager_profile_step.txt 2>&1; head -75 $OUT/eager_profile_step.txt | cut -c1-160
  timeout 100 python3 $HERE/eager_paged.py $OUT/eager_paged_step.json 2>&1 | grep -v '^compiling'
  t=$(left); timeout $t python3 $HERE/paged_ab.py $OUT/paged_ab_d256.json 256 2>&1 | grep -v '^compiling' | cut -c1-400
elif [ "${1:-}" = owed ]; then
  cold_verify verify_owed 240
  timeout $(left) python3 $HERE/eager_paged.py $OUT/eager_paged_d256.json 256 2>&1 | grep -v '^compiling'
elif [ "${1:-}" = grid ]; then
  timeout 200 python3 -m attngen warm --no-native 2>&1 | tail -1; echo "warm secs=$(( $(date +%s)-s ))"
  paged_tests paged_tests_d256.txt 150 -k "d256 or hopper"
  t=$(left); timeout $t python3 docs/hopper-h200/forward_vs_cudnn.py $OUT/forward_vs_cudnn.json 3 2>&1 | grep -v '^compiling' | cut -c1-200
elif [ "${1:-}" = after ]; then
  timeout 150 python3 -m attngen warm --no-native 2>&1 | tail -1
  paged_tests paged_tests_after.txt 150 -k "hopper or routes or pads or mixed"
  t=$(left); timeout $(( t - 60 )) python3 $HERE/paged_ab.py $OUT/paged_ab_after.json 2>&1 | grep -v '^compiling' | cut -c1-220
  t=$(left); timeout $t python3 $HERE/eager_paged.py $OUT/eager_paged_after.json 2>&1 | grep -v '^compiling'
else
  timeout 200 python3 -m attngen warm --no-native $HERE/trials/*.yaml specs/h100_wgmma_d{64,128}_varlen.yaml specs/h100_wgmma_d256.yaml \
    specs/h100_mma_d{64,128,256}_paged{,_bf16}.yaml 2>&1 | tail -1
  t=$(left); timeout $t python3 $HERE/trials_ab.py $OUT/trials_ab.json 2>&1 | grep -v '^compiling'
fi
true
