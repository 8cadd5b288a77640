"""Decode timing beside torch SDPA's flash and cuDNN backends, with the K/V caches rotated through
enough copies that they do not sit in L2, and the device-to-device copy bandwidth of the same run
as the ceiling. Bytes counted: K and V read once per KV head (2 x B x Hkv x Sk x D x element size)."""
from __future__ import annotations

from dataclasses import dataclass

from ..verify.decode import paged_cache

PAGE_SIZE = 16   # keys per page of `attngen bench --paged` (vLLM's default block size)
from .report import BenchRun
from .timing import time_back_to_back, time_calls, time_eager

L2_MARGIN = 2.0   # rotate so that the buffers in flight exceed this many L2 sizes


@dataclass(frozen=True)
class DecodeCell:
    batch: int
    heads: int
    kv_heads: int
    seqlen_k: int
    seqlen_q: int = 1

    @property
    def label(self) -> str:
        return f"B{self.batch} {self.heads}/{self.kv_heads} Sk{self.seqlen_k} Sq{self.seqlen_q}"


def default_cells() -> tuple[DecodeCell, ...]:
    """The issue's grid: B in {1, 8, 64}, Hq/Hkv in {32/8, 32/32, 64/8}, Sk in {2k, 8k, 32k; 128k at
    B=1}, Sq in {1, 4}."""
    out = []
    for b in (1, 8, 64):
        for hq, hk in ((32, 8), (32, 32), (64, 8)):
            for sk in (2048, 8192, 32768) + ((131072,) if b == 1 else ()):
                for sq in (1, 4):
                    out.append(DecodeCell(b, hq, hk, sk, sq))
    return tuple(out)


def latent_cells() -> tuple[DecodeCell, ...]:
    """A latent-cache (MLA) spec's grid: one KV head for 16 query heads (DeepSeek V2/V3 over 8 GPUs) and
    128 (one GPU), B in {1, 8, 32, 64, 128}, Sk in {4k, 8k, 32k}."""
    return tuple(DecodeCell(b, h, 1, sk) for h in (16, 128) for b in (1, 8, 32, 64, 128) for sk in (4096, 8192, 32768)
                 if b * sk <= 64 * 32768)


def cells_for(plan, cells=None) -> tuple[DecodeCell, ...]:
    """The cells a spec is timed on: the given ones, else its grid."""
    return tuple(cells) if cells else latent_cells() if plan.v_in_k else default_cells()


# The peers of a latent-cache spec: torch's eager matmul attention (its SDPA backends take no 576-column
# queries against 512-column values).
LATENT_PEERS = ("matmul",)


def matmul_attention(torch, q, k, v, scale: float):
    """Eager torch decode as a model writes it without a fused kernel: each KV head's query heads folded into
    the rows of one batched matmul (no copy of K or V per query head), scores in the inputs' dtype (fp32
    accumulation), an fp32 softmax, P.V. q (B, H, Sq, D), k and v (B, Hkv, Sk, D / Dv)."""
    b, h, sq, _ = q.shape
    kv_heads = k.shape[1]
    rows = q.reshape(b, kv_heads, h // kv_heads * sq, q.shape[-1])
    s = torch.matmul(rows, k.transpose(-1, -2)).float() * scale
    o = torch.matmul(torch.softmax(s, dim=-1).to(q.dtype), v)
    return o.reshape(b, h, sq, v.shape[-1])


def median_time_us(torch, fn, reps: int, rotate: int) -> float:
    """Median of `reps` CUDA-event timings of fn(i), i cycling over `rotate` input sets; the calls
    are queued behind a GPU sleep (attngen bench's method), so host time between them is hidden."""
    return time_calls(torch, fn, [(i,) for i in range(rotate)], reps=reps)[0]


def back_to_back_us(torch, fn, reps: int, rotate: int) -> float:
    """GPU time per call of fn(i) with the calls back to back between two CUDA events (a decode loop's calls;
    the split kernel, launched as a programmatic dependent, starts before the call ahead has ended)."""
    return time_back_to_back(torch, fn, [(i,) for i in range(rotate)], reps=reps)


def eager_time_us(torch, fn, reps: int, rotate: int) -> float:
    """fn(i) called back to back as a user calls it, host included (attngen bench's eager column)."""
    return time_eager(torch, fn, [(i,) for i in range(rotate)], reps=reps)


def copy_bandwidth(torch, nbytes: int = 1 << 30, reps: int = 20) -> float:
    """Device-to-device copy bandwidth (bytes read + written per second) of this GPU now."""
    a = torch.empty(nbytes // 2, dtype=torch.float16, device="cuda")
    b = torch.empty_like(a)
    us = median_time_us(torch, lambda i: b.copy_(a), reps, 1)
    return 2 * a.numel() * 2 / (us * 1e-6)


def bench_cell(torch, kernel, cell: DecodeCell, *, backends=("flash", "cudnn"), reps: int = 30,
               paged: bool = False) -> dict:
    """Times (us) of the kernel and each SDPA backend on one cell, fresh caches rotated past L2.
    paged: the kernel reads the same keys from pages of PAGE_SIZE keys in a shuffled pool
    (through a block table); the SDPA backends read contiguous caches."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    d, dv, dtype, v_in_k = kernel.plan.head_dim, kernel.plan.v_dim, kernel.dtype, kernel.plan.v_in_k
    # one latent cache is read once (V is its rows' first dv columns); else K and V
    kv_bytes = (1 if v_in_k else 2) * cell.batch * cell.kv_heads * cell.seqlen_k * d * 2
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rotate = max(1, min(16, int(L2_MARGIN * l2 // kv_bytes) + 1))
    qs = [torch.randn(cell.batch, cell.heads, cell.seqlen_q, d, device="cuda", dtype=dtype) for _ in range(rotate)]
    ks = [torch.randn(cell.batch, cell.kv_heads, cell.seqlen_k, d, device="cuda", dtype=dtype) for _ in range(rotate)]
    vs = [k[..., :dv] if v_in_k else torch.randn_like(k) for k in ks]
    causal = cell.seqlen_q > 1
    out = {"cell": cell.label, "kv_bytes": kv_bytes, "rotate": rotate, "paged": paged}
    if paged:
        lens = torch.full((cell.batch,), cell.seqlen_k, dtype=torch.int32, device="cuda")
        pools = [paged_cache(torch, k, v, None, PAGE_SIZE, "bhsd", spare=0)
                 for k, v in zip(ks, vs)]
        if v_in_k:
            pools = [(kp, kp[..., :dv], table) for kp, _, table in pools]
        ks = vs = None
        torch.cuda.empty_cache()
        def paged_call(i):
            kernel(qs[i], pools[i][0], pools[i][1], cache_seqlens=lens, block_table=pools[i][2], causal=causal)
        out["attngen_us"] = median_time_us(torch, paged_call, reps, rotate)
        out["attngen_b2b_us"] = back_to_back_us(torch, paged_call, reps, rotate)
        out["attngen_eager_us"] = eager_time_us(torch, paged_call, reps, rotate)
        out["splits"] = getattr(kernel, "last_splits", None)
        return out

    def call(i):
        kernel(qs[i], ks[i], vs[i], causal=causal)
    out["attngen_us"] = median_time_us(torch, call, reps, rotate)
    out["attngen_b2b_us"] = back_to_back_us(torch, call, reps, rotate)
    out["attngen_eager_us"] = eager_time_us(torch, call, reps, rotate)
    out["splits"] = getattr(kernel, "last_splits", None)
    names = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    for name in backends:
        # SDPA's causal is top-left; for Sq new tokens at the end of Sk keys the decode mask is
        # bottom-right, which SDPA expresses as an explicit mask only, so causal cells time SDPA
        # without a mask (it does slightly more work: Sq x Sq scores it should hide).
        def call(i, backend=names.get(name)):
            if backend is None:   # "matmul": eager matmul attention (a single KV head broadcasts)
                return matmul_attention(torch, qs[i], ks[i], vs[i], d ** -0.5)
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(qs[i], ks[i], vs[i], enable_gqa=cell.heads != cell.kv_heads)
        try:
            out[f"{name}_us"] = median_time_us(torch, call, reps, rotate)
            out[f"{name}_b2b_us"] = back_to_back_us(torch, call, reps, rotate)
            out[f"{name}_eager_us"] = eager_time_us(torch, call, reps, rotate)
        except RuntimeError as exc:
            out[f"{name}_us"] = None
            out[f"{name}_error"] = str(exc).splitlines()[0][:200]
    return out


# The largest cell sizes bench takes: the grid's batch limit, and caches that a GPU can hold.
CELL_MAX = {"batch": 65535, "heads": 1024, "seqlen_k": 1 << 22, "seqlen_q": 256}


def parse_cell(text: str) -> DecodeCell:
    """'BxHq/HkvxSkxSq', e.g. 8x32/8x8192x1."""
    try:
        b, heads, sk, sq = text.strip().split("x")
        hq, hk = heads.split("/")
        cell = DecodeCell(int(b), int(hq), int(hk), int(sk), int(sq))
    except ValueError:
        raise ValueError(f"{text!r} is not a decode cell BxHq/HkvxSkxSq (e.g. 8x32/8x8192x1)") from None
    if min(cell.batch, cell.heads, cell.kv_heads, cell.seqlen_k, cell.seqlen_q) < 1 or cell.heads % cell.kv_heads:
        raise ValueError(f"{text!r}: every size must be >= 1 and Hq a multiple of Hkv")
    for what, value, most in (("B", cell.batch, CELL_MAX["batch"]), ("Hq", cell.heads, CELL_MAX["heads"]),
                              ("Sk", cell.seqlen_k, CELL_MAX["seqlen_k"]), ("Sq", cell.seqlen_q, CELL_MAX["seqlen_q"])):
        if value > most:
            raise ValueError(f"{text!r}: {what} must be at most {most} (got {value})")
    return cell


def run_decode_bench(spec_paths, *, cells=None, dtypes=("fp16", "bf16"), backends=("flash", "cudnn"),
                     reps: int = 30, paged: bool = False, on_step=None, on_compile=None) -> dict:
    """Every decode spec of a listed dtype on every cell, beside the SDPA backends, with the copy
    bandwidth of the same run; paged times the spec's paged path (pages of PAGE_SIZE keys)."""
    from ...runtime import gpu_modules, load
    torch = gpu_modules()[0]
    copy = copy_bandwidth(torch)
    rows = []
    for path in spec_paths:
        kernel = load(path, on_compile=on_compile)
        if kernel.plan.spec.dtype not in dtypes:
            continue
        if paged and not kernel.plan.paged:
            raise ValueError(f"{path}: --paged needs a spec with paged: true")
        peers = LATENT_PEERS if kernel.plan.v_in_k else backends
        for cell in cells_for(kernel.plan, cells):
            r = bench_cell(torch, kernel, cell, backends=peers, reps=reps, paged=paged)
            r["backends"] = peers
            r.update(spec=kernel.name, dtype=kernel.plan.spec.dtype, head_dim=kernel.plan.head_dim)
            r["gbps"] = r["kv_bytes"] / (r["attngen_us"] * 1e-6) / 1e9
            r["pct_of_copy"] = 100.0 * r["gbps"] * 1e9 / copy
            others = [r[f"{b}_us"] for b in peers if r.get(f"{b}_us")]
            r["vs_fastest"] = min(others) / r["attngen_us"] if others else None
            rows.append(r)
            torch.cuda.empty_cache()
            if on_step:
                on_step(r)
    return {"gpu": torch.cuda.get_device_name(0), "copy_gbps": copy / 1e9, "paged": paged, "rows": rows}


def format_decode(report: dict, backends) -> str:
    lines = [f"GPU: {report['gpu']}; device-to-device copy {report['copy_gbps']:.0f} GB/s (read + write); "
             f"bytes = K + V read once per KV head" + ("; paged caches" if report["paged"] else ""),
             f"{'cell':<26} {'spec':<26} {'us':>9} {'b2b us':>9} {'eager us':>9} {'splits':>6} {'GB/s':>6} {'%copy':>6} "
             + " ".join(f"{b + ' us/b2b/eager':>22}" for b in backends) + f" {'vs fastest':>10}",
             "(us: GPU time per call, calls queued behind a GPU sleep, an event on each side; b2b: GPU time per call "
             "with the calls back to back, as a decode loop runs them; eager: back-to-back calls, host included; "
             "GB/s, %copy and vs fastest come from us)"]

    def num(x):
        return f"{x:.1f}" if x else "-"
    for r in report["rows"]:
        def three(b):
            return "/".join(num(r.get(b + key)) for key in ("_us", "_b2b_us", "_eager_us"))
        theirs = " ".join(f"{three(b):>22}" for b in backends)
        theirs += "".join(f" {b} {three(b)}" for b in r.get("backends", ()) if b not in backends)
        vs = f"{r['vs_fastest']:>10.2f}" if r.get("vs_fastest") else f"{'-':>10}"
        lines.append(f"{r['cell']:<26} {r['spec']:<26} {r['attngen_us']:>9.1f} {num(r.get('attngen_b2b_us')):>9} "
                     f"{num(r.get('attngen_eager_us')):>9} "
                     f"{r['splits'] or 1:>6} {r['gbps']:>6.0f} {r['pct_of_copy']:>5.0f}% {theirs} {vs}")
    return "\n".join(lines)


def check_options(paths, plans, opts) -> list[str]:
    """Problems of `attngen bench`'s options with these decode specs (no GPU needed)."""
    # A call of a spec with score modifiers takes their arguments, one of an e4m3 cache takes e4m3 caches with
    # their scales, one that appends takes the new tokens: the bench's cells carry none of them.
    for p in plans:
        for takes, what, script in (
                (p.score_variants, "its score modifiers' arguments (softcap=, alibi_slopes=, sinks=)",
                 "docs/variants-h200/variant_bench.py OUT.json decode"),
                (p.kv_dtype, "e4m3 caches with their scales", "docs/measurements/fp8_kv_decode.py --json OUT.json"),
                (p.append, "the new tokens it appends (k=, v=) with cache_seqlens",
                 "docs/decode-h200/append_host.py OUT.json")):
            if takes:
                return [f"{p.spec.name} takes {what}, which the bench's decode cells do not carry: time it with "
                        f"`python3 {script}` (in the repository)"]
    if opts.paged:
        contiguous = [p.spec.name for p in plans if not p.paged]
        if contiguous:
            return [f"--paged reads the cache through a page table; {', '.join(contiguous)} "
                    f"{'reads' if len(contiguous) == 1 else 'read'} contiguous caches only (give decode specs with "
                    f"paged: true)"]
    return []


def bench_specs(paths, plans, opts, progress, on_compile):
    """`attngen bench` on decode specs: every cell (opts.cells) beside SDPA's flash and cuDNN
    backends; None under --varlen (decode specs have no varlen call)."""
    from ...runtime import gpu_modules
    if opts.varlen:
        return None
    gpu_modules()  # no GPU, torch or CUDA driver: say so (exit 4) before any progress is drawn
    theirs = tuple(b for b in opts.backends if b in ("flash", "cudnn"))
    with progress("bench decode", sum(len(cells_for(plan, opts.cells)) for plan in plans)) as bar:
        def step(r):
            bar.label = f"{r['spec']} {r['cell']}"
            bar.update(1)
        report = run_decode_bench(paths, cells=opts.cells, dtypes=opts.dtypes, backends=theirs, reps=opts.reps,
                                  paged=opts.paged, on_step=step, on_compile=on_compile)
    return BenchRun(format_decode(report, theirs), report)
