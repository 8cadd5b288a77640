"""Attention variants: which keys a query row sees (masks) and what happens to a score before the
softmax (score modifiers). One definition per variant serves the CUDA hook (templates/lib/mask.j2
and score.j2 read the variant's Params fields) and the fp32 reference of `verify`, so a kernel and
its test cannot disagree.

A mask is chosen per kernel function by the spec's `masks` list (none, causal, window); its options
(the alignment) and arguments (window sizes) are runtime values packed into Params, so one function
serves every option. A score modifier (softcap, alibi) is applied by every function of a spec that
lists it in `scores`; its argument (the cap, the slopes tensor) is a call argument. MaskVariant and
ScoreVariant know no variant: each one brings its Params fields, the function that fills them and
its torch reference.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

from .abi import AbiField, float32, float_pointer, int32, int64
from .constants import LOG2E

TOP_LEFT = "top_left"          # torch SDPA is_causal: query i sees keys 0..i
BOTTOM_RIGHT = "bottom_right"  # FlashAttention >= 2.1: query i sees keys 0..i + Sk - Sq (KV-cache prefill)
ALIGNMENTS = (TOP_LEFT, BOTTOM_RIGHT)

# (option, seqlen_q, seqlen_k, window) -> {Params field name: value}; the option is already checked,
# window is the call's (left, right) (None for masks that take none).
AbiValues = Callable[[str, int, int, Optional[tuple]], dict]
# (torch, seqlen_q, seqlen_k, option, device, window) -> (Sq, Sk) bool tensor of visible keys, or
# None when every key is visible; the option is already checked.
Visible = Callable[[Any, int, int, str, Any, Optional[tuple]], Optional[Any]]


class MaskVariant(NamedTuple):
    # A NamedTuple, not a frozen dataclass: a first call defines this class (core.frozen says why).
    name: str                       # the spec's word for it (masks: [...])
    cpp: str                        # the C++ enumerator the kernel function is instantiated with
    options: tuple[str, ...]        # runtime options; the first is the default
    abi_fields: tuple[AbiField, ...]
    describe: str
    fill: AbiValues                 # the values of abi_fields for one call
    visibility: Visible             # the reference's mask
    varlen_only: tuple[str, ...] = ()   # abi_fields only varlen functions read
    takes_window: bool = False          # the call gives it window=(left, right)
    unit: str = ""                      # its pieces of the shared hooks (templates/lib/variant_hooks.j2 says how)

    def check_option(self, option: str | None) -> str:
        if option is None:
            return self.options[0] if self.options else ""
        if option not in self.options:
            have = ", ".join(self.options) if self.options else "none"
            raise ValueError(f"mask {self.name!r} takes alignment in ({have}), got {option!r}")
        return option

    def abi_values(self, option: str | None, seqlen_q: int, seqlen_k: int, window: tuple | None = None) -> dict:
        """The variant's Params fields for one call (fields left out take their defaults)."""
        values = self.fill(self.check_option(option), seqlen_q, seqlen_k, window)
        unknown = set(values) - {f.name for f in self.abi_fields}
        if unknown:
            raise ValueError(f"mask {self.name!r} fills Params field(s) it does not declare: "
                             f"{', '.join(sorted(unknown))}")
        return values

    def visible(self, torch, seqlen_q: int, seqlen_k: int, option: str | None, device, window: tuple | None = None):
        """(Sq, Sk) bool tensor of visible keys, or None when every key is visible."""
        return self.visibility(torch, seqlen_q, seqlen_k, self.check_option(option), device, window)


# -- none: every key is visible ---------------------------------------------------------------------

def no_abi_values(option: str, seqlen_q: int, seqlen_k: int, window) -> dict:
    return {}


def every_key_visible(torch, seqlen_q: int, seqlen_k: int, option: str, device, window):
    return None


NONE = MaskVariant("none", "Mask::None", (), (), "every key is visible", no_abi_values, every_key_visible)


# -- causal: query row i sees keys j <= i + causal_offset ----------------------------------------------

def causal_key_offset(option: str, seqlen_q: int, seqlen_k: int) -> int:
    """Query row i sees keys j <= i + offset: 0 top-left, Sk - Sq bottom-right."""
    return seqlen_k - seqlen_q if option == BOTTOM_RIGHT else 0


def causal_abi_values(option: str, seqlen_q: int, seqlen_k: int, window) -> dict:
    return {"causal_offset": causal_key_offset(option, seqlen_q, seqlen_k),
            "causal_from_end": int(option == BOTTOM_RIGHT)}


def causal_visible(torch, seqlen_q: int, seqlen_k: int, option: str, device, window):
    offset = causal_key_offset(option, seqlen_q, seqlen_k)
    return torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device).tril(diagonal=offset)


CAUSAL = MaskVariant(
    "causal", "Mask::Causal", ALIGNMENTS,
    (int32("causal_offset", "causal: query row i sees keys j <= i + causal_offset (0 top-left, Sk - Sq "
                            "bottom-right)", default=0),
     int32("causal_from_end", "causal, varlen sequences: 1 (bottom-right) adds each sequence's seqlen_k - seqlen_q "
                              "to causal_offset; padded calls carry it in causal_offset already", default=0)),
    "query row i sees keys j <= i + causal_offset; causal_offset = 0 (top_left) or Sk - Sq (bottom_right)",
    causal_abi_values, causal_visible, varlen_only=("causal_from_end",))

# -- window: query row i sees keys i + offset - left <= j <= i + offset + right ------------------------

UNBOUNDED = 1 << 30   # a window side of -1 (unbounded) as a diagonal offset: beyond any sequence, no int overflow


def window_bounds(option: str, seqlen_q: int, seqlen_k: int, window: tuple) -> tuple[int, int]:
    """(lo, hi): row i sees keys i + lo <= j <= i + hi. A side of -1 is unbounded. The offset of the
    alignment (0 top-left, Sk - Sq bottom-right) is folded in."""
    left, right = window
    offset = causal_key_offset(option, seqlen_q, seqlen_k)
    return (-UNBOUNDED if left < 0 else offset - left), (UNBOUNDED if right < 0 else offset + right)


def window_abi_values(option: str, seqlen_q: int, seqlen_k: int, window) -> dict:
    lo, hi = window_bounds(option, seqlen_q, seqlen_k, window)
    return {"window_lo": lo, "window_hi": hi, "window_from_end": int(option == BOTTOM_RIGHT)}


def window_visible(torch, seqlen_q: int, seqlen_k: int, option: str, device, window):
    lo, hi = window_bounds(option, seqlen_q, seqlen_k, window)
    rows = torch.arange(seqlen_q, device=device)[:, None]
    keys = torch.arange(seqlen_k, device=device)[None, :]
    return (keys >= rows + lo) & (keys <= rows + hi)


WINDOW = MaskVariant(
    "window", "Mask::Window", ALIGNMENTS,
    (int32("window_lo", "window: query row i sees keys j >= i + window_lo (offset - left; -2^30 unbounded)",
           default=-UNBOUNDED),
     int32("window_hi", "window: ... and j <= i + window_hi (offset + right; 2^30 unbounded)", default=UNBOUNDED),
     int32("window_from_end", "window, varlen sequences: 1 (bottom-right) adds each sequence's seqlen_k - "
                              "seqlen_q to window_lo and window_hi; padded calls carry it already", default=0)),
    "query row i sees keys i + offset - left <= j <= i + offset + right (FlashAttention's window_size; -1: "
    "unbounded side); offset 0 (top_left) or Sk - Sq (bottom_right)",
    window_abi_values, window_visible, varlen_only=("window_from_end",), takes_window=True,
    unit="variants/window.j2")

# -- expr: the spec's mask expression (variant.mask, core/expression_variant.py) ------------------------
# Its function is instantiated with Mask::Expr; the expression itself is applied by the score hook
# with the spec's other expressions, and its reference by the expression's ScoreVariant, so the mask
# variant has no fields and hides nothing on its own.

EXPR = MaskVariant("expr", "Mask::Expr", (), (), "the spec's mask expression (variant.mask)", no_abi_values,
                   every_key_visible, unit="variants/expr.j2")

MASKS: dict[str, MaskVariant] = {m.name: m for m in (NONE, CAUSAL, WINDOW, EXPR)}


def check_window(window) -> tuple[int, int]:
    """A call's window=(left, right): two integers, each -1 (unbounded) or more. ValueError otherwise."""
    try:
        left, right = window
    except (TypeError, ValueError):
        raise ValueError(f"window must be a pair (left, right) of integers, -1 for an unbounded side "
                         f"(got {window!r})") from None
    for side in (left, right):
        if isinstance(side, bool) or not isinstance(side, int) or side < -1:
            raise ValueError(f"window sides must be integers >= -1, -1 for unbounded (got {window!r})")
    return int(left), int(right)


def call_mask(causal: bool, window, masks=()) -> str:
    """The mask a call asks for: window when its window=(left, right) bounds a side (causal closes the
    right side at 0, so a causal call is a window call only when left is bounded), else causal or none.
    A spec whose mask is an expression (masks [expr]) takes neither: its expression is the mask."""
    if "expr" in masks:
        if causal or window is not None:
            raise ValueError("this spec's mask is its expression (variant.mask); write causality or a window into "
                             "the expression instead of passing causal= or window=")
        return "expr"
    if window is not None:
        left, right = check_window(window)
        if left >= 0 or (right >= 0 and not causal):
            return "window"
    return "causal" if causal else "none"


def window_keys(causal: bool, window) -> int | None:
    """The keys a query row of a window call may see at most: left + 1 + right (causal closes the right
    side at 0); None where a side is unbounded or the call has no window. The dispatch table's window
    entries may be bounded by it (max_window)."""
    if window is None:
        return None
    left, right = check_window(window)
    right = 0 if causal else right
    return None if left < 0 or right < 0 else left + 1 + right


# -- score modifiers -----------------------------------------------------------------------------------

# (value, scale, context) -> {Params field: value}. context: batch, heads, device index of the call.
ScoreFill = Callable[[Any, float, dict], dict]
# (torch, scores (B, H, Sq, Sk) scaled, value, seqlen_q, seqlen_k) -> the modified scores
ScoreReference = Callable[[Any, Any, Any, int, int], Any]
# (torch, batch, heads, generator, device) -> the value `attngen verify` calls a kernel with
VerifyValue = Callable[[Any, int, int, Any, Any], Any]
# (torch, value, scores (B, H, Sq, Sk) scaled) -> (B or 1, H, Sq, 1) logits of a key with no value that
# joins every row's softmax denominator (a learned sink)
ExtraLogit = Callable[[Any, Any, Any], Any]


class ScoreVariant(NamedTuple):
    """A change to every score before the mask and the softmax, applied in the order of SCORES."""

    # A NamedTuple, not a frozen dataclass: a first call defines this class (core.frozen says why).
    name: str                         # the spec's word for it (scores: [...])
    argument: str                     # the call's keyword that carries its value
    abi_fields: tuple[AbiField, ...]
    describe: str
    fill: ScoreFill
    reference: ScoreReference
    verify_value: VerifyValue
    select_batches: Optional[Callable[[Any, slice], Any]] = None   # the value for some batches (a varlen sequence's)
    default: Any = None               # the value of a call that gives none (None: the call must give one)
    unit: str = ""                    # its pieces of the shared hooks (templates/lib/variant_hooks.j2 says how)
    slope_varies: bool = False        # its derivative by the score depends on the score (the backward's kSlopesVary)
    extra_logit: Optional[ExtraLogit] = None   # the reference's logit of a valueless key in every row's softmax
    kind_flag: str = ""               # a spec model's ClassVar that must be true for its kind to take it ("": every
                                      # kind that takes score modifiers)


def softcap_fill(cap, scale: float, context: dict) -> dict:
    """The kernel computes t = tanh(s * scale / cap) and runs the softmax on t with scale_log2 =
    cap * log2(e): cap * tanh(scale * s / cap) with the scale folded into one multiply."""
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not (0 < cap < float("inf")):
        raise ValueError(f"softcap must be a positive finite number (got {cap!r})")
    return {"softcap_premul": scale / cap, "scale_log2": cap * LOG2E}


def softcap_reference(torch, scores, cap, seqlen_q: int, seqlen_k: int):
    return cap * torch.tanh(scores / cap)


def softcap_verify_value(torch, batch: int, heads: int, generator, device) -> float:
    return 4.0      # small enough that tanh bends the scores of standard normal inputs


SOFTCAP = ScoreVariant(
    "softcap", "softcap",
    (float32("softcap_premul", "softcap: scale / cap; the score is tanh(s * softcap_premul) and scale_log2 is "
                               "cap * log2(e)"),),
    "logit softcapping (Gemma 2): cap * tanh(scale * s / cap)", softcap_fill, softcap_reference,
    softcap_verify_value, unit="variants/softcap.j2", slope_varies=True)


def check_fp32_argument(value, argument: str, index: int) -> None:
    """A call's fp32 tensor argument (ALiBi's slopes, the sinks): a torch.Tensor, float32, on the call's
    GPU (cuda:`index`); TypeError or ValueError saying which."""
    import torch
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{argument} must be a torch.Tensor (got {type(value).__name__})")
    if value.dtype != torch.float32:
        raise TypeError(f"{argument} must be float32 (got {value.dtype}); pass {argument}.float()")
    if value.get_device() != index:
        raise ValueError(f"{argument} is on {value.device} but q is on cuda:{index}")


def alibi_fill(slopes, scale: float, context: dict) -> dict:
    """The slopes tensor, fp32 (heads,) or (batch, heads) on the call's GPU."""
    heads, batch, index = context["heads"], context["batch"], context["device"]
    check_fp32_argument(slopes, "alibi_slopes", index)
    shapes = ((heads,),) + (((batch, heads),) if batch is not None else ())
    if tuple(slopes.shape) not in shapes or slopes.stride(-1) != 1:
        want = " or ".join(str(s) for s in shapes)
        raise ValueError(f"alibi_slopes must have shape {want} with its last dim contiguous (got "
                         f"{tuple(slopes.shape)}, strides {tuple(slopes.stride())})")
    if slopes.data_ptr() % 4:
        raise ValueError("alibi_slopes must be 4-byte aligned")
    return {"alibi_slopes": slopes.data_ptr(), "alibi_batch_stride": slopes.stride(0) if slopes.dim() == 2 else 0}


def alibi_bias(torch, slopes, seqlen_q: int, seqlen_k: int):
    """-slope * |i + Sk - Sq - j| as (B or 1, H, Sq, Sk) fp32 (FlashAttention's ALiBi)."""
    rows = torch.arange(seqlen_q, device=slopes.device)[:, None]
    keys = torch.arange(seqlen_k, device=slopes.device)[None, :]
    distance = (rows + seqlen_k - seqlen_q - keys).abs().float()
    s = slopes.float().reshape(-1 if slopes.dim() == 2 else 1, slopes.shape[-1], 1, 1)
    return -s * distance


def alibi_reference(torch, scores, slopes, seqlen_q: int, seqlen_k: int):
    return scores + alibi_bias(torch, slopes, seqlen_q, seqlen_k).to(scores.dtype)


def alibi_select_batches(slopes, batches: slice):
    """(B, H) slopes of some batches; (H,) slopes serve every batch."""
    return slopes[batches] if slopes.dim() == 2 else slopes


def alibi_verify_value(torch, batch: int, heads: int, generator, device):
    """(batch, heads) fp32 slopes, uniform below 0.3 as FlashAttention's tests draw them."""
    return torch.rand(batch, heads, generator=generator, device=device) * 0.3


ALIBI = ScoreVariant(
    "alibi", "alibi_slopes",
    (float_pointer("alibi_slopes", "alibi: fp32 slopes of (batch, heads) or (heads,), heads contiguous"),
     int64("alibi_batch_stride", "alibi: elements between batches of alibi_slopes (0: one row for all)")),
    "ALiBi (FlashAttention's): bias -slope[h] * |i + Sk - Sq - j| added to the scaled score",
    alibi_fill, alibi_reference, alibi_verify_value, alibi_select_batches, unit="variants/alibi.j2")



def sink_fill(sinks, scale: float, context: dict) -> dict:
    """The sinks tensor: fp32 (heads,) on the call's GPU, one learned logit per query head."""
    heads, index = context["heads"], context["device"]
    check_fp32_argument(sinks, "sinks", index)
    if tuple(sinks.shape) != (heads,) or (heads > 1 and sinks.stride(0) != 1):
        raise ValueError(f"sinks must have shape ({heads},), one logit per query head, contiguous (got "
                         f"{tuple(sinks.shape)}, strides {tuple(sinks.stride())})")
    if sinks.data_ptr() % 4:
        raise ValueError("sinks must be 4-byte aligned")
    return {"sinks": sinks.data_ptr()}


def sink_reference(torch, scores, sinks, seqlen_q: int, seqlen_k: int):
    return scores            # the scores themselves are unchanged; the sink is an extra logit (sink_logit)


def sink_logit(torch, sinks, scores):
    """(1, H, Sq, 1): head h's sink beside every row's scores, in their dtype."""
    return sinks.to(scores.dtype).reshape(1, -1, 1, 1).expand(1, -1, scores.shape[2], 1)


def sink_verify_value(torch, batch: int, heads: int, generator, device):
    """(heads,) fp32 logits around the size of standard normal inputs' scaled scores, some above
    every score of a row (the sink then takes most of the row's weight)."""
    return torch.randn(heads, generator=generator, device=device) * 2.0


SINK = ScoreVariant(
    "sink", "sinks",
    (float_pointer("sinks", "sink: fp32 (heads,) learned logits; head h's joins each row's softmax denominator"),),
    "learned attention sinks (gpt-oss): a per-head logit in every row's softmax denominator, a key with no value",
    sink_fill, sink_reference, sink_verify_value, unit="variants/sink.j2", extra_logit=sink_logit,
    kind_flag="takes_sinks")

SCORES: dict[str, ScoreVariant] = {s.name: s for s in (SOFTCAP, ALIBI, SINK)}


def score_values(scores, arguments: dict, scale: float, context: dict) -> dict:
    """The Params values of a call's score modifiers (`scores`, in order); each takes its argument
    from `arguments` (keyword -> value). ValueError when one is missing or given to a spec without it."""
    values: dict = {}
    names = {s.argument for s in scores}
    for keyword, value in arguments.items():
        if value is not None and keyword not in names:
            builtin = next((s.name for s in SCORES.values() if s.argument == keyword), None)
            raise ValueError(f"{keyword}= needs a spec whose `scores` list has {builtin!r}" if builtin else
                             f"{keyword}= needs a spec with expressions that read params (variant.params)")
    for s in scores:
        value = arguments.get(s.argument)
        if value is None:
            value = s.default
        if value is None:
            raise ValueError(f"this kernel applies {s.name} to every call ({s.describe}): pass {s.argument}=")
        values.update(s.fill(value, scale, context))
    return values


def reference_scores(torch, scores, modifiers, seqlen_q: int, seqlen_k: int):
    """scaled scores (B, H, Sq, Sk) with each (ScoreVariant, value) of `modifiers` applied in order."""
    for variant, value in modifiers:
        scores = variant.reference(torch, scores, value, seqlen_q, seqlen_k)
    return scores


def extra_logits(torch, modifiers, scores):
    """(B or 1, H, Sq, n) logits of valueless keys the modifiers add to every row's softmax (learned
    sinks), beside `scores` (B, H, Sq, Sk); None when they add none."""
    extra = [variant.extra_logit(torch, value, scores) for variant, value in modifiers if variant.extra_logit]
    return torch.cat(extra, dim=-1) if extra else None
