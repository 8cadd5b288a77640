# Versions of templates/decode_mma/split.cu.j2, each timed by time_cells.py, in turn, ROUNDS processes each (the
# cubin cache is keyed by source: each version compiles once); the tree's own template is the version "tree".
# Usage (GPU machine, repository root):
#   bash docs/decode-h200/e4m3_issue/ab.sh OUT_DIR ROUNDS CELLS FILE...
# CELLS: time_cells.py's filter (a substring of the cells' names, "" for all); FILE: a version of the template
# (e.g. `git show REV:templates/decode_mma/split.cu.j2 > FILE`), written to OUT_DIR/<FILE's stem>_N.json.
set -e
out=$1; rounds=$2; cells=$3; shift 3; t=templates/decode_mma/split.cu.j2
mkdir -p "$out"
tree=$(mktemp); cp "$t" "$tree"
trap 'cp "$tree" "$t"' EXIT
for r in $(seq "$rounds"); do
  for f in "$@" tree; do
    if [ "$f" = tree ]; then cp "$tree" "$t"; name=tree; else cp "$f" "$t"; name=$(basename "$f" .cu.j2); fi
    python3 docs/decode-h200/e4m3_issue/time_cells.py "$out/${name}_$r.json" $cells
  done
done
