#!/bin/bash
# One device call (at most about 560 s): the three kept-max specs verified, compiled beside the cells they are timed
# against, then members_ab.py.
# Usage (repository root, GPU machine): OUT=DIR bash docs/hopper-h200/kept_max_first/members/run_members.sh
set -uo pipefail
: "${OUT:?set OUT to the folder the reports go to}"
export PYTHONUNBUFFERED=1
S=specs/h100_wgmma_
NEW="${S}d128_sink_persistent_kmpb.yaml ${S}d128_sink_persistent_kmpb_bf16.yaml ${S}d256_persistent_km.yaml
  ${S}d256_persistent_km_bf16.yaml ${S}d256_softcap_persistent_km.yaml ${S}d256_softcap_persistent_km_bf16.yaml"
OLD=; for n in d128_sink_persistent d128_sink d256_softcap_persistent d256_persistent d256_persistent_n64; do
  OLD="$OLD ${S}$n.yaml ${S}${n}_bf16.yaml"; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 150 python3 -m attngen verify $NEW > $OUT/verify_members.txt 2>&1
echo "verify rc=$?"; grep -v ' pass$' $OUT/verify_members.txt | tail -3
timeout 120 python3 -m attngen warm --no-native --jobs 16 $OLD > $OUT/warm.txt 2>&1; echo "warm rc=$?"
timeout 330 python3 docs/hopper-h200/kept_max_first/members/members_ab.py $OUT/members_ab.json 2>&1 | grep -v '^compiling'
