#!/bin/bash
# One device call (at most about 400 s): `attngen verify` of every trial in trials/ (fp16 and bf16; the verifier's
# varlen cases with windows, sinks, softcap and ALiBi against fp32), then varlen_variants_ab.py (each model's varlen
# call through attngen.attention_varlen, served by the mma.sync cells, beside the Hopper-kind trial).
# Usage (repository root, GPU machine): OUT=DIR bash docs/hopper-h200/varlen_variants/run_trials.sh
set -uo pipefail
: "${OUT:?set OUT to the folder the reports go to}"
export PYTHONUNBUFFERED=1
HERE=docs/hopper-h200/varlen_variants
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 200 python3 -m attngen verify $HERE/trials/*.yaml > $OUT/verify_trials.txt 2>&1
echo "verify rc=$?"; grep -v ' pass$' $OUT/verify_trials.txt | tail -4
timeout 180 python3 $HERE/varlen_variants_ab.py $OUT/varlen_variants_ab.json 2>&1 | grep -v '^compiling'
