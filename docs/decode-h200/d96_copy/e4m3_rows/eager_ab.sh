#!/bin/bash
# One device call (main at 5032d5cd; out/split_decode_main.cu.j2 is 99dd6493's template). OUT: a folder for the results.
# e4m3 d96 before (out/split_decode_main.cu.j2) / after, in turn, twice, GPU and eager (fp8_kv_decode.py --eager)
set -uo pipefail
: "${OUT:?set OUT to a folder for the results}"
export PYTHONUNBUFFERED=1
T=templates/decode_mma/split.cu.j2; cp $T /tmp/decode_now.j2
for r in 1 2; do for m in before after; do
  if [ $m = before ]; then cp out/split_decode_main.cu.j2 $T; else cp /tmp/decode_now.j2 $T; fi
  echo "== e4m3 d96 $m $r"; timeout 120 python3 docs/measurements/fp8_kv_decode.py --cases d96 --rounds 3 --eager --json $OUT/eager_${m}_$r.json 2>&1 | grep -v '^compiling'
done; done
cp /tmp/decode_now.j2 $T
