#!/bin/bash
# One device call (about 120 s): the d64 three-warpgroup cell with softmax.lazy_rescale alone (member `lazy` of
# specs/h100_wgmma_d64_persistent_q2_c3.yaml, causal, the kernel of the trial d64/t_d64_c3_lazy.yaml; not in the table
# yet, because the table's d64 causal entries are rebuilt from `attngen bench` reports) beside the cells that serve d64
# causal calls, on the two grids where the three-warpgroup cell wins (../../round4/turns_d64_causal.json's), fp16 and
# bf16. The report goes into tests/test_dispatch.py's rebuild (`attngen dispatch --from ... --write`) after
# turns_d64_causal.json.
# Usage (repository root, GPU machine): OUT=DIR bash docs/hopper-h200/kept_max_first/members/run_d64_causal.sh
set -uo pipefail
: "${OUT:?set OUT to the folder the reports go to}"
S=specs/h100_wgmma_d64_
grep -q '^  lazy:' specs/h100_wgmma_d64_persistent_q2_c3.yaml || {
  echo "the member lazy is not in specs/h100_wgmma_d64_persistent_q2_c3.yaml: add it first (see the comment above)"; exit 2; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
specs=""
for c in persistent_q2_c3 persistent_q2_c3_lazy persistent_q2 n128c1hs2oet; do specs="$specs $S$c.yaml $S${c}_bf16.yaml"; done
timeout 100 python3 -m attngen verify ${S}persistent_q2_c3_lazy.yaml ${S}persistent_q2_c3_lazy_bf16.yaml > $OUT/verify_lazy.txt 2>&1
echo "verify rc=$?"; grep -v ' pass$' $OUT/verify_lazy.txt | tail -2
timeout 300 python3 -m attngen bench $specs --shapes 4x16x2048x64,2x16x8192x64 --causal yes --backends cudnn \
  --json $OUT/d64_causal_lazy.json 2>&1 | tail -12
