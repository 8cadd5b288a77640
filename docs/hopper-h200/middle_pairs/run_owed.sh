#!/bin/bash
# The checks owed after a3bafb7d (schedule.middle_pairs, schedule.l2_hints and the rebuilt d128 table), in two
# device calls on one warm machine. PART=1 (about 330 s): a fresh process's first call with an empty cache (forward,
# then decode), `attngen verify` over every spec from another empty cache, and the first call again with the cache
# that left. PART=2 (about 330 s): run_final.sh, entry_check.py and entry_eager.py. From the repository root:
#   bash .whl/setup.sh >/dev/null && export PYTHONPATH=/tmp/site:$PWD && OUT=$OUT PART=1 bash docs/hopper-h200/middle_pairs/run_owed.sh
set -uo pipefail
: "${OUT:?}" "${PART:?}"
D=docs/hopper-h200/middle_pairs
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
if [ "$PART" = 1 ]; then
    export ATTNGEN_CACHE_DIR=$(mktemp -d)
    for m in fwd dec; do timeout 120 python3 docs/measurements/first_call.py $m; done 2>&1 | tee "$OUT/first_call_empty.txt"
    export ATTNGEN_CACHE_DIR=$(mktemp -d); s=$(date +%s)
    timeout 420 python3 -m attngen verify > "$OUT/verify_cold.txt" 2> "$OUT/verify_cold.err"
    echo "verify rc=$? secs=$(( $(date +%s)-s ))"; grep -v ' pass$' "$OUT/verify_cold.txt" | tail -4
    for m in fwd fwd dec dec; do timeout 60 python3 docs/measurements/first_call.py $m; done 2>&1 | tee "$OUT/first_call_warm.txt"
else
    OUT=$OUT bash $D/run_final.sh
    timeout 120 python3 $D/entry_check.py "$OUT/entry_check.json" > "$OUT/entry_check.txt" 2>&1
    echo "entry_check rc=$?"; tail -3 "$OUT/entry_check.txt"
    timeout 150 python3 $D/entry_eager.py "$OUT/entry_eager.json" 2>&1 | grep -v '^compiling'
fi
