"""Varlen verification: the error rule of `attngen verify` (max|out - ref| <= 2 x
the error of torch's own low-precision attention + a floor, against an fp32 reference computed
sequence by sequence), on a poisoned output with guard rows past the last sequence."""
from __future__ import annotations

from dataclasses import dataclass

from ...core.varlen_plan import varlen_key
from ...runtime.calls.varlen import cu_seqlens
from .pycuda_launch import pycuda_agreement
from .cases import (FULL_SUITE, ROW_ALIGN, CaseResult, Variant, attention_torch, exact_fp32_matmul, judge_rows,
                     read_back, score_arguments, score_modifiers, variants)

QUICK_CASES = 2         # the first cases for `attngen verify --quick`
SEED_OFFSET = 500       # case seeds apart from the padded cases' shape indices


@dataclass(frozen=True)
class VarlenCase:
    heads: int
    kv_heads: int
    lens_q: tuple[int, ...]
    lens_k: tuple[int, ...] | None = None   # None: as lens_q (self-attention prefill)
    qkv: bool = False                       # q, k, v are strided slices of one (total, 3, heads, d) tensor
    give_max: bool = False                  # pass max_seqlen_q (else the call reads it from cu_seqlens_q)

    def __post_init__(self):
        if self.lens_k is not None and len(self.lens_k) != len(self.lens_q):
            raise ValueError("lens_q and lens_k must list the same sequences")
        if self.qkv and (self.heads != self.kv_heads or self.lens_k is not None):
            raise ValueError("a qkv case needs heads == kv_heads and lens_k = lens_q")

    @property
    def keys(self) -> tuple[int, ...]:
        return self.lens_q if self.lens_k is None else self.lens_k

    @property
    def layout(self) -> str:
        """thd: (total_rows, heads, head_dim), every sequence's rows back to back (FlashAttention's name)."""
        return "thd"

    @property
    def label(self) -> str:
        heads = f"{self.heads}" if self.heads == self.kv_heads else f"{self.heads}/{self.kv_heads}"
        lens = ",".join(map(str, self.lens_q)) + ("" if self.lens_k is None else " k " + ",".join(map(str, self.lens_k)))
        return f"varlen H{heads} q[{lens}]" + (" qkv" if self.qkv else "")


def varlen_suite(block_m: int) -> tuple[VarlenCase, ...]:
    """Lengths of 1, a query block +- 1, an empty sequence, mixed lengths in one batch; queries
    fewer and more than keys (bottom-right rows that see nothing); GQA and MQA; strided qkv slices."""
    m = block_m
    return (
        VarlenCase(4, 4, (1, m - 1, m, m + 1, 300)),
        VarlenCase(8, 2, (5, 100, 1, 77), (300, 64, 0, 77), give_max=True),   # a sequence without keys
        VarlenCase(2, 2, (17, 0, 333), qkv=True),
        VarlenCase(6, 1, (1000, 3, 513), (1023, 1, 2000)),
        VarlenCase(4, 4, (2 * m + 5,) + (1,) * 7 + (3 * m,)),
        VarlenCase(16, 16, (1, 9, 60, 128, 256, 511, 700, 1024, 1, 2047, 33, 4096, 5, 64, 900, 1500)),
    )


def reference(torch, q, k, v, lens_q, lens_k, variant: Variant, scale: float, plan=None, scores: dict | None = None):
    """(fp32 reference O, its LSE (heads, total_q), torch's low-precision O), each sequence against
    its own keys, in varlen (total, heads, d) form; `scores` are the call's score-modifier
    arguments of `plan` (ALiBi slopes per sequence)."""
    outs, lses, lows = [], [], []
    q0 = k0 = 0
    for b, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        qs, ks, vs = (t.transpose(0, 1)[None] for t in (q[q0:q0 + lq], k[k0:k0 + lk], v[k0:k0 + lk]))
        mods = score_modifiers(plan, scores, slice(b, b + 1)) if plan is not None else ()
        mask = dict(mask=variant.mask, alignment=variant.alignment, window=variant.visible_window, modifiers=mods)
        with exact_fp32_matmul(torch):
            ref, lse = attention_torch(qs.float(), ks.float(), vs.float(), scale=scale, **mask)
        low, _ = attention_torch(qs, ks, vs, scale=scale, **mask)
        outs.append(ref[0].transpose(0, 1)), lses.append(lse[0]), lows.append(low[0].transpose(0, 1).float())
        q0, k0 = q0 + lq, k0 + lk
    return torch.cat(outs), torch.cat(lses, dim=1), torch.cat(lows)


def varlen_case_inputs(torch, kernel, case: VarlenCase, seed: int):
    """The case's random q, k, v (total, heads, head_dim; v head_dim_v where the spec has it) in the
    kernel's dtype (as slices of one qkv tensor when case.qkv: v its first head_dim_v columns there),
    after the generator and the draw they came from, for the case's other inputs."""
    g = torch.Generator(device=kernel.device).manual_seed(seed)
    d, dv, tq, tk = kernel.plan.head_dim, kernel.plan.v_dim, sum(case.lens_q), sum(case.keys)

    def randn(*size):
        return torch.randn(size, generator=g, device=kernel.device, dtype=torch.float32).to(kernel.dtype)

    if case.qkv:
        q, k, v = randn(tq, 3, case.heads, max(d, dv)).unbind(1)
        q, k, v = q[..., :d], k[..., :d], v[..., :dv]
    else:
        q, k, v = randn(tq, case.heads, d), randn(tk, case.kv_heads, d), randn(tk, case.kv_heads, dv)
    return g, randn, q, k, v


def check_varlen_case(kernel, variant: Variant, case: VarlenCase, seed: int, label: str | None = None) -> CaseResult:
    """Run one varlen case with poisoned outputs and compare every sequence with its reference."""
    import torch
    result = CaseResult(label or kernel.label, kernel.entry[varlen_key(variant.mask)], variant.label + " varlen",
                        case, passed=False)
    d, dtype, dev = kernel.plan.head_dim, kernel.dtype, kernel.device
    tq = sum(case.lens_q)
    g, _, q, k, v = varlen_case_inputs(torch, kernel, case, seed)
    guard = -(-kernel.plan.block_m // ROW_ALIGN) * ROW_ALIGN
    out_buf = torch.full((tq + guard, case.heads, kernel.plan.v_dim), float("nan"), dtype=dtype, device=dev)
    lse_buf = torch.full((case.heads * tq + guard,), float("nan"), dtype=torch.float32, device=dev)
    out, lse = out_buf[:tq], lse_buf[:case.heads * tq].view(case.heads, tq)

    scores = score_arguments(kernel.plan, len(case.lens_q), case.heads, g, dev)
    cu_q, cu_k = cu_seqlens(torch, case.lens_q, dev), cu_seqlens(torch, case.keys, dev)

    def launch(o, lse_out):
        kernel.varlen(q, k, v, cu_q, cu_k, **variant.call_arguments(), **scores, scale=d ** -0.5, out=o,
                      lse_out=lse_out, max_seqlen_q=max(case.lens_q) if case.give_max else None)
    launch(out, lse)
    pycuda_agreement(result, kernel, launch, ("o", "lse"), (out, lse))
    ref, ref_lse, low = reference(torch, q, k, v, case.lens_q, case.keys, variant, d ** -0.5, kernel.plan, scores)
    past = read_back(torch, {"o": (~torch.isnan(out_buf[tq:])).any(),
                             "lse": (~torch.isnan(lse_buf[case.heads * tq:])).any()})
    if past["o"]:
        result.problems.append("o written past the last sequence's rows")
    if past["lse"]:
        result.problems.append("lse written past its (heads, total_q) end")
    judge_rows(result, torch, out, ref, low, lse, ref_lse, kernel.plan.spec.dtype)
    return result


def varlen_cases(kernel, shapes, masks) -> list[tuple]:
    """`attngen verify`'s varlen cases of a kernel with varlen functions: every (mask,
    alignment) over the varlen suite (its first cases when the padded shapes are the quick suite)."""
    cases = varlen_suite(kernel.plan.block_m)
    if len(tuple(shapes)) < len(FULL_SUITE):
        cases = cases[:QUICK_CASES]
    out = []
    for variant in variants([m for m in masks if m in kernel.varlen_masks], kernel.plan.block_n):
        for i, case in enumerate(cases):
            out.append((variant.label + " varlen", kernel.entry[varlen_key(variant.mask)], case, SEED_OFFSET + i,
                        lambda seed, label, variant=variant, case=case: check_varlen_case(kernel, variant, case,
                                                                                          seed, label)))
    return out
