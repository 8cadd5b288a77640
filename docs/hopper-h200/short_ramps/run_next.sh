#!/bin/bash
# The next device call for short causal ramps (bf16; about 550 s: a cold verify first): the table's picks through
# attngen.attention beside the cells at 384 keys (the entries landed without an entry-point run), then the other
# odd ramps the table's buckets were not measured at: d96 (192-row blocks) at 576 keys, d64 and d128 at 640 and 896,
# d192 and d256 at 640, and d96 from 384 keys, whose persistent cell serves every causal call to 11585 keys from one
# measurement at 8192. Run from the repository root on the device:
#   bash .whl/setup.sh >/dev/null && export PYTHONPATH=/tmp/site:$PWD && OUT=$OUT bash docs/hopper-h200/short_ramps/run_next.sh
set -uo pipefail
: "${OUT:?}"
S=specs/h100_wgmma
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
# Owed since 82420007 (the kmpb fence) and 98d2c989 (the table): `attngen verify` over every spec from an empty cache,
# then a process's first call with the cache it left (as docs/hopper-h200/kept_max_first/members/run_owed.sh does).
export ATTNGEN_CACHE_DIR=$(mktemp -d); s=$(date +%s)
timeout 280 python3 -m attngen verify > "$OUT/verify_cold.txt" 2> "$OUT/verify_cold.err"
echo "verify rc=$? secs=$(( $(date +%s)-s ))"; grep -v ' pass$' "$OUT/verify_cold.txt" | tail -4
for m in fwd fwd dec dec; do timeout 60 python3 docs/measurements/first_call.py $m; done 2>&1 | tee "$OUT/first_call.txt"
ATTNGEN_ENTRY=1 ATTNGEN_ROUNDS=3 timeout 150 python3 docs/hopper-h200/forward_specs_vs_cudnn.py "$OUT/entry_384.json" \
  16x16x384x128,24x16x384x128,16x16x384x192,16x16x384x256,1x8x384x256 \
  ${S}_d128_n128c2ps2r24x240ppet_bf16.yaml ${S}_d128_persistent_q2_bf16.yaml ${S}_d192_km_bf16.yaml \
  ${S}_d192_persistent_bf16.yaml ${S}_d256_bf16.yaml ${S}_d256_persistent_n64_bf16.yaml ${S}_d256_persistent_bf16.yaml \
  2>&1 | grep -v '^compiling' | cut -c1-220
timeout 300 python3 -m attngen bench --json "$OUT/ramps_next.json" --causal yes --dtype bf16 --reps 25 --backends cudnn \
  --shapes 16x16x384x64,16x16x640x64,8x16x896x64,8x16x384x96,16x16x384x96,16x16x576x96,8x16x1024x96,1x8x576x96,8x16x640x128,16x16x640x128,8x16x896x128,8x16x640x192,16x16x640x192,8x16x640x256,16x16x640x256 \
  ${S}_d64_n128c1hs2oet_bf16.yaml ${S}_d64_persistent_q2_mc4_bf16.yaml ${S}_d64_n128c1ps3opb_bf16.yaml \
  ${S}_d64_persistent_q2_bf16.yaml ${S}_d96_bf16.yaml ${S}_d96_persistent_bf16.yaml \
  ${S}_d128_n128c2ps2r24x240ppet_bf16.yaml ${S}_d128_persistent_q2_bf16.yaml ${S}_d128_persistent_q2_kmpb_bf16.yaml \
  ${S}_d192_bf16.yaml ${S}_d192_persistent_bf16.yaml ${S}_d256_bf16.yaml ${S}_d256_persistent_n64_bf16.yaml \
  > "$OUT/ramps_next.txt" 2>&1
echo "bench rc=$?"; grep -v '^compiling' "$OUT/ramps_next.txt" | grep causal | grep -E '[0-9]+\.[0-9]' | cut -c1-120
