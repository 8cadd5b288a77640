#!/bin/bash
# After the table took the own_in_turns members: the persistent walks' GPU test (the new members among them),
# entry_check.py, then attngen.attention beside the cells served before and cuDNN (3 rounds alternating, fp16 and
# bf16), and its eager time (docs/hopper-h200/middle_pairs/entry_eager.py). About 300 s:
#   bash .whl/setup.sh >/dev/null && export PYTHONPATH=/tmp/site:$PWD && OUT=$OUT bash docs/hopper-h200/own_in_turns/run_final.sh
set -uo pipefail
: "${OUT:?}"
S=specs/h100_wgmma
D=docs/hopper-h200/own_in_turns
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_verify.py -k persistent_walks > "$OUT/walks_test.txt" 2>&1
echo "walks test rc=$?"; tail -1 "$OUT/walks_test.txt"
timeout 150 python3 $D/entry_check.py "$OUT/entry_check.json" > "$OUT/entry_check.txt" 2>&1
echo "entry_check rc=$?"; tail -1 "$OUT/entry_check.txt"
export ATTNGEN_ENTRY=1 ATTNGEN_ROUNDS=3
both() { for s in "$@"; do echo "${S}_$s.yaml ${S}_${s}_bf16.yaml"; done; }
t() { timeout "$1" python3 docs/hopper-h200/forward_specs_vs_cudnn.py "$OUT/$2.json" "$3" "${@:4}" 2>&1 | grep -v '^compiling' | grep -E 'causal|none' | cut -c1-300; }
t 150 final_d192 16x16x384x192,16x16x512x192,8x16x640x192,16x16x640x192,8x16x768x192,16x16x1024x192 \
  $(both d192_persistent d192_persistent_pm d192_km)
t 150 final_d256 16x16x384x256,16x16x512x256,16x16x640x256,8x16x768x256,16x16x1024x256 \
  $(both d256 d256_persistent d256_persistent_n64 d256_persistent_n64_pm)
timeout 120 python3 docs/hopper-h200/middle_pairs/entry_eager.py "$OUT/entry_eager.json" \
  16x16x384x192,16x16x512x192,8x16x640x192,16x16x640x192,16x16x1024x192,16x16x384x256,16x16x512x256,16x16x640x256,16x16x1024x256 \
  2>&1 | grep -v '^compiling'
