#!/bin/bash
# Nsight Compute on the short causal d192/d256 cells (ncu_short.py): attngen's kernel and cuDNN's per cell, one CSV.
#   bash .whl/setup.sh >/dev/null && export PYTHONPATH=/tmp/site:$PWD && OUT=$OUT bash docs/hopper-h200/short_first/run_ncu_short.sh
set -uo pipefail
: "${OUT:?}"
timeout 300 ncu --clock-control none --profile-from-start off -k 'regex:attngen|cudnn|fmha|flash' \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section WarpStateStats \
  --section SchedulerStats --section LaunchStats \
  --metrics sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_active.min,dram__bytes_read.sum,dram__bytes_write.sum \
  --csv --page details python3 docs/hopper-h200/short_first/ncu_short.py > "$OUT/ncu_short.csv" 2> "$OUT/ncu_short.err"
echo "ncu rc=$? lines=$(grep -c . "$OUT/ncu_short.csv")"; tail -3 "$OUT/ncu_short.err"
