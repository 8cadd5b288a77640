# One template of decode_mla before and after a change, each timed by seesaw_ab.py (the seesaw cell against the
# shared-tile wgmma cell, alternating in one process), the two versions in turn, ROUNDS processes each.
# Usage (GPU machine, repository root):
#   bash docs/decode-h200/mla_seesaw/issue_cost/before_after.sh OUT_DIR TEMPLATE BEFORE_FILE [ROUNDS]
# TEMPLATE: e.g. templates/decode_mla/split_seesaw.cu.j2, "after" as it is in the tree; BEFORE_FILE: that
# template as it was (e.g. `git show REV:TEMPLATE > FILE` before sending the tree). Writes
# OUT_DIR/{before,after}_N.json; the cubin cache is keyed by source, so each version compiles once.
set -e
out=$1; t=$2; before=$3; rounds=${4:-2}
mkdir -p "$out"
after=$(mktemp); cp "$t" "$after"
trap 'cp "$after" "$t"' EXIT
for r in $(seq "$rounds"); do
  for v in before after; do
    if [ $v = before ]; then cp "$before" "$t"; else cp "$after" "$t"; fi
    python3 docs/decode-h200/mla_seesaw/seesaw_ab.py "$out/${v}_$r.json" 2
  done
done
