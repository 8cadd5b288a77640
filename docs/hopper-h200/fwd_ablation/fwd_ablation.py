"""Where the Hopper forward's loop spends its time: each ablation takes one piece out of a committed spec's
generated source (the output is then wrong; only the time means anything), and every ablation of a cell is
timed alternating with the unablated kernel in one process, so that the GPU's clocks drift alike for all.

Usage: python3 docs/hopper-h200/fwd_ablation/fwd_ablation.py OUT.json ROUNDS [NAME...]
       python3 docs/hopper-h200/fwd_ablation/fwd_ablation.py --check [NAME...]     (no GPU: each edit applies)

The cells (CELLS): the e4m3 d128 spec of #61's 1000 TFLOP/s at 2x16x8192 and 4x16x2048, its persistent ping-pong
twin (the two consumer warpgroups' softmaxes in turns), and the fp16 specs that serve the short d64 and d128
full-mask calls, all full masks. Every ablated source is compiled first, 16 nvcc at
once (attngen's compile cache: a second run compiles nothing), then each cell is timed with `attngen bench`'s
queued timing (30 calls behind a GPU sleep, input sets that defeat L2 reuse), the kernels alternating over
ROUNDS rounds; a figure is the median of its rounds.

An ablation is a list of (pattern, replacement) regular-expression edits of the generated source (or lists of such
edits, alternatives); each edit, or one of each list, must match in every cell's source (--check proves it without
a GPU). What they take out:
  no_exp2      the exponential of every score (its argument stays: the FFMA, the row sum and P's rounding run)
  no_max       the row maximum: no fmaxf over the scores, no reduction over the quad (each lane keeps the first
               score it saw as its max)
  no_sum       the row sums' adds
  no_rescale   the output's rescale by alpha
  no_softmax   the whole online-softmax step (S is rounded to P as it is; alpha is 1)
  narrow_pv    P.V at n = 8 (narrow_pv below): P is still rounded to its registers and read by the tensor cores
  gemm_s_only  no_softmax and narrow_pv: Q.K^T, S rounded to P's registers, the loads and a sliver of P.V
"""
import concurrent.futures
import re
import sys
from pathlib import Path

ABLATIONS = {
    "full": [],
    "no_exp2": [(r"x = exp2f\((fmaf\(x, scale_log2, [^;]*\))\);", r"x = \1;")],
    "no_max": [[(r"mx = fmaxf\(mx, fmaxf\(score\(c\), score\(c \+ 1\)\)\);", "mx = fmaxf(mx, score(0));"),
                (r"part\[j\] = fmaxf\(part\[j\], fmaxf\(score\(c \+ 2 \* j\), score\(c \+ 2 \* j \+ 1\)\)\);",
                 "part[j] = fmaxf(part[j], score(0));")],   # one chain of pairs, or max_chains: 4
               (r"const float (m_new|m_tile) = group_max<kGroup>\(mx\);", r"const float \1 = mx;")],
    "no_sum": [(r"\n( *)sum \+= x;\n", r"\n\1(void)x;\n")],
    "no_rescale": [(r"o\[4 \* j \+ v\] \*= alpha\[v / 2\];", "(void)alpha;")],
    "no_softmax": [(r"\n__device__ __forceinline__ void softmax_rows\(",
                    "\n// ablation: no online-softmax step\ntemplate <int kGroup, int kCols, typename Score>\n"
                    "__device__ __forceinline__ float ablated_step(float&, float&, float, Score&&) { return 1.f; }\n"
                    "__device__ __forceinline__ void softmax_rows("),
                   (r"alpha\[h\] = online_softmax_step<", "alpha[h] = ablated_step<")],
    "narrow_pv": ["narrow_pv"],
}
ABLATIONS["gemm_s_only"] = ABLATIONS["no_softmax"] + ["narrow_pv"]


def narrow_pv(source: str) -> str:
    """P.V at n = 8: the same A registers (P) and V's descriptor, 8 of V's columns into 4 of O's accumulators, so
    that P's rounding stays and the tensor work of P.V is 1/16 (d128) or 1/8 (d64) of its own."""
    found = re.search(r'"wgmma\.mma_async\.sync\.aligned\.m64n\d+(k\d+\.\S+) "\n\s*"\{[^"]*\}, "\n'
                      r'\s*"\{%\d+, %\d+, %\d+, %\d+\}, %\d+, p((?:, 1)+);', source)
    if found is None:
        sys.exit("narrow_pv: no register-A wgmma in the source; update the ablation")
    shape, scales = found.groups()
    narrow = ("__device__ __forceinline__ void wgmma_rs_m64n8(float* d, const uint32_t (&a)[4], uint64_t desc_b) {\n"
              '    asm volatile("{\\n .reg .pred p;\\n setp.ne.b32 p, 1, 0;\\n"\n'
              f'                 "wgmma.mma_async.sync.aligned.m64n8{shape} {{%0, %1, %2, %3}}, {{%4, %5, %6, %7}}, %8, p{scales};\\n}}\\n"\n'
              '                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])\n'
              '                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));\n}\n\n')
    source, n = re.subn(r"wgmma_rs_m64n\d+\(o, pa\[kc\], v_desc\(sV, kc\)\);", "wgmma_rs_m64n8(o, pa[kc], v_desc(sV, kc));", source)
    if n == 0:
        sys.exit("narrow_pv: no P.V issue in the source; update the ablation")
    return source.replace("// Issue O += P.V", narrow + "// Issue O += P.V", 1)

# (spec, shapes BxHxSxD): full masks only (the cells #61's forward criteria miss).
CELLS = [("specs/h100_wgmma_d128_fp8.yaml", ("2x16x8192x128", "4x16x2048x128")),
         ("specs/h100_wgmma_d128_fp8_n192c2ps3r24x240pppbq2mc4.yaml", ("4x16x2048x128", "2x16x8192x128")),
         ("specs/h100_wgmma_d64_persistent_q2.yaml", ("2x16x1024x64", "4x16x2048x64", "2x16x8192x64")),
         ("specs/h100_wgmma_d128_persistent_q2.yaml", ("4x16x2048x128", "2x16x8192x128"))]


def ablated(source: str, name: str) -> str:
    """`source` with ablation `name`'s edits; every edit (one of each list of alternatives) must match."""
    for edit in ABLATIONS[name]:
        if edit == "narrow_pv":
            source = narrow_pv(source)
            continue
        n = 0
        for pattern, replacement in edit if isinstance(edit, list) else [edit]:   # a list: alternatives, one must match
            source, found = re.subn(pattern, replacement, source)
            n += found
        if n == 0:
            sys.exit(f"{name}: no match for {pattern!r}; update the ablation")
    return source


def generated_source(spec: str) -> str:
    """The committed generated source of a one-part spec (generated/<name>.cu; what render_for gives)."""
    root = Path(__file__).resolve().parents[3]
    return (root / "generated" / (Path(spec).stem + ".cu")).read_text()


def check(names):
    for spec, _ in CELLS:
        base = generated_source(spec)
        for name in names:
            text = ablated(base, name)
            assert name == "full" or text != base
        print(f"{Path(spec).stem}: {' '.join(names)} apply")


def main(out_path, rounds, names):
    import torch
    import attngen
    from attngen.compile import compile_source
    from attngen.eval.bench import Case, input_sets
    from attngen.runtime.calls.forward_fp8 import quantize_fp8
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "measurements"))
    from gpu_timing import alternating_sets, write_report

    from attngen.render import render_for
    rendered = {spec: render_for(spec)[:2] for spec, _ in CELLS}   # (plan, source): the committed source
    sources = {(spec, name): ablated(rendered[spec][1], name) for spec, _ in CELLS for name in names}
    arch = {spec: plan.compile_arch("sm_90") for spec, (plan, _) in rendered.items()}
    with concurrent.futures.ThreadPoolExecutor(16) as pool:   # nvcc in parallel; the loads below hit the cache
        list(pool.map(lambda key: compile_source(sources[key], arch[key[0]], on_compile=lambda _a: None), sources))
    gen, rows = torch.Generator(device="cuda"), []
    gen.manual_seed(0)
    for spec, shapes in CELLS:
        base, plan = attngen.load(spec), rendered[spec][0]
        kernels = {name: type(base).from_source(plan, sources[spec, name], label=name) for name in names}
        for shape in shapes:
            b, h, s, d = map(int, shape.split("x"))
            if plan.spec.dtype == "e4m3":
                sets = []
                for _ in range(3):
                    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16, generator=gen) for _ in range(3))
                    q8, k8, vt, qd, kd, vd = quantize_fp8(q, k, v)
                    sets.append((q8, k8, vt, qd, kd, vd))
                calls = {name: ((lambda q8, k8, vt, qd, kd, vd, kern=kern: kern(q8, k8, vt, q_descale=qd, k_descale=kd,
                                                                                  v_descale=vd, causal=False)), sets)
                         for name, kern in kernels.items()}
            else:
                sets = input_sets(torch, Case(b, h, s, d, plan.spec.dtype, False), torch.device("cuda"), gen)
                calls = {name: ((lambda q, k_, v, kern=kern: kern(q, k_, v, causal=False)), sets)
                         for name, kern in kernels.items()}
            med, each = alternating_sets(calls, rounds)
            flops = 4 * b * h * s * s * d
            full = med.get("full")
            rows.append({"spec": plan.spec.name, "shape": shape, "causal": False, "us": med, "rounds": each})
            print(f"{plan.spec.name:32} {shape:14} " + "  ".join(
                f"{n} {t:.1f}" + (f" ({t / full:.3f})" if full else "") for n, t in med.items())
                + (f"  full {flops / full / 1e6:.0f} TF/s" if full else ""), flush=True)
    write_report(out_path, rows)


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--check"]:
        check(args[1:] or list(ABLATIONS))
    elif len(args) >= 2:
        main(args[0], int(args[1]), args[2:] or list(ABLATIONS))
    else:
        sys.exit(__doc__)
