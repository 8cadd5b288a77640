# What the run scripts of this folder share; each sources it after `set -uo pipefail` and `: "${OUT:?}"`.
S=specs/h100_wgmma
D=docs/hopper-h200/short_first
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
both() { for s in "$@"; do echo "${S}_$s.yaml ${S}_${s}_bf16.yaml"; done; }   # a member's fp16 and bf16 cells
bf() { for s in "$@"; do echo "${S}_${s}_bf16.yaml"; done; }
fp() { for s in "$@"; do echo "${S}_${s}.yaml"; done; }
# The causal grid of the wide runs at head dim $1: 384-1408 keys, 1-16 x 16 heads.
wide_shapes() { local d=$1 s=""; for k in 384 512 640 768 896 1152 1408; do for b in 1 2 3 4 6 8 12 16; do s="$s,${b}x16x${k}x$d"; done; done; echo ${s#,}; }
# timed SECONDS NAME SHAPES SPEC...: forward_specs_vs_cudnn.py into $OUT/NAME.json, its causal rows shown.
timed() { timeout "$1" python3 docs/hopper-h200/forward_specs_vs_cudnn.py "$OUT/$2.json" "$3" "${@:4}" 2>&1 | grep causal | cut -c1-300; }
# checked NAME MEMBER...: `attngen verify` of the members' fp16 and bf16 cells into $OUT/verify_NAME.txt (.err), then
# the persistent walks' check of their bf16 cells into $OUT/walks_NAME.txt, both summaries shown.
checked() {
    timeout 150 python3 -m attngen verify $(both "${@:2}") > "$OUT/verify_$1.txt" 2> "$OUT/verify_$1.err"
    echo "verify rc=$?"; tail -1 "$OUT/verify_$1.txt"
    timeout 120 python3 $D/walks_check.py $(bf "${@:2}") 2>&1 | tee "$OUT/walks_$1.txt"
}
