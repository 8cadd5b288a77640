#!/bin/bash
# longest_alone beside the served members over a grid of batches and odd/even ramps, bf16, 3 rounds alternating.
set -uo pipefail
export ATTNGEN_ENTRY=1 ATTNGEN_ROUNDS=3
S=specs/h100_wgmma
sh() { local d=$1 s=""; for k in 384 512 640 768 896 1152 1408; do for b in 1 2 3 4 6 8 12 16; do s="$s,${b}x16x${k}x$d"; done; done; echo ${s#,}; }
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 docs/hopper-h200/forward_specs_vs_cudnn.py $OUT/la_wide_d256.json $(sh 256) ${S}_d256_persistent_n64_pm_ot_sf_bf16.yaml ${S}_d256_persistent_n64_la_ot_sf_bf16.yaml 2>&1 | grep causal | cut -c1-250
timeout 200 python3 docs/hopper-h200/forward_specs_vs_cudnn.py $OUT/la_wide_d192.json $(sh 192) ${S}_d192_persistent_n96_pm_ot_bf16.yaml ${S}_d192_persistent_n64s3_pm_ot_bf16.yaml ${S}_d192_persistent_n96_la_ot_bf16.yaml ${S}_d192_persistent_n64s3_la_ot_bf16.yaml 2>&1 | grep causal | cut -c1-300
timeout 150 python3 docs/hopper-h200/forward_specs_vs_cudnn.py $OUT/la_wide_d128.json $(sh 128) ${S}_d128_persistent_q2_pm_bf16.yaml ${S}_d128_persistent_q2_la_bf16.yaml 2>&1 | grep causal | cut -c1-250
