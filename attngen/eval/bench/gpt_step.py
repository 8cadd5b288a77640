"""`attngen bench --gpt-step`: a small GPT's whole training step (eval/bench/gpt_model.py: embeddings, pre-norm
blocks, causal self-attention, MLP, AdamW; bf16 autocast by default) with attngen.attention and with torch's
SDPA (its own choice of backend), eager and under torch.compile, from one initialization, in one process.

A step is what a training loop runs: forward, cross-entropy, zero_grad, backward, the optimizer's step. Its
time is the host clock over `steps` steps back to back and the synchronize after them, / steps (host and GPU
together, as the loop feels them); beside it, its GPU time (step_gpu_ms: each step alone queued behind a GPU
sleep that covers its host time, CUDA events around it, the median over the steps of the first GPU_TIME_ROUNDS
rounds), which says whether the
step waits on the host or on the GPU. Steps queued together would not do: a step's hundreds of launches fill
the driver's launch queue, and the host then waits on the GPU; where even one step's do (or a step
synchronizes), its GPU time is reported as not measured. The four variants take turns over `rounds` rounds (drift in the GPU's clocks reaches all
alike), each figure the median of its rounds. Within a mode the two attentions run back to back, in turns
(SDPA first in even rounds, attngen first in odd ones), and the report pairs them: each round's SDPA / attngen
of one mode, their median and range (`paired`). The host drifts between rounds (a whole step ranged from 7.5
to 11.4 ms over one run's rounds on an H200 machine); a pair shares its round's host, two medians do not.

Checked first, from the shared initialization: the first step's loss and the first block's qkv weight
gradient with attngen against SDPA's (eager): the gradient's difference from SDPA's, relative to its norm.
Attention changes the loss little at initialization, but its backward feeds every qkv gradient (dq, dk and
dv each reach their own third of the weight's rows), so a wrong attention shows there."""
from __future__ import annotations

import math
import statistics
from typing import NamedTuple

VOCAB = 512
LOSS_RTOL = 1e-3          # first-step loss, attngen against SDPA (bf16 autocast: they agreed to 2e-6)
GRAD_RTOL = 5e-2          # |first block's qkv weight gradient - SDPA's| / |SDPA's|
VARIANTS = (("sdpa", False), ("attngen", False), ("sdpa", True), ("attngen", True))   # (attention, compiled)
MODES = ("eager", "compiled")
MEDIAN_LEVEL = 0.95       # the paired median's interval covers the true median at least this often
GPU_TIME_ROUNDS = 5       # rounds whose steps are also timed alone for their GPU time (each behind a GPU sleep)


def round_order(names, round_index: int) -> list:
    """The variants' order in round `round_index`: mode by mode, SDPA then attngen in even rounds and the
    other way in odd ones, so that neither attention always runs first after the other mode."""
    order = []
    for mode in MODES:
        pair = [n for n in (f"sdpa {mode}", f"attngen {mode}") if n in names]
        order += pair if round_index % 2 == 0 else pair[::-1]
    return order


def median_interval(values, level: float = MEDIAN_LEVEL):
    """A distribution-free interval for the median of the distribution `values` were drawn from: the j-th
    smallest and j-th largest values, j the largest rank whose interval covers the median with probability
    at least `level` (the count of values below the median is binomial with p = 1/2; nothing assumed of
    their spread, but it does take the values as alike and independent). None where even the smallest and
    largest do not reach `level` (1 to 5 values at 0.95)."""
    ordered = sorted(values)
    n = len(ordered)
    below, j = 0.0, 0    # below: P(at most j - 1 of the n values fall below the median)
    while j < n // 2:
        below_next = below + math.comb(n, j) / 2 ** n
        if 1 - 2 * below_next < level:
            break
        below, j = below_next, j + 1
    return None if j == 0 else (ordered[j - 1], ordered[n - j])


def paired_ratios(rounds_ms: dict) -> dict:
    """{mode: {"median", "low", "high", "min", "max", "attngen_faster", "rounds"}} of each round's SDPA ms /
    attngen ms of one mode (the two ran back to back in that round): low and high bound the median at
    MEDIAN_LEVEL (median_interval; None where the rounds are too few); modes missing either side are left
    out."""
    out = {}
    for mode in MODES:
        ours, theirs = rounds_ms.get(f"attngen {mode}"), rounds_ms.get(f"sdpa {mode}")
        if not ours or not theirs:
            continue
        ratios = [t / o for o, t in zip(ours, theirs)]
        low, high = median_interval(ratios) or (None, None)
        out[mode] = {"median": statistics.median(ratios), "low": low, "high": high, "min": min(ratios),
                     "max": max(ratios), "attngen_faster": sum(r > 1.0 for r in ratios), "rounds": len(ratios)}
    return out


class GptShape(NamedTuple):
    layers: int
    d_model: int
    heads: int
    seqlen: int
    batch: int

    @property
    def label(self) -> str:
        return (f"{self.layers} layers, d_model {self.d_model}, {self.heads} heads of {self.d_model // self.heads}, "
                f"{self.seqlen} tokens, batch {self.batch}")


DEFAULT_GPT = GptShape(4, 512, 8, 1024, 8)


def parse_gpt_shape(text: str) -> GptShape:
    """'4x512x8x1024x8' (layers x d_model x heads x tokens x batch) -> GptShape; ValueError saying what is
    wrong."""
    what = (f"{text.strip()!r} is not LAYERSxD_MODELxHEADSxTOKENSxBATCH (e.g. 4x512x8x1024x8: 4 layers, "
            "d_model 512, 8 heads, 1024 tokens, batch 8)")
    parts = text.strip().lower().split("x")
    if len(parts) != 5:
        raise ValueError(what)
    try:
        shape = GptShape(*(int(p) for p in parts))
    except ValueError:
        raise ValueError(what) from None
    if min(shape) < 1:
        raise ValueError(f"{text.strip()!r}: every size must be at least 1")
    if shape.d_model % shape.heads:
        raise ValueError(f"{text.strip()!r}: d_model ({shape.d_model}) must be a multiple of the heads "
                         f"({shape.heads}); the head dim is d_model / heads")
    if (shape.d_model // shape.heads) % 8:
        raise ValueError(f"{text.strip()!r}: the head dim d_model / heads = {shape.d_model // shape.heads} must be a "
                         "multiple of 8 (SDPA's and attngen's kernels read rows in 16-byte vectors)")
    return shape


def _relative(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def first_step_check(torch, gpt_model, shape: GptShape, init: dict, batch, dtype) -> dict:
    """The first step's loss and first-block qkv weight gradient with each attention, eager, from `init`;
    'status' ok, wrong (naming what differs) or not served (attngen has no kernel for the head dim)."""
    seen, grads = {}, {}
    for name in ("sdpa", "attngen"):
        model = gpt_model.GPT(VOCAB, shape.d_model, shape.heads, shape.layers, shape.seqlen, name == "attngen").cuda()
        model.load_state_dict(init)
        try:
            with torch.autocast("cuda", dtype=dtype):
                logits = model(batch[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.float().view(-1, VOCAB), batch[:, 1:].reshape(-1))
            loss.backward()
        except (LookupError, NotImplementedError, ValueError) as exc:
            return {"status": f"not served: {name}: {(str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]}"}
        grads[name] = model.blocks[0].qkv.weight.grad.float()
        seen[name] = {"loss": loss.item(), "qkv_grad_norm": grads[name].norm().item()}
        del model
    loss_rel = _relative(seen["attngen"]["loss"], seen["sdpa"]["loss"])
    grad_rel = (grads["attngen"] - grads["sdpa"]).norm().item() / max(seen["sdpa"]["qkv_grad_norm"], 1e-30)
    wrong = ([f"first-step loss differs from SDPA's by {loss_rel:.2g} (> {LOSS_RTOL:g})"] if loss_rel > LOSS_RTOL
             else []) + ([f"first block's qkv gradient differs from SDPA's by {grad_rel:.2g} of its norm "
                          f"(> {GRAD_RTOL:g})"] if grad_rel > GRAD_RTOL else [])
    return {"first_step": seen, "loss_rel_diff": loss_rel, "qkv_grad_rel_diff": grad_rel,
            "status": "wrong: " + "; ".join(wrong) if wrong else "ok"}


def step_gpu_ms(torch, step, x, host_seconds: float):
    """One training step's GPU time in ms: queued alone behind a GPU sleep of twice `host_seconds` (at least
    timing.SLEEP_CYCLES), CUDA events around it; None where the host finished queuing only after the sleep
    would have ended (it waited on the GPU: a full launch queue, or a synchronization in the step)."""
    import time
    from .timing import SLEEP_CYCLES_PER_SECOND, sleep_cycles
    cycles = sleep_cycles(host_seconds, 1)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    torch.cuda._sleep(cycles)
    started = time.perf_counter()
    start.record()
    step(x)
    end.record()
    queued = time.perf_counter() - started
    torch.cuda.synchronize()
    if queued >= cycles / SLEEP_CYCLES_PER_SECOND:   # a GPU clock below that rate only sleeps longer
        return None
    return start.elapsed_time(end)


def run_gpt_step(shape: GptShape = DEFAULT_GPT, *, dtype: str = "bf16", steps: int = 20, rounds: int = 5,
                 on_variant=None) -> dict:
    """The four variants' ms per step (VARIANTS), after the first-step check; on_variant(name) as each
    is built (the compiled ones compile then)."""
    import time
    from ...runtime import gpu_modules
    torch = gpu_modules()[0]
    from . import gpt_model
    dt = torch.float16 if dtype == "fp16" else torch.bfloat16
    torch.manual_seed(0)
    init = {k: v.clone() for k, v in gpt_model.GPT(VOCAB, shape.d_model, shape.heads, shape.layers, shape.seqlen,
                                                   False).state_dict().items()}
    gen = torch.Generator(device="cuda").manual_seed(0)
    data = [torch.randint(0, VOCAB, (shape.batch, shape.seqlen + 1), generator=gen, device="cuda")
            for _ in range(steps)]
    report = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "call": "gpt_step",
              "model": shape._asdict(), "vocab": VOCAB, "dtype": dtype, "steps": steps, "rounds": rounds}
    report.update(first_step_check(torch, gpt_model, shape, init, data[0], dt))
    if report["status"] != "ok":
        return report
    runs, failed = {}, {}
    for attention, compiled in VARIANTS:
        name = f"{attention} {'compiled' if compiled else 'eager'}"
        if on_variant:
            on_variant(name)
        model = gpt_model.GPT(VOCAB, shape.d_model, shape.heads, shape.layers, shape.seqlen,
                              attention == "attngen").cuda()
        model.load_state_dict(init)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
        step = gpt_model.training_step(torch.compile(model) if compiled else model, optimizer, dt, VOCAB)
        try:
            for x in data[:3]:   # warm-up; the compiled variants compile here
                step(x)
            torch.cuda.synchronize()
        except Exception as exc:   # reported, not raised: the other variants still run
            failed[name] = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            if not compiled:       # an eager step that fails after the check passed fails the run
                report["status"] = f"failed: {name}: {failed[name]}"
            continue
        runs[name] = step
    times = {name: [] for name in runs}
    gpu = {name: [] for name in runs}
    for round_index in range(rounds):
        for name in round_order(runs, round_index):
            step = runs[name]
            torch.cuda.synchronize()
            started = time.perf_counter()
            for x in data:
                step(x)
            torch.cuda.synchronize()
            times[name].append((time.perf_counter() - started) / steps * 1e3)
            if round_index < GPU_TIME_ROUNDS:   # the GPU time hardly moves; many rounds are for the host's sake
                host = times[name][-1] / 1e3
                gpu[name] += [step_gpu_ms(torch, step, x, host) for x in data]
    # whether the compiled graphs' attngen ops had the native library's kernels in front (runtime/native take_ops)
    report["native_op_kernels"] = bool(torch._C._dispatch_has_kernel_for_dispatch_key("attngen::attention_train",
                                                                                     "AutogradCUDA"))
    if report["native_op_kernels"]:   # how they took the calls: replayed, or handed on to the Python kernels
        from ...runtime import native
        report["native_op_counts"] = native.op_counts(torch)
    report["ms_per_step"] = {name: statistics.median(t) for name, t in times.items()}
    report["gpu_ms_per_step"] = {name: None if None in t else statistics.median(t) for name, t in gpu.items()}
    report["rounds_ms"] = times
    report["failed"] = failed
    report["paired"] = paired_ratios(times)
    ratios = {}
    for mode in MODES:
        ours, theirs = report["ms_per_step"].get(f"attngen {mode}"), report["ms_per_step"].get(f"sdpa {mode}")
        if ours and theirs:
            ratios[mode] = theirs / ours
    report["sdpa_over_attngen"] = ratios
    return report


def format_gpt_step(report: dict) -> str:
    shape = GptShape(**report["model"])
    lines = [f"GPU: {report['gpu']}; torch {report['torch']}; a GPT of {shape.label}, {report['dtype']} autocast, "
             f"AdamW; ms per training step (host and GPU, {report['steps']} steps back to back), median of "
             f"{report['rounds']} alternating rounds"]
    if "first_step" not in report:   # refused before a step ran
        lines.append(report["status"])
        return "\n".join(lines)
    first = report["first_step"]
    lines.append(f"first step, eager: loss attngen {first['attngen']['loss']:.6f}, SDPA {first['sdpa']['loss']:.6f}; "
                 f"first block's qkv gradient norm attngen {first['attngen']['qkv_grad_norm']:.6g}, SDPA "
                 f"{first['sdpa']['qkv_grad_norm']:.6g}")
    if "ms_per_step" not in report:   # the check failed: nothing was timed
        lines.append(report["status"])
        return "\n".join(lines)
    ms, gpu = report["ms_per_step"], report.get("gpu_ms_per_step", {})
    nan = float("nan")
    paired = report.get("paired", {})
    lines.append(f"{'mode':<10} {'attngen ms':>10} {'SDPA ms':>9} {'SDPA / attngen':>15} {'paired (range)':>20} "
                 f"{'attngen GPU ms':>15} {'SDPA GPU ms':>12}")
    for mode in MODES:
        ours, theirs = ms.get(f"attngen {mode}"), ms.get(f"sdpa {mode}")
        ratio = report["sdpa_over_attngen"].get(mode)
        pair = paired.get(mode)
        pair_text = f"{pair['median']:.3f} ({pair['min']:.2f}-{pair['max']:.2f})" if pair else "nan"
        lines.append(f"{mode:<10} {ours or nan:>10.3f} {theirs or nan:>9.3f} {ratio or nan:>15.3f} {pair_text:>20} "
                     f"{gpu.get(f'attngen {mode}') or nan:>15.3f} {gpu.get(f'sdpa {mode}') or nan:>12.3f}")
    lines.append("(ms: host and GPU, steps back to back; GPU ms: each step alone behind a GPU sleep, nan where the "
                 "host waited on the GPU; SDPA / attngen of the first; paired: the median of each round's "
                 "SDPA / attngen, the two run back to back, and the range over the rounds)")
    for mode, pair in paired.items():
        line = f"{mode}: attngen faster in {pair['attngen_faster']} of {pair['rounds']} rounds"
        if pair.get("low") is not None:
            line += (f"; a {MEDIAN_LEVEL:.0%} interval for the median round's SDPA / attngen: "
                     f"{pair['low']:.3f}-{pair['high']:.3f} (distribution-free)")
        lines.append(line)
    if report.get("native_op_kernels"):
        counts = report.get("native_op_counts") or {}
        lines.append("attngen's training ops ran with the native library's kernels in front of their Python ones"
                     + (": " + ", ".join(f"{name} {n}" for name, n in counts.items()) if counts else ""))
    for name, why in report.get("failed", {}).items():
        lines.append(f"{name}: not run ({why})")
    if report["status"] != "ok":
        lines.append(report["status"])
    return "\n".join(lines)


__all__ = ["DEFAULT_GPT", "GptShape", "format_gpt_step", "median_interval", "paired_ratios", "parse_gpt_shape", "round_order", "run_gpt_step",
           "step_gpu_ms"]
