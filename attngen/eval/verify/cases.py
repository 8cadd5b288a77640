"""What a verify case is and how it is judged, for every call: the suites of shapes, the mask
variants, the fp32 reference and the low-precision baseline, the error bound, the row and LSE
judges, poisoned outputs. Each call's verify module (forward.py, decode.py, ...) builds its cases on
these; the runner (runner.py) runs whatever cases it is handed."""
from __future__ import annotations

import contextlib
import math
import zlib
from dataclasses import asdict, dataclass, field
from typing import Protocol, runtime_checkable

from ...core.variants import MASKS, extra_logits, reference_scores

ERR_FACTOR = 2.0        # flash-attention tests/test_flash_attn.py: out error <= 2 x the low-precision error
ERR_FLOOR = 1e-5        # absolute floor for cases where torch's low-precision result is exact (e.g. seqlen_k 1)
LSE_ATOL = 1e-3
LSE_RTOL = 1e-3
ROW_ALIGN = 8           # guard rows are a multiple of 8 so views keep 16-byte aligned strides


@runtime_checkable
class CaseShape(Protocol):
    """What a verify case says about its problem, for the report's shape and layout columns.
    Every case type (padded Shape, VarlenCase, DecodeCase, and any a later call convention adds)
    is a dataclass with these two properties; the table and the JSON report read nothing else."""

    @property
    def label(self) -> str: ...          # the shape column, e.g. "B2 H4/2 Sq113 Sk300"

    @property
    def layout(self) -> str: ...         # the layout column: bhsd, bshd, thd (varlen sequences)


@dataclass(frozen=True)
class Shape:
    """One problem size. layout says how the tensors are passed; qkv: q, k, v are slices of one
    qkv tensor (strided, not contiguous), as a fused projection produces them."""

    batch: int
    heads: int
    kv_heads: int
    seqlen_q: int
    seqlen_k: int
    layout: str = "bhsd"
    qkv: bool = False

    def __post_init__(self):
        if self.qkv and (self.heads != self.kv_heads or self.seqlen_q != self.seqlen_k):
            raise ValueError("a qkv shape needs heads == kv_heads and seqlen_q == seqlen_k")

    @property
    def label(self) -> str:
        heads = f"{self.heads}" if self.heads == self.kv_heads else f"{self.heads}/{self.kv_heads}"
        return (f"B{self.batch} H{heads} Sq{self.seqlen_q} Sk{self.seqlen_k}"
                + (" qkv" if self.qkv else ""))


# Seqlens that are not multiples of any tile (1, 17, 77, 113, 333, 1000, 1023), seqlen_q != seqlen_k
# both ways, batch 1-4, GQA and MQA, both layouts, strided inputs (q, k, v sliced from one qkv tensor). The head_dim comes
# from the spec.
FULL_SUITE: tuple[Shape, ...] = (
    Shape(1, 1, 1, 1, 1),
    Shape(1, 2, 2, 17, 17, "bshd"),
    Shape(2, 4, 4, 113, 113),
    Shape(1, 2, 2, 128, 128, "bshd"),
    Shape(2, 3, 3, 1000, 1023),
    Shape(1, 4, 4, 1023, 1000, "bshd"),
    Shape(1, 8, 2, 256, 77),                 # GQA, seqlen_q > seqlen_k
    Shape(2, 8, 1, 77, 300, "bshd"),         # MQA, seqlen_q < seqlen_k
    Shape(4, 2, 2, 64, 1),                   # a single key
    Shape(1, 2, 1, 1, 500, "bshd"),          # a single query, MQA
    Shape(1, 4, 4, 333, 333, "bshd", qkv=True),
    Shape(3, 6, 3, 200, 511),                # GQA
    Shape(1, 2, 2, 2048, 2048),
    Shape(2, 16, 16, 513, 257, "bshd"),
)

QUICK_SUITE: tuple[Shape, ...] = (
    Shape(1, 1, 1, 1, 1),
    Shape(1, 2, 2, 17, 17, "bshd"),
    Shape(2, 4, 2, 113, 300),                # GQA, seqlen_q < seqlen_k
    Shape(1, 4, 1, 1000, 77, "bshd"),        # MQA, seqlen_q > seqlen_k
    Shape(1, 3, 3, 333, 333, "bhsd", qkv=True),
    Shape(2, 2, 2, 64, 1023),
)


def suite(quick: bool = False) -> tuple[Shape, ...]:
    return QUICK_SUITE if quick else FULL_SUITE


# Keys past 64 tiles of any spec (block_n <= 256): an expression mask's classification then skips
# chunks of 32 tiles it finds empty, a path the shorter shapes never take. Few queries keep the
# reference cheap; bottom-right masks put their keys at the end, top-left ones at the start.
LONG_KEYS = (Shape(1, 2, 2, 384, 17000, "bshd"), Shape(1, 2, 1, 700, 9000))


def kernel_shapes(plan, shapes) -> tuple[Shape, ...]:
    """The shapes a kernel of `plan` runs: `shapes`, plus LONG_KEYS where the plan's mask is an
    expression (it classifies tiles in the kernel)."""
    expression = getattr(plan, "expression", None)
    return tuple(shapes) + (LONG_KEYS if expression is not None and expression.mask is not None else ())


def error_bound(lowprec_err: float) -> float:
    """The largest max|out - ref| accepted for a kernel whose dtype's torch attention is
    `lowprec_err` = max|lowprec - ref| away from the fp32 reference."""
    return ERR_FACTOR * lowprec_err + ERR_FLOOR


@dataclass(frozen=True)
class Variant:
    """One way a kernel function is called: its mask and, for masks with options, one option; a
    window mask's (left, right) and whether the call also says causal (which bounds right at 0)."""

    mask: str
    alignment: str | None = None
    window: tuple[int, int] | None = None
    causal: bool = False

    @property
    def label(self) -> str:
        name = self.mask
        if self.window is not None:
            name += f"({self.window[0]},{self.window[1]})" + ("+causal" if self.causal else "")
        return name if self.alignment is None else f"{name}:{self.alignment}"

    def call_arguments(self) -> dict:
        """The mask's keyword arguments of a kernel call."""
        args = {"causal": self.mask == "causal" or self.causal, "alignment": self.alignment}
        if self.window is not None:
            args["window"] = self.window
        return args

    @property
    def visible_window(self) -> tuple[int, int] | None:
        """The window the reference draws: causal bounds its right side at 0."""
        if self.window is None:
            return None
        return (self.window[0], 0) if self.causal else self.window


def window_variants(block_n: int) -> tuple[Variant, ...]:
    """Windows of 0 and 1 key, a tile +- 1, one wider than any sequence of the suites, one-sided
    windows, and a causal window (Mistral's), in both alignments."""
    n = block_n
    return (Variant("window", "top_left", (0, 0)),
            Variant("window", "top_left", (1, -1)),
            Variant("window", "top_left", (n - 1, n + 1)),
            Variant("window", "top_left", (-1, n)),
            Variant("window", "bottom_right", (n + 1, 1), causal=True),
            Variant("window", "bottom_right", (1, n - 1)),
            Variant("window", "bottom_right", (5000, 5000)))


def variants(masks, block_n: int = 64) -> tuple[Variant, ...]:
    """Every (mask, option) the kernel functions of `masks` take: causal runs in both alignments,
    a window mask over window_variants."""
    out = []
    for m in masks:
        if MASKS[m].takes_window:
            out += window_variants(block_n)
        else:
            out += [Variant(m, o) for o in (MASKS[m].options or (None,))]
    return tuple(out)


def score_arguments(plan, batch: int, heads: int, generator, device) -> dict:
    """The keyword arguments a kernel of `plan` takes for its score modifiers, each modifier's own
    verify value (core/variants.py; ALiBi slopes drawn from `generator`)."""
    import torch
    return {s.argument: s.verify_value(torch, batch, heads, generator, device) for s in plan.score_variants}


def score_modifiers(plan, args: dict, batch_slice=None) -> tuple:
    """(ScoreVariant, value) of the plan's modifiers for the reference; batch_slice picks the
    slopes of some batches (a varlen sequence)."""
    out = []
    for s in plan.score_variants:
        value = args[s.argument]
        if batch_slice is not None and s.select_batches is not None:
            value = s.select_batches(value, batch_slice)
        out.append((s, value))
    return tuple(out)


@dataclass
class CaseResult:
    spec: str               # spec name (or the kernel's label)
    function: str           # extern "C" kernel name
    variant: str            # Variant.label: none | causal:top_left | causal:bottom_right
    shape: Shape
    passed: bool
    max_err: float | None = None        # max |out - ref|
    lowprec_err: float | None = None    # max |baseline - ref|
    bound: float | None = None          # error_bound(lowprec_err)
    lse_err: float | None = None        # max |lse - ref_lse|
    lse_excess: float | None = None     # max of |lse - ref_lse| / (LSE_ATOL + LSE_RTOL |ref_lse|); <= 1 passes
    problems: list[str] = field(default_factory=list)
    pycuda: str | None = None           # the same call launched through PyCUDA: bitwise | differs | None (not run)
    seconds: float | None = None        # wall time of the case (inputs, both launches, reference, judges)
    call: str | None = None             # the kernel's call convention (forward, backward, decode, ...)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["shape"] = {**asdict(self.shape), "label": self.shape.label, "layout": self.shape.layout}
        for key in ("max_err", "lowprec_err", "bound", "lse_err", "lse_excess"):
            if d[key] is not None and not math.isfinite(d[key]):
                d[key] = str(d[key])        # JSON has no NaN / inf
        return d


@dataclass
class VerifyReport:
    device: str
    arch: str
    torch_version: str
    suite: str
    cases: list[CaseResult]
    ran_alone: int = 0      # worker runs: cases that ran out of GPU memory beside the other workers and ran again alone

    @property
    def failed(self) -> list[CaseResult]:
        return [c for c in self.cases if not c.passed]

    @property
    def ok(self) -> bool:
        return bool(self.cases) and not self.failed

    def time_by_call(self) -> dict[str, tuple[int, float]]:
        """call convention -> (cases, their wall seconds summed): where a run's time went (with worker
        processes, summed over them); cases that did not run are not counted."""
        out: dict[str, tuple[int, float]] = {}
        for c in self.cases:
            if c.call is not None and c.seconds is not None:
                n, t = out.get(c.call, (0, 0.0))
                out[c.call] = (n + 1, t + c.seconds)
        return dict(sorted(out.items(), key=lambda item: -item[1][1]))

    def pycuda_counts(self) -> dict:
        """How many cases' PyCUDA launch agreed bit for bit, within the error rule (atomics), differed
        or did not run (a case that raised first)."""
        counts = {"bitwise": 0, "bitwise but atomics": 0, "differs": 0, "not run": 0}
        for c in self.cases:
            counts[c.pycuda or "not run"] += 1
        return counts

    def as_dict(self) -> dict:
        return {
            "device": self.device, "arch": self.arch, "torch": self.torch_version, "suite": self.suite,
            "tolerance": {"rule": "max|out-ref| <= factor * max|lowprec-ref| + floor; "
                                  "|lse-ref_lse| <= lse_atol + lse_rtol * |ref_lse|",
                          "factor": ERR_FACTOR, "floor": ERR_FLOOR, "lse_atol": LSE_ATOL, "lse_rtol": LSE_RTOL},
            "passed": len(self.cases) - len(self.failed), "failed": len(self.failed),
            "pycuda": self.pycuda_counts(),
            "cases": [c.as_dict() for c in self.cases],
        }


# -- torch attention -----------------------------------------------------------------------------

@contextlib.contextmanager
def exact_fp32_matmul(torch):
    """The reference must be fp32, not TF32, whatever the caller's global setting."""
    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def attention_torch(q, k, v, *, scale: float, mask: str = "none", alignment: str | None = None,
                    causal: bool | None = None, window: tuple | None = None, modifiers: tuple = ()):
    """softmax(scale q k^T) v and the natural-log LSE of the scaled scores, in q's dtype.

    (B, H, S, D) tensors; GQA/MQA by repeating kv heads. The mask and the score modifiers come
    from the same variant definitions the kernel's hooks follow (attngen/core/variants.py): `mask`
    names it, `alignment` is its option (causal: top_left as torch SDPA is_causal, or
    bottom_right) and `window` a window mask's (left, right); `modifiers` are (ScoreVariant,
    value) pairs applied to the scaled scores in order. `causal=True` is short for mask="causal".
    A row that sees no key gives zeros and LSE -inf.
    """
    import torch
    if causal is not None:
        mask = "causal" if causal else "none"
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads != kv_heads:
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = reference_scores(torch, scores, modifiers, q.shape[2], k.shape[2])
    visible = MASKS[mask].visible(torch, q.shape[2], k.shape[2], alignment, q.device, window)
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    extra = extra_logits(torch, modifiers, scores)
    if extra is not None:    # valueless keys (sinks) join the softmax: a row of hidden keys still has them
        joined = torch.cat([scores, extra.expand(*scores.shape[:-1], extra.shape[-1])], dim=-1)
        lse = torch.logsumexp(joined.float(), dim=-1)
        return torch.matmul(torch.softmax(joined, dim=-1)[..., :scores.shape[-1]], v), lse
    lse = torch.logsumexp(scores.float(), dim=-1)
    probs = torch.softmax(scores, dim=-1)
    if visible is not None:
        probs = probs.masked_fill(~visible.any(dim=-1, keepdim=True), 0.0)  # softmax of no key: zeros, not NaN
    if modifiers:    # a score hook's mask (an expression's) hides keys with -inf: a row of them gives zeros too
        probs = probs.masked_fill(torch.isneginf(scores).all(dim=-1, keepdim=True), 0.0)
    return torch.matmul(probs, v), lse


def read_back(torch, values: dict) -> dict:
    """`values` with its 0-d device tensors (counts, maxima, flags) replaced by Python numbers, read in
    one copy: a case synchronizes once for its judges instead of once per `.item()`, which matters
    when several verify processes share the GPU and take turns at every synchronization."""
    names = [name for name, value in values.items() if torch.is_tensor(value)]
    if not names:
        return dict(values)
    got = torch.stack([values[name].detach().reshape(()).double() for name in names]).tolist()
    return {**values, **dict(zip(names, got))}


def max_abs(t):
    """max |t| as a 0-d tensor (not yet read), or 0.0 for an empty tensor."""
    return t.abs().max() if t.numel() else 0.0


def reference_error_values(torch, q, k, v, out, *, scale: float, mask: str, alignment: str | None, window=None,
                           modifiers: tuple = ()):
    """reference_errors with the two maxima left on the device (0-d tensors, for read_back)."""
    with exact_fp32_matmul(torch):
        ref, ref_lse = attention_torch(q.float(), k.float(), v.float(), scale=scale, mask=mask, alignment=alignment,
                                       window=window, modifiers=modifiers)
    lowprec, _ = attention_torch(q, k, v, scale=scale, mask=mask, alignment=alignment, window=window,
                                 modifiers=modifiers)
    return max_abs(out.float() - ref), max_abs(lowprec.float() - ref), ref_lse


def reference_errors(torch, q, k, v, out, *, scale: float, mask: str, alignment: str | None, window=None,
                     modifiers: tuple = ()):
    """(max|out - ref|, max|lowprec - ref|, ref_lse) for (B, H, S, D) tensors: ref is fp32 attention
    on the upcast inputs, lowprec torch's attention in the inputs' dtype. verify and bench share it."""
    err, low, ref_lse = reference_error_values(torch, q, k, v, out, scale=scale, mask=mask, alignment=alignment,
                                               window=window, modifiers=modifiers)
    values = read_back(torch, {"err": err, "low": low})
    return values["err"], values["low"], ref_lse


def judge_rows(result: CaseResult, torch, out, ref, low, lse, ref_lse, dtype_name: str) -> None:
    """The error rule on outputs given row by row (decode, varlen sequences): every element of
    `out` finite, max|out - ref| within error_bound(max|low - ref|), LSE -inf exactly where the
    reference sees no key and within LSE_ATOL + LSE_RTOL |ref| elsewhere. Fills `result`'s errors,
    appends to its problems and sets passed."""
    problems = result.problems
    out = out.float()
    no_key = torch.isneginf(ref_lse)
    diff = (lse - ref_lse).abs()[~no_key]
    values = read_back(torch, {
        "bad": (~torch.isfinite(out)).sum(), "err": max_abs(out - ref), "low": max_abs(low - ref),
        "lse_rows": (no_key != torch.isneginf(lse)).any() | torch.isnan(lse).any(),
        "lse_err": diff.max() if diff.numel() else 0.0,
        "lse_excess": (diff / (LSE_ATOL + LSE_RTOL * ref_lse.abs()[~no_key])).max() if diff.numel() else 0.0})
    bad = int(values["bad"])
    if bad:
        problems.append(f"{bad} of {out.numel()} output elements are NaN/inf (unwritten or overflowed)")
    result.max_err, result.lowprec_err = values["err"], values["low"]
    result.bound = error_bound(result.lowprec_err)
    if not bad and not result.max_err <= result.bound:
        problems.append(f"max error {result.max_err:.3g} exceeds {result.bound:.3g} ({ERR_FACTOR:g} x torch "
                        f"{dtype_name} error {result.lowprec_err:.3g} + floor)")
    if values["lse_rows"] or lse.shape != ref_lse.shape:
        problems.append("LSE is NaN, or -inf on other rows than the reference's (rows that see no key)")
    result.lse_err, result.lse_excess = values["lse_err"], values["lse_excess"]
    if not result.lse_excess <= 1.0:
        problems.append(f"lse error {result.lse_err:.3g} exceeds {LSE_ATOL:g} + {LSE_RTOL:g} x |lse|")
    result.passed = not problems


def make_inputs(shape: Shape, head_dim: int, dtype, device, generator, v_dim: int | None = None):
    """q, k, v in shape.layout, standard normal (never zeros); v with v_dim columns when given."""
    import torch
    b, h, kvh, sq, sk, d = shape.batch, shape.heads, shape.kv_heads, shape.seqlen_q, shape.seqlen_k, head_dim
    dv = v_dim or d

    def randn(*size):
        return torch.randn(size, generator=generator, device=device, dtype=torch.float32).to(dtype)

    if shape.qkv and dv != d:   # one buffer, q | k | v side by side in each row (strided views)
        qkv = randn(b, sq, h, 2 * d + dv) if shape.layout == "bshd" else randn(b, h, sq, 2 * d + dv)
        return qkv[..., :d], qkv[..., d:2 * d], qkv[..., 2 * d:]
    if shape.qkv:
        if shape.layout == "bshd":
            return randn(b, sq, 3, h, d).unbind(2)
        return randn(b, 3, h, sq, d).unbind(1)
    if shape.layout == "bshd":
        return randn(b, sq, h, d), randn(b, sk, kvh, d), randn(b, sk, kvh, dv)
    return randn(b, h, sq, d), randn(b, kvh, sk, d), randn(b, kvh, sk, dv)


def poisoned_output(shape: Shape, head_dim: int, guard_rows: int, dtype, device):
    """(o, guard): o in shape.layout filled with NaN, a view of a buffer with `guard_rows` more
    sequence rows per head; the guard rows must still be NaN after the kernel ran."""
    import torch
    b, h, sq, d = shape.batch, shape.heads, shape.seqlen_q, head_dim
    if shape.layout == "bshd":
        buf = torch.full((b, sq + guard_rows, h, d), float("nan"), dtype=dtype, device=device)
        return buf[:, :sq], buf[:, sq:]
    buf = torch.full((b, h, sq + guard_rows, d), float("nan"), dtype=dtype, device=device)
    return buf[:, :, :sq], buf[:, :, sq:]


def poisoned_lse(shape: Shape, guard: int, device):
    """(lse, guard): contiguous fp32 (B, H, Sq) of NaN followed by `guard` NaN elements."""
    import torch
    n = shape.batch * shape.heads * shape.seqlen_q
    buf = torch.full((n + guard,), float("nan"), dtype=torch.float32, device=device)
    return buf[:n].view(shape.batch, shape.heads, shape.seqlen_q), buf[n:]


def lse_values(torch, lse, ref_lse, lse_guard) -> dict:
    """What judge_lse reads of a padded case's LSE, as 0-d device tensors (read_back reads them with
    the case's other values)."""
    no_key = torch.isneginf(ref_lse)
    finite = ~no_key
    lse_diff = (lse - ref_lse).abs()[finite]
    return {
        "lse_bad": (torch.isnan(lse) | torch.isinf(lse) & ~no_key | no_key & ~torch.isneginf(lse)).sum(),
        "lse_guard": (~torch.isnan(lse_guard)).any(),
        "lse_err": lse_diff.max() if lse_diff.numel() else 0.0,
        "lse_excess": (lse_diff / (LSE_ATOL + LSE_RTOL * ref_lse.abs()[finite])).max() if lse_diff.numel() else 0.0,
    }


def judge_lse_values(result: CaseResult, values: dict, numel: int) -> None:
    """The LSE rule of a padded case on lse_values read back: -inf exactly where the reference sees no
    key (every other row finite), nothing written into the guard after it, |lse - ref_lse| <= LSE_ATOL
    + LSE_RTOL |ref_lse|. Fills result's lse errors and appends to its problems."""
    problems = result.problems
    lse_bad = int(values["lse_bad"])
    if lse_bad:
        problems.append(f"{lse_bad} of {numel} lse elements are NaN, inf, or not -inf where no key is visible")
    if values["lse_guard"]:
        problems.append("lse written past its (batch, heads, seqlen_q) end")
    result.lse_err, result.lse_excess = values["lse_err"], values["lse_excess"]
    if not result.lse_excess <= 1.0 and not lse_bad:
        problems.append(f"lse error {result.lse_err:.3g} exceeds {LSE_ATOL:g} + {LSE_RTOL:g} x |lse|")


def judge_lse(result: CaseResult, torch, lse, ref_lse, lse_guard) -> None:
    """judge_lse_values on `lse` (one read of the device)."""
    judge_lse_values(result, read_back(torch, lse_values(torch, lse, ref_lse, lse_guard)), lse.numel())


def case_seed(seed: int, kernel_index: int, variant: str, shape_index: int) -> int:
    """Each case draws its own inputs; the same seed reproduces a failing case."""
    salt = {"none": 0, "causal:top_left": 1009, "causal:bottom_right": 2017}.get(variant)
    if salt is None:
        salt = 3023 + zlib.crc32(variant.encode()) % 4099
    return seed * 1_000_003 + kernel_index * 10_007 + salt + shape_index
