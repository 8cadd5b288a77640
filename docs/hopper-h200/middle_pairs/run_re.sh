#!/bin/bash
# Trial: the d192 and d256 persistent members with O stored from registers (epilogue: registers), so a block hands
# its Q tile back once its last GEMM is done and the next Q loads during the epilogue (O staged over Q holds it until
# the store has read it out). Verify, then bf16 causal, 3 rounds alternating with cuDNN; and d128's kmpb beside the
# pm member at 768 and 800 keys (the 573-809 bucket). About 250 s:
#   bash .whl/setup.sh >/dev/null && export PYTHONPATH=/tmp/site:$PWD && OUT=$OUT bash docs/hopper-h200/middle_pairs/run_re.sh
# (the two _re members were removed after the trial: add them back to specs/h100_wgmma_d256.yaml and
# specs/h100_wgmma_d192.yaml as their pm members with epilogue: registers to run it again)
set -uo pipefail
: "${OUT:?}"
S=specs/h100_wgmma
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 120 python3 -m attngen verify ${S}_d256_persistent_n64_pm_re.yaml ${S}_d256_persistent_n64_pm_re_bf16.yaml \
  ${S}_d192_persistent_pm_re.yaml ${S}_d192_persistent_pm_re_bf16.yaml > "$OUT/verify_re.txt" 2> "$OUT/verify_re.err"
echo "verify rc=$?"; grep -v ' pass$' "$OUT/verify_re.txt" | tail -2 | cut -c1-250
export ATTNGEN_ENTRY=1 ATTNGEN_ROUNDS=3
t() { timeout "$1" python3 docs/hopper-h200/forward_specs_vs_cudnn.py "$OUT/$2.json" "$3" "${@:4}" 2>&1 | grep -v '^compiling' | grep causal | cut -c1-250; }
t 150 re_d256 8x16x384x256,8x16x512x256,16x16x512x256,32x16x512x256,16x16x640x256,8x16x1024x256,16x16x1024x256 \
  ${S}_d256_persistent_n64_pm_re_bf16.yaml ${S}_d256_persistent_n64_pm_bf16.yaml ${S}_d256_bf16.yaml ${S}_d256_persistent_n64_bf16.yaml
t 120 re_d192 8x16x384x192,16x16x512x192,16x16x640x192,8x16x768x192,16x16x1024x192 \
  ${S}_d192_persistent_pm_re_bf16.yaml ${S}_d192_persistent_pm_bf16.yaml ${S}_d192_persistent_bf16.yaml ${S}_d192_km_bf16.yaml
t 60 kmpb_d128 16x16x768x128,16x16x800x128 \
  ${S}_d128_persistent_q2_pm_bf16.yaml ${S}_d128_persistent_q2_kmpb_bf16.yaml
