# Is the persistent e4m3 even_odd cell's extra idle a spread between SMs (a slow SM sets the launch's end) or a
# late start / tail? Per-SM active-cycle min / avg / max of one launch each 
# Usage: OUT=DIR bash docs/fp8-h200/k_rows/ncu_opbq2/run_sm_spread.sh.
set -u
export ATTNGEN_CACHE_DIR=/tmp/agc_ncu
for pair in in_order:specs/h100_wgmma_d128_fp8_n192c2ps3r24x240opbq2.yaml keo:docs/fp8-h200/k_rows/specs/t_opbq2_keo.yaml \
            base_keo:specs/h100_wgmma_d128_fp8.yaml; do
  n=${pair%%:*}; s=${pair#*:}
  timeout 150 ncu --clock-control none --kernel-name regex:attngen_.* --launch-skip 2 --launch-count 1 \
    --metrics sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_elapsed.max,gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active \
    --csv python3 docs/fp8-h200/k_rows/ncu_opbq2/ncu_spec_calls.py $s 4x16x2048x128 > $OUT/ncu_sm_$n.csv 2>&1
  echo "$n:"; grep -E "sm__cycles|gpu__time|warps_active" $OUT/ncu_sm_$n.csv | awk -F'","' '{print "  " $(NF-2) " " $(NF-1) " " $NF}'
done
