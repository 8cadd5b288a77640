"""`attngen bench --serving`: one serving step as an inference engine runs it. Sequences whose keys sit
in a paged pool, a few of them prefilling a chunk of their prompt and the rest decoding one token, all
in one call of attngen.attention_varlen(..., block_table=, seqused_k=) (FlashAttention's paged varlen
form, the one vLLM runs mixed batches through), beside the best torch path for the same step: SDPA per
sequence on each sequence's keys laid out contiguously (torch has no paged attention; the gather into
contiguous caches is done beforehand and not timed, which favours torch).

Checked first: attngen's output against an fp32 reference per sequence (bottom-right causal: a chunk's
queries are the last of their sequence), under the error rule (twice the error of torch's own
low-precision SDPA on the same step, plus the verifier's floor). Then timed three ways, each side alike:
- GPU: CUDA events around calls queued behind a GPU sleep (attngen bench's timing, median of `reps`);
- eager: calls back to back, host included (median over rounds of wall clock / calls);
- graph: the step captured in a CUDA graph and replayed (queued timing of the replay).
"""
from __future__ import annotations

from typing import NamedTuple

from .timing import time_calls, time_eager
from ..verify.cases import error_bound

TIMINGS = ("gpu_us", "eager_us", "graph_us")


class ServingStep(NamedTuple):
    sequences: int = 64
    prefill: int = 8               # sequences prefilling a chunk; the rest decode one token
    chunk: int = 512               # new tokens of a prefilling sequence
    context: tuple = (512, 8192)   # each sequence's keys after the step: drawn from [lo, hi]
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    dtype: str = "bf16"
    seed: int = 0

    @property
    def label(self) -> str:
        return (f"{self.sequences} sequences ({self.prefill} x {self.chunk}-token chunks, "
                f"{self.sequences - self.prefill} decoding), {self.heads}/{self.kv_heads} heads, d{self.head_dim}, "
                f"pages of {self.page_size}, {self.dtype}")


def parse_context(text: str) -> tuple[int, int]:
    """--context LO:HI: each sequence's keys after the step, drawn from LO to HI."""
    parts = text.strip().split(":")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"{text!r}: give LO:HI, two key counts (e.g. 512:8192)")
    lo, hi = (int(p) for p in parts)
    if not 1 <= lo <= hi:
        raise ValueError(f"{text!r}: need 1 <= LO <= HI")
    return lo, hi


def step_problems(step: ServingStep, max_page_size: int, max_seqlen: int) -> list[str]:
    """What is wrong with a step's options, each with its fix (empty: none)."""
    out = []
    if not 1 <= step.sequences <= 4096:
        out.append(f"--sequences {step.sequences}: give 1 to 4096")
    if not 0 <= step.prefill <= step.sequences:
        out.append(f"--prefill {step.prefill}: give 0 to --sequences ({step.sequences})")
    if step.chunk < 1:
        out.append(f"--chunk {step.chunk}: give at least 1")
    if step.context[1] > max_seqlen:
        out.append(f"--context {step.context[0]}:{step.context[1]}: at most {max_seqlen} keys a sequence")
    ps = step.page_size
    if ps < 1 or ps > max_page_size or ps & (ps - 1):
        out.append(f"--page-size {ps}: give a power of two from 1 to {max_page_size}")
    if step.heads % step.kv_heads:
        out.append(f"--heads {step.heads}/{step.kv_heads}: the query heads must be a multiple of the KV heads")
    return out


def step_inputs(torch, step: ServingStep, dtype, gen) -> dict:
    """The step's tensors: per-sequence contexts (keys in the cache, the new tokens included), the new
    query tokens packed back to back, the K/V pool with its block table, and the contiguous caches."""
    from ..verify.decode import paged_cache
    lo, hi = step.context
    contexts = torch.randint(lo, hi + 1, (step.sequences,), generator=gen, device="cuda").tolist()
    new = [step.chunk if s < step.prefill else 1 for s in range(step.sequences)]
    contexts = [max(c, n) for c, n in zip(contexts, new)]
    d, cap = step.head_dim, max(contexts)
    k = torch.randn(step.sequences, cap, step.kv_heads, d, generator=gen, device="cuda").to(dtype)
    v = torch.randn(step.sequences, cap, step.kv_heads, d, generator=gen, device="cuda").to(dtype)
    kp, vp, table = paged_cache(torch, k, v, contexts, step.page_size, "bshd", generator=gen)
    q = torch.randn(sum(new), step.heads, d, generator=gen, device="cuda").to(dtype)
    offsets = [0]
    for n in new:
        offsets.append(offsets[-1] + n)
    cu_q = torch.tensor(offsets, dtype=torch.int32, device="cuda")
    used = torch.tensor(contexts, dtype=torch.int32, device="cuda")
    return dict(q=q, k=k, v=v, kp=kp, vp=vp, table=table, cu_q=cu_q, used=used, contexts=contexts, new=new,
                offsets=offsets)


def bottom_right(torch, n: int, ctx: int):
    """(n, ctx) bool: query i (the (ctx - n + i)-th token) sees keys 0 .. ctx - n + i."""
    rows = torch.arange(n, device="cuda")[:, None] + (ctx - n)
    return torch.arange(ctx, device="cuda")[None, :] <= rows


def per_sequence(torch, t: dict, dtype=None) -> list:
    """The SDPA-per-sequence step over contiguous caches: a list of per-sequence calls (q view, k, v,
    mask or None), K and V in (1, Hkv, ctx, D)."""
    calls = []
    for s, (ctx, n) in enumerate(zip(t["contexts"], t["new"])):
        q = t["q"][t["offsets"][s]:t["offsets"][s + 1]].transpose(0, 1).unsqueeze(0)
        k = t["k"][s, :ctx].transpose(0, 1).unsqueeze(0).contiguous()
        v = t["v"][s, :ctx].transpose(0, 1).unsqueeze(0).contiguous()
        if dtype is not None:
            q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        calls.append((q, k, v, bottom_right(torch, n, ctx) if n > 1 else None))
    return calls


def sdpa_step(torch, calls, outs, gqa: bool, heads: int, kv_heads: int):
    """Every sequence's SDPA into its rows of `outs` (total, Hq, D); K and V repeated to the query heads
    where SDPA is not given GQA (`gqa` False: a torch that refuses it)."""
    import torch.nn.functional as F
    at = 0
    for q, k, v, mask in calls:
        if not gqa and heads != kv_heads:
            k, v = k.repeat_interleave(heads // kv_heads, 1), v.repeat_interleave(heads // kv_heads, 1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa and heads != kv_heads)
        n = q.shape[2]
        outs[at:at + n].copy_(o[0].transpose(0, 1))
        at += n
    return outs


def graph_of(torch, fn):
    """fn captured in a CUDA graph (after warm-up on a side stream): the replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def timings(torch, fn, reps: int) -> dict:
    """GPU, eager and CUDA-graph µs of fn(); a path that cannot be captured is recorded, not timed."""
    out = {"gpu_us": time_calls(torch, lambda: fn(), [()], reps=reps)[0],
           "eager_us": time_eager(torch, lambda: fn(), [()], reps=reps)}
    try:
        replay = graph_of(torch, fn)
        out["graph_us"] = time_calls(torch, lambda: replay(), [()], reps=reps)[0]
    except Exception as exc:    # noqa: BLE001 -- any capture failure is the figure's absence, with its reason
        out["graph_error"] = str(exc).strip().splitlines()[0][:200]
    return out


def run_serving_bench(step: ServingStep, reps: int = 30) -> dict:
    """The step checked, then timed for attngen and SDPA per sequence: the report's row (raises
    ValueError when attngen's output misses the error rule: nothing of a wrong step is timed)."""
    import attngen
    from ...runtime import gpu_modules
    torch = gpu_modules()[0]
    dtype = torch.float16 if step.dtype == "fp16" else torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(step.seed)
    t = step_inputs(torch, step, dtype, gen)
    max_q, max_k = max(t["new"]), max(t["contexts"])

    def ours():
        return attngen.attention_varlen(t["q"], t["kp"], t["vp"], t["cu_q"], None, max_q, max_k, causal=True,
                                        block_table=t["table"], seqused_k=t["used"])

    out = ours().float()
    attngen.check_errors()
    ref = sdpa_step(torch, per_sequence(torch, t, torch.float32), torch.empty_like(out), True, step.heads,
                    step.kv_heads)
    calls = per_sequence(torch, t)
    low_out = torch.empty_like(t["q"])
    try:
        sdpa_step(torch, calls, low_out, True, step.heads, step.kv_heads)
        gqa = True
    except RuntimeError:
        gqa = False
        sdpa_step(torch, calls, low_out, False, step.heads, step.kv_heads)
    err = (out - ref).abs().max().item()
    bound = error_bound((low_out.float() - ref).abs().max().item())
    kv_bytes = sum(2 * c * step.kv_heads * step.head_dim * t["k"].element_size() for c in t["contexts"])
    row = {"sequences": step.sequences, "prefill": step.prefill, "chunk": step.chunk,
           "decoding": step.sequences - step.prefill, "query_tokens": sum(t["new"]), "keys": sum(t["contexts"]),
           "kv_bytes": kv_bytes, "page_size": step.page_size, "heads": f"{step.heads}/{step.kv_heads}",
           "head_dim": step.head_dim, "dtype": step.dtype, "max_err": err, "bound": bound, "passed": err <= bound,
           "sdpa_gqa": gqa}
    if not row["passed"]:
        raise ValueError(f"attngen's serving step exceeds the error rule: {err:.3g} > {bound:.3g} ({step.label})")
    row["attngen"] = timings(torch, ours, reps)
    outs = torch.empty_like(t["q"])
    row["sdpa_per_sequence"] = timings(torch, lambda: sdpa_step(torch, calls, outs, gqa, step.heads, step.kv_heads),
                                       reps)
    for how in TIMINGS:
        a, b = row["attngen"].get(how), row["sdpa_per_sequence"].get(how)
        row[f"ratio_{how.removesuffix('_us')}"] = b / a if a and b else None
    return {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "step": step.label, "rows": [row]}


def format_serving(report: dict) -> str:
    """The report as a table: µs per step, GPU, eager and CUDA graph, for attngen and SDPA per sequence,
    and SDPA ÷ attngen (above 1.0 attngen is faster)."""
    lines = [f"GPU: {report['gpu']}; {report['step']}",
             "(GPU: calls queued behind a GPU sleep; eager: back-to-back steps, host included; graph: the step "
             "replayed from a CUDA graph)",
             f"{'':<22} {'GPU us':>9} {'eager us':>9} {'graph us':>9}"]
    for row in report["rows"]:
        for name, key in (("attngen", "attngen"), ("SDPA per sequence", "sdpa_per_sequence")):
            figures = row[key]
            cols = " ".join(f"{figures[h]:>9.1f}" if figures.get(h) is not None else f"{'-':>9}" for h in TIMINGS)
            lines.append(f"{name:<22} {cols}")
            if figures.get("graph_error"):
                lines.append(f"{'':<22} graph not captured: {figures['graph_error']}")
        ratio_keys = [f"ratio_{h.removesuffix('_us')}" for h in TIMINGS]
        ratios = " ".join(f"{row[k]:>9.2f}" if row.get(k) else f"{'-':>9}" for k in ratio_keys)
        lines.append(f"{'SDPA / attngen':<22} {ratios}")
        lines.append(f"max error {row['max_err']:.3g} (bound {row['bound']:.3g}); K+V {row['kv_bytes'] / 1e6:.0f} MB, "
                     f"{row['query_tokens']} query tokens")
    return "\n".join(lines)


__all__ = ["ServingStep", "format_serving", "parse_context", "run_serving_bench", "step_problems"]
