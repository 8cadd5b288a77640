#!/bin/bash
# The e4m3 d96 rows copy, one device call after the one of before_after_eager.sh, on a fresh machine: the fp16 contiguous
# probe, copy_ab.py and fp8_kv_decode.py again (the probe's output: probe_output.txt). Main at 5032d5cd; OUT: a folder.
set -uo pipefail
: "${OUT:?set OUT to a folder for the results}"
export PYTHONUNBUFFERED=1
echo "== probe (cold cache)"; timeout 120 python3 docs/decode-h200/d96_copy/e4m3_rows/fp16_contiguous_probe.py 2>&1 | grep -v '^compiling'
echo "== probe again"; timeout 120 python3 docs/decode-h200/d96_copy/e4m3_rows/fp16_contiguous_probe.py 2>&1 | grep -v '^compiling'
echo "== copy_ab"; timeout 120 python3 docs/decode-h200/d96_copy/copy_ab.py $OUT/copy_ab_again.json 3 2>&1 | grep -v compiling | head -3
echo "== fp8_kv_decode d96"; timeout 150 python3 docs/measurements/fp8_kv_decode.py --cases d96 --rounds 3 --json $OUT/fp8_kv_decode_d96_again.json 2>&1 | grep -v '^compiling' | head -8
