"""Varlen prefill timing beside torch's varlen flash path
(torch.ops.aten._flash_attention_forward with cumulative sequence offsets), on one batch of mixed
lengths, after checking the spec's output on the same inputs with the verifier's error rule.
FLOPs count only the (query, key) pairs each sequence's mask leaves visible."""
from __future__ import annotations

from dataclasses import dataclass

from .report import BenchRun
from .timing import time_calls, time_eager
from ..verify.cases import Variant, error_bound
from ..verify.varlen import reference

# 16 sequences from 1 to 4096 tokens (24.6k in all), as a prefill batch of mixed prompts arrives.
MIXED_LENGTHS = (1, 17, 64, 100, 256, 333, 512, 700, 1000, 1024, 1500, 2048, 2500, 3000, 3500, 4096)
L2_MARGIN = 2.0


@dataclass(frozen=True)
class VarlenBatch:
    heads: int
    kv_heads: int
    lengths: tuple[int, ...]

    @property
    def label(self) -> str:
        heads = f"{self.heads}" if self.heads == self.kv_heads else f"{self.heads}/{self.kv_heads}"
        return f"{len(self.lengths)} seqs ({sum(self.lengths)} tokens, {min(self.lengths)}-{max(self.lengths)}) H{heads}"


def parse_lengths(text: str) -> tuple[int, ...]:
    """'1,17,4096' -> (1, 17, 4096); every length >= 1."""
    try:
        lengths = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a comma-separated list of sequence lengths (e.g. 1,100,4096)") from None
    if not lengths or min(lengths) < 1:
        raise ValueError(f"{text!r}: give one length >= 1 per sequence")
    return lengths


def parse_heads(text: str) -> tuple[int, int]:
    """'16' -> (16, 16); '32/8' -> (32, 8)."""
    try:
        hq, _, hk = text.partition("/")
        heads = (int(hq), int(hk or hq))
    except ValueError:
        raise ValueError(f"{text!r} is not H or Hq/Hkv (e.g. 16 or 32/8)") from None
    if min(heads) < 1 or heads[0] % heads[1]:
        raise ValueError(f"{text!r}: heads must be >= 1 and Hq a multiple of Hkv")
    return heads


def visible_pairs(lengths, causal: bool) -> int:
    """(query, key) pairs the mask leaves visible, summed over sequences of as many queries as keys."""
    return sum(n * (n + 1) // 2 if causal else n * n for n in lengths)


def flash_varlen(torch, q, k, v, cu, max_len: int, causal: bool, scale: float):
    """torch's varlen FlashAttention-2 forward (bottom-right causal, the same as top-left here)."""
    return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, max_len, max_len, 0.0, causal, False,
                                                   scale=scale)[0]


def bench_batch(torch, kernel, batch: VarlenBatch, causal: bool, *, reps: int = 30) -> dict:
    """Times (us) of the spec's varlen call and torch's varlen flash on one varlen batch, inputs
    rotated past L2; the spec's output is checked against the fp32 reference first."""
    from ...runtime.calls.varlen import cu_seqlens
    d, dv, dtype = kernel.plan.head_dim, kernel.plan.v_dim, kernel.dtype     # dv: V's and O's head dim
    total = sum(batch.lengths)
    scale = d ** -0.5
    nbytes = 2 * total * (d + dv) * (batch.heads + batch.kv_heads)   # q, o and k, v
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rotate = max(1, min(8, int(L2_MARGIN * l2 // nbytes) + 1))
    cu = cu_seqlens(torch, batch.lengths, "cuda")
    sets = [(torch.randn(total, batch.heads, d, device="cuda", dtype=dtype),
             torch.randn(total, batch.kv_heads, d, device="cuda", dtype=dtype),
             torch.randn(total, batch.kv_heads, dv, device="cuda", dtype=dtype)) for _ in range(rotate)]
    outs = [s[0].new_empty(total, batch.heads, dv) for s in sets]
    longest = max(batch.lengths)
    align = "bottom_right" if causal else None
    row = {"batch": batch.label, "causal": causal, "rotate": rotate, "tokens": total,
           "flops": 2 * batch.heads * (d + dv) * visible_pairs(batch.lengths, causal)}

    q, k, v = sets[0]
    kernel.varlen(q, k, v, cu, cu, causal=causal, alignment=align, scale=scale, out=outs[0])
    variant = Variant("causal" if causal else "none", align)
    ref, _lse, low = reference(torch, q, k, v, batch.lengths, batch.lengths, variant, scale)
    err, bound = (outs[0].float() - ref).abs().max().item(), error_bound((low - ref).abs().max().item())
    row.update(max_err=err, bound=bound)
    del ref, low
    if not err <= bound:
        row["status"] = f"wrong: max error {err:.3g} exceeds {bound:.3g}"
        return row

    def ours(i):
        kernel.varlen(*sets[i], cu, cu, max_seqlen_q=longest, causal=causal, alignment=align, scale=scale,
                      out=outs[i], validate=False)
    index = [(i,) for i in range(rotate)]
    row["attngen_us"] = time_calls(torch, ours, index, reps=reps)[0]
    # eager: the call as a user makes it (a fresh output, max_seqlen_q given, nothing read back)
    row["attngen_eager_us"] = time_eager(torch, lambda i: kernel.varlen(
        *sets[i], cu, cu, max_seqlen_q=longest, causal=causal, alignment=align, scale=scale), index, reps=reps)
    try:
        def theirs(i):
            return flash_varlen(torch, *sets[i], cu, longest, causal, scale)
        row["flash_us"] = time_calls(torch, theirs, index, reps=reps)[0]
        row["flash_eager_us"] = time_eager(torch, theirs, index, reps=reps)
    except RuntimeError as exc:
        row["flash_us"] = None
        row["flash_error"] = str(exc).splitlines()[0][:200]
    row["status"] = "ok"
    row["tflops"] = row["flops"] / (row["attngen_us"] * 1e-6) / 1e12
    row["vs_flash"] = row["flash_us"] / row["attngen_us"] if row.get("flash_us") else None
    return row


def run_varlen_bench(spec_paths, *, lengths=MIXED_LENGTHS, heads=(16, 16), dtypes=("fp16", "bf16"),
                     causals=(False, True), reps: int = 30, on_step=None, on_compile=None) -> dict:
    """Every varlen spec of a listed dtype on the varlen batch, both masks, beside torch's varlen flash."""
    from ...runtime import gpu_modules, load
    torch = gpu_modules()[0]
    batch = VarlenBatch(heads[0], heads[1], tuple(lengths))
    rows = []
    for path in spec_paths:
        kernel = load(path, on_compile=on_compile)
        if kernel.plan.spec.dtype not in dtypes:
            continue
        if not kernel.varlen_masks:
            raise ValueError(f"{path}: --varlen needs a spec with varlen: true")
        for causal in causals:
            if ("causal" if causal else "none") not in kernel.varlen_masks:
                continue
            r = bench_batch(torch, kernel, batch, causal, reps=reps)
            r.update(spec=kernel.name, dtype=kernel.plan.spec.dtype, head_dim=kernel.plan.head_dim)
            rows.append(r)
            torch.cuda.empty_cache()
            if on_step:
                on_step(r)
    return {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "lengths": list(lengths),
            "heads": list(heads), "rows": rows}


def format_varlen(report: dict) -> str:
    lines = [f"GPU: {report['gpu']}; torch {report['torch']}; lengths {report['lengths']}; heads "
             f"{report['heads'][0]}/{report['heads'][1]}; flash = torch.ops.aten._flash_attention_forward (varlen)",
             f"{'spec':<38} {'d':>3} {'causal':>6} {'us':>9} {'eager us':>9} {'TFLOP/s':>8} {'flash us':>9} "
             f"{'eager us':>9} {'vs flash':>8}",
             "(us: GPU time, calls queued behind a GPU sleep; eager: back-to-back calls, host included)"]
    for r in report["rows"]:
        if r["status"] != "ok":
            lines.append(f"{r['spec']:<38} {r['head_dim']:>3} {str(r['causal']):>6} {r['status']}")
            continue
        def num(x):
            return f"{x:>9.1f}" if x else f"{'-':>9}"
        vs = f"{r['vs_flash']:>8.2f}" if r.get("vs_flash") else f"{'-':>8}"
        lines.append(f"{r['spec']:<38} {r['head_dim']:>3} {str(r['causal']):>6} {r['attngen_us']:>9.1f} "
                     f"{num(r.get('attngen_eager_us'))} {r['tflops']:>8.1f} {num(r.get('flash_us'))} "
                     f"{num(r.get('flash_eager_us'))} {vs}")
    return "\n".join(lines)


def bench_specs(paths, plans, opts, progress, on_compile):
    """`attngen bench --varlen` on forward specs: their varlen call on one batch of mixed lengths
    (opts.lengths, default MIXED_LENGTHS) beside torch's varlen flash path."""
    from ...runtime import gpu_modules
    gpu_modules()  # no GPU, torch or CUDA driver: say so (exit 4) before any progress is drawn
    with progress("bench varlen", len(paths) * len(opts.causals)) as bar:
        def step(r):
            bar.label = f"{r['spec']} {'causal' if r['causal'] else 'none'}"
            bar.update(1)
        report = run_varlen_bench(paths, lengths=opts.lengths or MIXED_LENGTHS, heads=opts.heads, dtypes=opts.dtypes,
                                  causals=opts.causals, reps=opts.reps, on_step=step, on_compile=on_compile)
    return BenchRun(format_varlen(report), report)
