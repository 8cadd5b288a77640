#!/bin/bash
# One GPU-machine call for a change to the runtime: host time before (.old, if present) and after,
# the runtime's GPU tests, then every GPU test. Start: bash .whl/setup.sh && export PYTHONPATH=/tmp/site:$PWD
set -uo pipefail
export PYTHONUNBUFFERED=1 ATTNGEN_CACHE_DIR=${ATTNGEN_CACHE_DIR:-$PWD/.cache/attngen}
out=${OUT:-/tmp/attngen-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ -d .old/attngen ] && [ "${BEFORE:-1}" = 1 ]; then
  echo "== host time, before"
  PYTHONPATH=/tmp/site:$PWD/.old python3 docs/measurements/host_time.py --label before --no-torch --json "$out/host_before.json" 2>&1 | grep -v "^compiling"
fi
echo "== host time, after"
python3 docs/measurements/host_time.py --label after --json "$out/host_after.json" 2>&1 | grep -v "^compiling"
echo "== pytest ${TESTS:-tests/test_gpu_runtime.py}"
python3 -m pytest -m gpu -q -p no:cacheprovider ${TESTS:-tests/test_gpu_runtime.py} 2>&1 | tail -n 40
