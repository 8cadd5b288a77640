"""Varlen functions of forward specs before and after a change, in one process: the committed generated
sources of an earlier checkout compiled and launched through today's runtime (gpu_timing.old_kernel:
the Params ABI must be unchanged), beside today's kernels of the same specs, on one mixed-length
batch (`attngen bench --varlen`'s 16 sequences of 1-4096 tokens, 16 heads), each spec in its own
dtype, every varlen mask it has, with its variant's arguments: softcap 30, ALiBi slopes 0.01-0.3, a
window of 256 keys; an expression spec's float and int parameters take the larger value of their
verify range, and float[heads] ones a tensor of it (other parameter shapes: the row says so).

Usage: python3 docs/before-after-h200/varlen_before_after.py OLD_GENERATED_DIR OUT.json SPEC [SPEC ...]

Each row: before and after µs (`attngen bench`'s queued timing over input sets that defeat L2 reuse,
the two alternating over 5 rounds, the median of the rounds), after / before (above 1: slower now),
and the largest |O before - O after| (0 where the change leaves the arithmetic alone).
"""
import sys
from pathlib import Path

import torch

import attngen
from attngen.eval.bench.varlen import MIXED_LENGTHS
from attngen.runtime.calls.varlen import cu_seqlens
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))   # the helpers the scripts share
from gpu_timing import alternating_sets, old_kernel, write_report

ROUNDS = 5
HEADS = 16
ROTATE = 4


def variant_args(kernel, mask: str) -> dict:
    """The call's variant arguments for this spec and mask."""
    spec = kernel.plan.spec
    args = {}
    scores = tuple(getattr(spec, "scores", None) or ())
    if "softcap" in scores:
        args["softcap"] = 30.0
    if "alibi" in scores:
        args["alibi_slopes"] = torch.linspace(0.01, 0.3, HEADS, device="cuda", dtype=torch.float32)
    if mask == "window":
        args["window"] = (256, 0)
    variant = getattr(spec, "variant", None)
    if variant is not None and getattr(variant, "params", None):
        params = {}
        for name, kind in variant.params.items():
            values = (variant.verify or {}).get(name)
            if not values or str(kind) not in ("float", "int", "float[heads]"):
                raise ValueError(f"parameter {name} ({kind}) has no value this script makes")
            if "[heads]" in str(kind):
                params[name] = torch.full((HEADS,), float(max(values)), device="cuda", dtype=torch.float32)
            else:
                params[name] = int(max(values)) if "int" in str(kind) else float(max(values))
        args["params"] = params
    return args


def main(old_dir, out_path, *spec_paths):
    torch.manual_seed(0)
    lengths = MIXED_LENGTHS
    total, longest = sum(lengths), max(lengths)
    cu = cu_seqlens(torch, lengths, "cuda")
    rows = []
    for path in spec_paths:
        new = attngen.load(path)
        old = old_kernel(new, Path(old_dir))
        d, dtype = new.plan.head_dim, new.dtype
        sets = [tuple(torch.randn(total, HEADS, d, device="cuda", dtype=dtype) for _ in range(3)) for _ in range(ROTATE)]
        for mask in new.varlen_masks:
            causal = mask == "causal"
            align = "bottom_right" if causal else None

            def call(kernel):
                return lambda q, k, v: kernel.varlen(q, k, v, cu, cu, max_seqlen_q=longest, causal=causal,
                                                     alignment=align, **extra)
            try:
                extra = variant_args(new, mask)
                outs = [call(k)(*sets[0]).float() for k in (old, new)]
            except (TypeError, ValueError) as exc:   # a call this script does not know how to make
                print(f"{new.plan.spec.name:40} {mask:7} not timed: {exc}", flush=True)
                rows.append({"spec": new.plan.spec.name, "mask": mask, "error": str(exc)})
                continue
            diff = (outs[0] - outs[1]).abs().max().item()
            med, each = alternating_sets({"before": (call(old), sets), "after": (call(new), sets)}, ROUNDS)
            row = {"spec": new.plan.spec.name, "mask": mask, "dtype": str(dtype).replace("torch.", ""),
                   "before_us": med["before"], "after_us": med["after"], "after_over_before": med["after"] / med["before"],
                   "max_diff": diff, "rounds": each}
            print(f"{row['spec']:40} {mask:7} before {med['before']:8.1f}  after {med['after']:8.1f}  "
                  f"after/before {row['after_over_before']:.3f}  diff {diff:.1e}", flush=True)
            rows.append(row)
    write_report(out_path, rows)


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
