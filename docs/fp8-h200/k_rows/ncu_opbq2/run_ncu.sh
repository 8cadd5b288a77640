# Why k_rows even_odd loses on the persistent d128 cell: ncu of the in_order and even_odd copies at 4x16x2048x128 full.
# Usage: OUT=DIR bash docs/fp8-h200/k_rows/ncu_opbq2/run_ncu.sh
set -u
export ATTNGEN_CACHE_DIR=/tmp/agc_ncu
for pair in in_order:specs/h100_wgmma_d128_fp8_n192c2ps3r24x240opbq2.yaml keo:docs/fp8-h200/k_rows/specs/t_opbq2_keo.yaml \
            base_keo:specs/h100_wgmma_d128_fp8.yaml; do
  n=${pair%%:*}; s=${pair#*:}
  timeout 200 ncu --clock-control none --kernel-name regex:attngen_.* --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    --section LaunchStats --csv --page details python3 docs/fp8-h200/k_rows/ncu_opbq2/ncu_spec_calls.py $s 4x16x2048x128 > $OUT/ncu_$n.csv 2>&1
  echo "$n: $(grep -c . $OUT/ncu_$n.csv) lines"; grep -E "Duration|L2 Hit|DRAM Throughput|Memory Throughput|Issue Slots|Stall" $OUT/ncu_$n.csv | head -12
done
