#!/bin/bash
# A warm process's first call as an installed attngen has it: the package (with templates/, specs/ and
# generated/ inside, as the wheel lays them out) copied to local disk and its bytecode compiled, the
# cubin cache filled, then fresh processes of first_call_stages.py alternating forward and decode.
# Before: a checkout in .old/ (optional), measured the same way in the same rounds.
# Usage (GPU machine, repository root): bash docs/measurements/first_call_installed.sh [ROUNDS]
set -uo pipefail
rounds=${1:-5}
export ATTNGEN_CACHE_DIR=${ATTNGEN_CACHE_DIR:-/tmp/attngen-first-call-cache}
stages="$PWD/docs/measurements/first_call_stages.py"
python3 -m attngen warm --no-progress 2>&1 | tail -n 1
trees=(new)
[ -d .old/attngen ] && trees=(old new)
for tree in "${trees[@]}"; do
  src=$PWD; [ "$tree" = old ] && src=$PWD/.old
  dest=$(mktemp -d)/site
  mkdir -p "$dest" && cp -r "$src/attngen" "$dest/" && cp -r "$src/templates" "$src/specs" "$src/generated" "$dest/attngen/"
  python3 -m compileall -q "$dest" >/dev/null
  eval "site_$tree=$dest"
done
for ((i = 1; i <= rounds; i++)); do
  for tree in "${trees[@]}"; do
    site=site_$tree
    for mode in fwd dec; do
      echo -n "$tree $mode: "
      (cd /tmp && PYTHONPATH="${!site}:${PYTHONPATH:-}" python3 "$stages" "$mode" 2>&1 | grep -v "PyCUDA WARNING\|cuModuleUnload" | tail -n 1)
    done
  done
done
