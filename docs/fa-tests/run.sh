#!/usr/bin/env bash
# Run FlashAttention 2's tests/test_flash_attn.py against attngen through the flash_attn stand-in
# (docs/fa-tests/README.md).
#
#   bash docs/fa-tests/run.sh prepare                     # here: copy FA's test file into out/fa/
#   bash docs/fa-tests/run.sh [K_EXPR] [PYTEST_ARGS...]   # run (on the GPU machine); K_EXPR is pytest -k
#
# The test file is copied at run time from the local mirror of Dao-AILab/flash-attention when there is
# one, else read from out/fa/test_flash_attn.py (put there by `prepare`; out/ is git-ignored and
# travels with the tree). It is never part of the repository.
#
# Environment: FA_DIR (out/fa), FA_MIRROR (the mirror's git dir), FA_REPORT (the JSON report; default
# $OUT/fa_report.json, else $FA_DIR/fa_report.json), FA_TEST_TIMEOUT (seconds per test where
# pytest-timeout is installed; 300), FA_TIME_BUDGET (seconds for the whole run: then pytest is
# interrupted, and the report and table cover what ran), FA_TB (pytest --tb style; line), FA_SAMPLE
# (keep about 1 test in N), FA_FAKE_CAPABILITY (e.g. 9.0: collect without CUDA; --collect-only only).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
FA_DIR="${FA_DIR:-$REPO/out/fa}"
MIRROR="${FA_MIRROR:-/work/.mirror/Dao-AILab+flash-attention/repo}"
TEST="$FA_DIR/test_flash_attn.py"
PY="${PYTHON:-python3}"

copy_from_mirror() {
    # FA's test file from the mirror into $FA_DIR; false where there is no mirror.
    if git -C "$MIRROR" cat-file -e HEAD:tests/test_flash_attn.py 2>/dev/null; then
        mkdir -p "$FA_DIR"
        git -C "$MIRROR" show HEAD:tests/test_flash_attn.py > "$TEST.tmp"
        mv "$TEST.tmp" "$TEST"
        echo "Dao-AILab/flash-attention $(git -C "$MIRROR" rev-parse HEAD) tests/test_flash_attn.py" > "$FA_DIR/SOURCE"
        return 0
    fi
    return 1
}

if [[ "${1:-}" == "prepare" ]]; then
    if ! copy_from_mirror; then
        echo "run.sh prepare: no mirror of Dao-AILab/flash-attention at $MIRROR (set FA_MIRROR)" >&2
        exit 2
    fi
    echo "copied: $TEST ($(cat "$FA_DIR/SOURCE"))"
    # The GPU machine may lack einops: a wheel of it (pure Python, importable as a zip) travels in out/.
    # Without one, run.sh falls back to docs/fa-tests/einops_lite.
    if ! ls "$FA_DIR"/wheels/einops-*.whl >/dev/null 2>&1; then
        mkdir -p "$FA_DIR/wheels"
        "$PY" -m pip download --quiet --no-deps --only-binary=:all: -d "$FA_DIR/wheels" einops >/dev/null 2>&1 \
            || echo "run.sh prepare: no einops wheel downloaded; einops_lite will stand in where einops is missing"
    fi
    ls "$FA_DIR"/wheels/einops-*.whl 2>/dev/null || true
    exit 0
fi

copy_from_mirror || true
if [[ ! -f "$TEST" ]]; then
    echo "run.sh: no $TEST and no mirror at $MIRROR: run 'bash docs/fa-tests/run.sh prepare' where the mirror is," \
         "then carry out/ to this machine" >&2
    exit 2
fi

# flash_attn resolves to the stand-in (first on the path, before any installed flash_attn); the plugin
# lives beside this script; attngen is the repository's.
export PYTHONPATH="$HERE/shim:$HERE${PYTHONPATH:+:$PYTHONPATH}:$REPO"
if ! "$PY" -c "import einops" >/dev/null 2>&1; then
    wheel="$(ls "$FA_DIR"/wheels/einops-*.whl 2>/dev/null | head -n 1 || true)"
    if [[ -n "$wheel" ]] && PYTHONPATH="$PYTHONPATH:$wheel" "$PY" -c "import einops" >/dev/null 2>&1; then
        export PYTHONPATH="$PYTHONPATH:$wheel"
        echo "run.sh: einops from $wheel"
    else
        export PYTHONPATH="$PYTHONPATH:$HERE/einops_lite"
        echo "run.sh: einops is missing; using docs/fa-tests/einops_lite"
    fi
fi
"$PY" - "$HERE/shim" <<'EOF'
import os, sys
import flash_attn
where = os.path.dirname(os.path.abspath(flash_attn.__file__))
if not where.startswith(os.path.abspath(sys.argv[1])):
    sys.exit(f"run.sh: flash_attn resolves to {where}, not the stand-in")
EOF

if [[ -z "${FA_REPORT:-}" ]]; then
    if [[ -n "${OUT:-}" ]]; then FA_REPORT="$OUT/fa_report.json"; else FA_REPORT="$FA_DIR/fa_report.json"; fi
fi
export FA_REPORT
rm -f "$FA_REPORT"

args=()
if [[ $# -gt 0 && "$1" != -* ]]; then
    [[ -n "$1" ]] && args+=(-k "$1")
    shift
fi
if "$PY" -c "import pytest_timeout" >/dev/null 2>&1; then
    args+=(--timeout "${FA_TEST_TIMEOUT:-300}")
fi
limit=()
if [[ -n "${FA_TIME_BUDGET:-}" ]]; then
    limit=(timeout -s INT -k 60 "$FA_TIME_BUDGET")
fi

set +e
FA_PRINT_SUMMARY=0 ${limit[@]+"${limit[@]}"} "$PY" -m pytest "$TEST" -q -p attngen_fa_plugin -p no:cacheprovider \
    -c "$HERE/pytest.ini" --rootdir "$FA_DIR" --tb="${FA_TB:-line}" ${args[@]+"${args[@]}"} "$@"
rc=$?
set -e

echo
if [[ -f "$FA_REPORT" ]]; then
    "$PY" "$HERE/attngen_fa_plugin.py" "$FA_REPORT"
    echo
    echo "report: $FA_REPORT"
else
    echo "run.sh: no report at $FA_REPORT (pytest exited $rc before running a test)"
fi
exit $rc
