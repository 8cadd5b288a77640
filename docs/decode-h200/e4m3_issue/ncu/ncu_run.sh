# Nsight Compute profiles of the contiguous d128 decode cells (B8 32/8, fp16 queries): details, and the source page as CSV.
# Usage (GPU machine, repository root): OUT=DIR bash docs/decode-h200/e4m3_issue/ncu/ncu_run.sh
set -e
mkdir -p $OUT/ncu
for spec in "h200_decode_d128_kv_e4m3_contiguous_s2 8192" "h200_decode_d128_contiguous 8192" "h200_decode_d128_kv_e4m3_contiguous_s2 16384"; do
  set -- $spec; n=$1_$2
  python3 docs/decode-h200/e4m3_issue/ncu/ncu_calls.py $1 $2 > /dev/null
  ncu --clock-control none --kernel-name regex:.*split.* --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats --section WarpStateStats \
    --section SchedulerStats --section MemoryWorkloadAnalysis --section SourceCounters --section Occupancy --section LaunchStats \
    -o $OUT/ncu/$n python3 docs/decode-h200/e4m3_issue/ncu/ncu_calls.py $1 $2 > $OUT/ncu/$n.log 2>&1 || tail -20 $OUT/ncu/$n.log
  ncu --import $OUT/ncu/$n.ncu-rep --page details > $OUT/ncu/${n}_details.txt
  ncu --import $OUT/ncu/$n.ncu-rep --page source --csv --print-source sass | gzip > $OUT/ncu/${n}_sass.csv.gz
  ncu --import $OUT/ncu/$n.ncu-rep --page raw --csv > $OUT/ncu/${n}_raw.csv
  rm -f $OUT/ncu/$n.ncu-rep
  echo done $n
done
