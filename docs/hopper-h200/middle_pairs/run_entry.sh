#!/bin/bash
# After the table's new entries: attngen.attention beside the members and the cells they replaced, fp16 and bf16,
# 3 rounds alternating with cuDNN; with 576, 704 and 768 keys (an odd ramp the reports did not time, and the even
# ramps of the 573-809 bucket, where the d128 member walks unpaired). About 200 s:
#   bash .whl/setup.sh >/dev/null && export PYTHONPATH=/tmp/site:$PWD && OUT=$OUT bash docs/hopper-h200/middle_pairs/run_entry.sh
set -uo pipefail
: "${OUT:?}"
S=specs/h100_wgmma
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
export ATTNGEN_ENTRY=1 ATTNGEN_ROUNDS=3
t() { timeout "$1" python3 docs/hopper-h200/forward_specs_vs_cudnn.py "$OUT/$2.json" "$3" "${@:4}" 2>&1 | grep -v '^compiling' | grep causal | cut -c1-250; }
both() { for s in "$@"; do echo "${S}_$s.yaml ${S}_${s}_bf16.yaml"; done; }
t 200 entry_d128 16x16x384x128,32x16x384x128,16x16x576x128,16x16x640x128,24x16x640x128,16x16x704x128,16x16x768x128 \
  $(both d128_persistent_q2_pm d128_persistent_q2 d128_n128c2ps2r24x240ppet)
t 150 entry_d192_d256 16x16x640x192,16x16x576x192,1x8x640x256,8x16x640x256,16x16x640x256 \
  $(both d192_persistent_pm d192_persistent d256_persistent_n64_pm d256 d256_persistent_n64)
