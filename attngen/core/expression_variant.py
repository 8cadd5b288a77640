"""Expression variants: a spec's `variant:` (params, a mask expression, a score expression) as one
kernel variant. The expressions are parsed and typed by core/expressions.py; this room turns them
into what the rest of attngen reads, from one parse tree each:

- the Params fields of the params (`variant_<name>`), their packing from a call's `params=` dict;
- the C++ the score hook renders (`cuda`): an environment of the block's values (b, h, lengths,
  params: a tensor param indexed by h or b is one value per block), the mask, its block classifier
  and the score, each a function of that environment;
- the torch reference `attngen verify` checks the kernel against;
- the values verify draws for the params (the spec's `variant.verify` ranges).

To the plans, runtime and verify it is one more ScoreVariant (argument `params`) beside softcap and
ALiBi: the mask rides on the score hook (the score expression, then the mask), and the spec's only
mask function is `expr` (core/variants.py EXPR), whose own visibility is every key.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .comment_text import comment_line
from .abi import AbiField, float32, float_pointer, int32, int_pointer
from .constants import LOG2E
from .expressions import (CUDA_HELPERS, classify_helpers_for, FLOAT, INT, PARAM_TYPES, Expression, derivative, parse, to_cuda,
                          param_name_problem, to_cuda_classifier, to_torch, reads_head,
                          uses_helpers)
from .variants import ScoreVariant

ARGUMENT = "params"                  # the call's keyword: {param name: value}
DEFAULT_RANGES = {INT: (0, 256), FLOAT: (0.0, 1.0)}   # what verify draws a param from without variant.verify
PARAM_PREFIX = "variant_"
BATCH_FIELD = "variant_batch"        # varlen: the sequence a block computes (b of the expressions)
SCALE_FIELD = "variant_scale"        # with a score expression: the softmax scale (`score` is the scaled score)


@dataclass(frozen=True)
class CudaPieces:
    """What the score hook renders for an expression variant (templates/lib/score.j2)."""

    env_fields: tuple[tuple[str, str, str], ...]   # (C type, member, initialiser from p and c)
    mask: str | None           # bool expression of e, q_idx, kv_idx
    classifier: str | None     # statements leaving `verdict` (1 full, 0 empty, -1 partial) from e, q_lo..k_hi
    score: str | None          # float expression of e, score, q_idx, kv_idx
    helpers: str               # the C++ helpers they call (floor % and //, the interval classifier)
    mask_text: str | None      # the expressions as written, as comment text (core/comment_text.py)
    score_text: str | None
    later_rows_see_more: bool = False   # the mask gives later query blocks more tiles (launch them first)
    expression_helpers: str = ""        # the helpers of the expressions alone (no classifier)
    mask_reads_head: bool = False       # the mask can differ between heads (h, or a per-head param)
    batch_field: str = BATCH_FIELD
    scale_field: str = SCALE_FIELD
    score_slope: str | None = None      # float expression of e, score, q_idx, kv_idx: d(score expression)/d(score)


@dataclass(frozen=True)
class ExpressionVariant:
    params: tuple[tuple[str, str], ...]         # (name, declared type), in the spec's order
    mask: Expression | None
    score: Expression | None
    ranges: tuple[tuple[str, tuple], ...] = ()  # (param, (lo, hi)) verify draws from
    varlen: bool = False                        # the spec has varlen functions (b is read per sequence)

    # -- Params ---------------------------------------------------------------------------------
    def abi_fields(self) -> tuple[AbiField, ...]:
        out = []
        for name, kind in self.params:
            scalar, by = PARAM_TYPES[kind]
            meaning = f"variant param {name} ({kind})"
            if by is None:
                out.append(int32(PARAM_PREFIX + name, meaning) if scalar == INT else float32(PARAM_PREFIX + name, meaning))
            else:
                what = f"{meaning}: one element per {'head' if by == 'h' else 'batch'}, contiguous"
                out.append(int_pointer(PARAM_PREFIX + name, what) if scalar == INT
                           else float_pointer(PARAM_PREFIX + name, what))
        if self.score is not None:
            out.append(float32(SCALE_FIELD, "score expression: the softmax scale (score is the scaled score); "
                                            "scale_log2 is log2(e)"))
        if self.varlen:
            out.append(int32(BATCH_FIELD, "varlen sequences: the sequence a block computes (b); -1: the grid's "
                                          "batch (padded calls)", default=-1))
        return tuple(out)

    def fill(self, values, scale: float, context: dict) -> dict:
        """The Params values of a call's params= dict: scalars by type, tensors checked (dtype,
        shape, device) and passed by address."""
        if not isinstance(values, dict):
            raise TypeError(f"params must be a dict of the spec's variant params "
                            f"({', '.join(n for n, _ in self.params)}); got {type(values).__name__}")
        declared = dict(self.params)
        unknown = sorted(set(values) - set(declared))
        if unknown:
            raise ValueError(f"params has {', '.join(unknown)}, which the spec's variant.params does not declare "
                             f"(it declares {', '.join(declared) or 'none'})")
        missing = [n for n in declared if n not in values]
        if missing:
            raise ValueError(f"params lacks {', '.join(missing)}: the spec's expressions read "
                             f"{', '.join(f'{n} ({k})' for n, k in self.params)}")
        out = {}
        for name, kind in self.params:
            out[PARAM_PREFIX + name] = _param_value(name, kind, values[name], context)
        if self.score is not None:
            out[SCALE_FIELD] = scale
            out["scale_log2"] = LOG2E
        return out

    # -- the torch reference ---------------------------------------------------------------------
    def reference(self, torch, scores, values, seqlen_q: int, seqlen_k: int):
        """Scaled scores (B, H, Sq, Sk) through the score expression, then -inf where the mask
        hides a key. values: the params dict (and "_first_batch": the b of scores' first batch)."""
        batch, heads = scores.shape[0], scores.shape[1]
        dev = scores.device
        first = values.get("_first_batch", 0)
        env = {"q_idx": torch.arange(seqlen_q, device=dev)[:, None],
               "kv_idx": torch.arange(seqlen_k, device=dev)[None, :],
               "b": (torch.arange(batch, device=dev) + first).view(-1, 1, 1, 1),
               "h": torch.arange(heads, device=dev).view(1, -1, 1, 1),
               "seqlen_q": seqlen_q, "seqlen_k": seqlen_k, "causal_offset": seqlen_k - seqlen_q}
        for name, kind in self.params:
            v = values[name]
            if PARAM_TYPES[kind][1] == "b" and torch.is_tensor(v):   # indexed by absolute b: pad to it
                v = torch.cat([v.new_zeros(first), v]) if first else v
            env[name] = v
        if self.score is not None:
            out = to_torch(self.score, torch, {**env, "score": scores.float()})
            scores = torch.as_tensor(out, device=dev).to(scores.dtype).expand(scores.shape)
        if self.mask is not None:
            visible = torch.as_tensor(to_torch(self.mask, torch, env), device=dev)
            scores = scores.masked_fill(~visible.expand(scores.shape), float("-inf"))
        return scores

    def select_batches(self, values: dict, batches: slice) -> dict:
        """The params of some batches (a varlen sequence's): [batch] tensors sliced, b offset."""
        out = {"_first_batch": batches.start or 0}
        for name, kind in self.params:
            v = values[name]
            out[name] = v[batches] if PARAM_TYPES[kind][1] == "b" else v
        return out

    def verify_value(self, torch, batch: int, heads: int, generator, device) -> dict:
        """Params drawn uniformly from the spec's variant.verify ranges (DEFAULT_RANGES otherwise)."""
        ranges = dict(self.ranges)
        out = {}
        for name, kind in self.params:
            scalar, by = PARAM_TYPES[kind]
            lo, hi = ranges.get(name, DEFAULT_RANGES[scalar])
            n = 1 if by is None else heads if by == "h" else batch
            if scalar == INT:
                t = torch.randint(int(lo), int(hi) + 1, (n,), generator=generator, device=device, dtype=torch.int32)
            else:
                t = torch.rand(n, generator=generator, device=device) * (hi - lo) + lo
            out[name] = (int(t.item()) if scalar == INT else float(t.item())) if by is None else t
        return out

    # -- CUDA ------------------------------------------------------------------------------------
    def cuda(self, block_m: int, block_n: int) -> CudaPieces:
        def spell(name: str) -> str:
            return name if name in ("q_idx", "kv_idx", "score") else f"e.{name}"

        env = [("int", "b", "block_b(p, c)"), ("int", "h", "c.head"), ("int", "seqlen_q", "p.seqlen_q"),
               ("int", "seqlen_k", "p.seqlen_k"), ("int", "causal_offset", "p.seqlen_k - p.seqlen_q")]
        for name, kind in self.params:
            scalar, by = PARAM_TYPES[kind]
            ctype = "int" if scalar == INT else "float"
            field_ = f"p.{PARAM_PREFIX}{name}"
            env.append((ctype, name, field_ if by is None else f"{field_}[{'c.head' if by == 'h' else 'e.b'}]"))
        index = lambda name, by: f"e.{name}"     # a tensor param at this block's h or b is one env member
        mask = to_cuda(self.mask, spell, index) if self.mask is not None else None
        classifier = (to_cuda_classifier(self.mask, spell, index) if self.mask is not None else None)
        score = to_cuda(self.score, spell, index) if self.score is not None else None
        slope = to_cuda(derivative(self.score), spell, index) if self.score is not None else None
        own = CUDA_HELPERS if any(uses_helpers(x) for x in (self.mask, self.score) if x is not None) else ""
        helpers = own + (classify_helpers_for(classifier) if classifier is not None else "")
        return CudaPieces(tuple(env), mask, classifier, score, helpers.rstrip("\n"),
                          comment_line(self.mask.text) if self.mask is not None else None,
                          comment_line(self.score.text) if self.score is not None else None,
                          later_rows_see_more(self, block_m, block_n), expression_helpers=own.rstrip("\n"),
                          mask_reads_head=self.mask is not None and reads_head(self.mask), score_slope=slope)

    def describe(self) -> str:
        parts = []
        if self.score is not None:
            parts.append(f"score {self.score.text!r}")
        if self.mask is not None:
            parts.append(f"mask {self.mask.text!r}")
        declared = ", ".join(f"{n}: {k}" for n, k in self.params) or "none"
        return f"expressions: {'; '.join(parts)} (params {declared}; `score` is the scaled score)"

    def explain_lines(self, block_m: int, block_n: int, backward: bool = False) -> list[str]:
        """explain's lines on the expressions: the block classification rule and, for a mask, a
        worked example of its cost (sample_bounds). backward: the kernels walk query blocks per key
        block and take the score expression's derivative."""
        if self.mask is None:
            return [f"score expression: {self.score.text} (scaled score in, softmax scale log2(e) after)"
                    + ("; dS takes its derivative by score" if backward else "")]
        if backward:
            lines = [f"block classification: interval arithmetic over each ({block_m}-row query block, {block_n}-key "
                     f"block) pair with the call's values, in the kernel: a key block first classifies every query "
                     f"block (a lane per block) and walks from the first to the last non-empty one (deterministic "
                     f"mode: all of them); a pair not found wholly visible is masked key by key by the expression"]
        else:
            lines = [f"block classification: interval arithmetic over each ({block_m}-row query block, {block_n}-key "
                     f"tile) pair with the call's values, in the kernel, one pass per block (a lane per tile): tiles "
                     f"before the first and after the last non-empty one are never loaded, a contiguous run of full "
                     f"tiles is not masked, every other tile is masked key by key by the expression"]
        example = sample_bounds(self, block_m, block_n)
        if example:
            lines.append("  e.g. " + example)
        return lines

    def as_score_variant(self) -> ScoreVariant:
        return ScoreVariant("expr", ARGUMENT, self.abi_fields(), self.describe(), self.fill,
                            self.reference, self.verify_value, select_batches=self.select_batches,
                            default=None if self.params else {})


def _param_value(name: str, kind: str, value, context: dict):
    scalar, by = PARAM_TYPES[kind]
    if by is None:
        if scalar == INT:
            if isinstance(value, bool) or not isinstance(value, int) or not -2 ** 31 <= value < 2 ** 31:
                raise ValueError(f"params[{name!r}] is an int param: pass a 32-bit int (got {value!r})")
            return int(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"params[{name!r}] is a float param: pass a finite number (got {value!r})")
        return float(value)
    import torch
    n = context["heads"] if by == "h" else context["batch"]
    what = "heads" if by == "h" else "batch"
    dtype = torch.int32 if scalar == INT else torch.float32
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"params[{name!r}] is {kind}: pass a torch.Tensor of {n} {dtype} ({what}), got "
                        f"{type(value).__name__}")
    if value.dtype != dtype:
        raise TypeError(f"params[{name!r}] must be {dtype} (got {value.dtype})")
    if value.get_device() != context["device"]:
        raise ValueError(f"params[{name!r}] is on {value.device} but q is on cuda:{context['device']}")
    if n is not None and (tuple(value.shape) != (n,) or value.stride(0) != 1):
        raise ValueError(f"params[{name!r}] must be a contiguous ({n},) tensor, one element per {what[:-1] if by == 'h' else 'sequence'} "
                         f"(got shape {tuple(value.shape)})")
    return value.data_ptr()


def expression_variant(spec_variant, *, varlen: bool = False) -> ExpressionVariant | None:
    """The parsed variant of a spec's `variant:` key (None without one). ExpressionError (with the
    column) for an expression outside the grammar or ill-typed; the spec's rule reports its key."""
    if spec_variant is None:
        return None
    params = dict(spec_variant.params)
    mask = parse(spec_variant.mask, params) if spec_variant.mask is not None else None
    score = parse(spec_variant.score, params, score=True) if spec_variant.score is not None else None
    ranges = tuple((k, tuple(v)) for k, v in spec_variant.verify.items())
    return ExpressionVariant(tuple(params.items()), mask, score, ranges, varlen)


# Params whose Params field (variant_<name>) would be one attngen adds itself.
INTERNAL_NAMES = {f[len(PARAM_PREFIX):]: f for f in (SCALE_FIELD, BATCH_FIELD)}


def check_param_names(spec_variant):
    """(key, message) for the first variant.params name that cannot be a C++ member or Params field."""
    for name in spec_variant.params:
        key = f"variant.params.{name}" if isinstance(name, str) and name.isidentifier() else "variant.params"
        problem = param_name_problem(name)
        if problem is None and name in INTERNAL_NAMES:
            problem = (f"param name {name!r} would be the kernel's own Params field {INTERNAL_NAMES[name]}; "
                       f"rename it (e.g. {name}_value)")
        if problem:
            return key, problem
    return None


def check_ranges(spec_variant) -> tuple[str, str] | None:
    """(key, message) for a variant.verify entry that names no param or is not [lo, hi]."""
    declared = dict(spec_variant.params)
    for name, pair in spec_variant.verify.items():
        key = f"variant.verify.{name}"
        if name not in declared:
            return key, f"{name} is not a declared param (variant.params has {', '.join(declared) or 'none'})"
        if len(pair) != 2 or pair[0] > pair[1]:
            return key, f"give [lo, hi] with lo <= hi (got {pair})"
        if PARAM_TYPES[declared[name]][0] == INT and any(isinstance(x, float) for x in pair):
            return key, f"{name} is an int param: give int bounds (got {pair})"
    return None


def sample_env(variant: ExpressionVariant, seqlen: int) -> dict:
    """Ranges for classify on a square seqlen x seqlen problem: each scalar param at the middle of
    its verify range, a tensor param over its whole range."""
    ranges = dict(variant.ranges)
    env = {"b": (0, 0), "h": (0, 0), "seqlen_q": (seqlen, seqlen), "seqlen_k": (seqlen, seqlen),
           "causal_offset": (0, 0)}
    for name, kind in variant.params:
        scalar, by = PARAM_TYPES[kind]
        lo, hi = ranges.get(name, DEFAULT_RANGES[scalar])
        mid = (lo + hi) // 2 if scalar == INT else (lo + hi) / 2
        env[name] = (mid, mid) if by is None else (lo, hi)
    return env


def sample_classes(variant: ExpressionVariant, block_m: int, block_n: int, seqlen: int = 4096) -> list[list[str]]:
    """classify's verdict of every (query block, key tile) pair of the sample problem (sample_env)."""
    from .expressions import classify
    env = sample_env(variant, seqlen)
    return [[classify(variant.mask, (m0, m0 + block_m - 1), (n0, n0 + block_n - 1), env)
             for n0 in range(0, seqlen, block_n)] for m0 in range(0, seqlen, block_m)]


def later_rows_see_more(variant: ExpressionVariant | None, block_m: int, block_n: int) -> bool:
    """Whether later query blocks visit more tiles under the mask, on the sample problem: the kernels
    then start the last (longest) blocks first, as they do for causal. Only the launch order
    depends on it."""
    if variant is None or variant.mask is None:
        return False
    from .expressions import EMPTY
    counts = [sum(c != EMPTY for c in row) for row in sample_classes(variant, block_m, block_n)]
    return all(a <= b for a, b in zip(counts, counts[1:])) and counts[-1] > counts[0]


def sample_bounds(variant: ExpressionVariant, block_m: int, block_n: int, seqlen: int = 4096) -> str:
    """A worked example of the classification for explain: how many of the sample problem's
    (query block, key tile) pairs are empty, full and partial (sample_env)."""
    if variant.mask is None:
        return ""
    from .expressions import EMPTY, FULL
    env = sample_env(variant, seqlen)
    counts = {EMPTY: 0, FULL: 0, "partial": 0}
    for row in sample_classes(variant, block_m, block_n, seqlen):
        for c in row:
            counts[c] += 1
    total = sum(counts.values())
    given = ", ".join(f"{n}={env[n][0]}" for n, k in variant.params if PARAM_TYPES[k][1] is None)
    return (f"at {seqlen}x{seqlen}{' with ' + given if given else ''}: {counts[EMPTY]} of {total} block pairs empty "
            f"(skipped), {counts[FULL]} full, {counts['partial']} partial: it visits {(total - counts[EMPTY]) / total:.0%} "
            f"of the unmasked kernel's tiles")
