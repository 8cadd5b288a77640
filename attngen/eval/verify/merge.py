"""Merge verification: partial results of attention over disjoint key subsets (each part's fp32 output
rounded to the parts' dtype, and its LSE), some rows of some parts seeing no key (LSE -inf, output NaN:
a part of weight 0 must not be read), some rows seeing no key in any part, merged into a NaN-poisoned
output. The error rule is `attngen verify`'s: max|out - ref| <= 2 x the error of torch's own merge in
the output's dtype + a floor, against the merge of the same parts in float64; LSE -inf exactly where
no part sees a key, within LSE_ATOL + LSE_RTOL |ref| elsewhere."""
from __future__ import annotations

from dataclasses import dataclass

from ...core.merge_plan import FORMS, FP32, MASK
from .cases import FULL_SUITE, CaseResult, judge_rows
from .pycuda_launch import pycuda_agreement

QUICK_CASES = 4   # the first cases of merge_cases for `attngen verify --quick`


@dataclass(frozen=True)
class MergeCase:
    batch: int
    heads: int
    seqlen: int
    parts: int
    keys: int = 96                    # keys split over the parts
    layout: str = "bhsd"
    form: str = MASK                  # the function: parts' and output's element types (core.merge_plan.FORMS)
    strided: bool = False             # every part a view into a wider buffer (its own strides)
    empty_rows: bool = True           # rows where some parts, and rows where every part, see no key

    @property
    def variant(self) -> str:
        return f"merge:{self.form}"

    @property
    def label(self) -> str:
        return (f"{self.batch}x{self.heads}x{self.seqlen} parts={self.parts} keys={self.keys} {self.layout} "
                f"{self.form}" + (" strided" if self.strided else "") + (" empty-rows" if self.empty_rows else ""))


def merge_cases() -> tuple[MergeCase, ...]:
    """2, 3, 4, 8 (one launch) and 11 and 20 parts (rounds through fp32), both layouts, strided parts,
    every element form, a single row and a tail of rows that does not fill a block."""
    forms = [key for key, _, _ in FORMS]
    out = [MergeCase(2, 4, 37, 2), MergeCase(1, 8, 64, 4, layout="bshd", form=forms[1]),
           MergeCase(2, 3, 33, 3, strided=True, form=forms[2]), MergeCase(2, 4, 50, 4, layout="bshd", form=forms[3],
                                                                          strided=True)]
    for form in forms:
        out += [MergeCase(1, 2, 1, 2, keys=4, form=form), MergeCase(3, 5, 17, 8, keys=64, form=form, layout="bshd"),
                MergeCase(2, 2, 40, 11, keys=150, form=form, strided=True), MergeCase(1, 3, 21, 20, keys=80, form=form),
                MergeCase(2, 4, 64, 2, keys=256, form=form, empty_rows=False)]
    return tuple(out)


def partial_results(torch, case: MergeCase, head_dim: int, parts_dtype, device, generator):
    """(outs, lses, ref_out, ref_lse) of a case, outs in (B, H, S, D) order: random q, k, v; the keys
    dealt to the parts at random; part i's attention over its keys in float64, rounded to `parts_dtype`;
    some (row, part) pairs masked to no key (LSE -inf, output NaN), and with empty_rows a few rows with no
    key in any part. The reference merges the rounded parts in float64."""
    b, h, s, d, n = case.batch, case.heads, case.seqlen, head_dim, case.parts
    f64 = torch.float64
    q = torch.randn((b, h, s, d), generator=generator, device=device, dtype=f64)
    k = torch.randn((b, h, case.keys, d), generator=generator, device=device, dtype=f64)
    v = torch.randn((b, h, case.keys, d), generator=generator, device=device, dtype=f64)
    owner = torch.randint(0, n, (case.keys,), generator=generator, device=device)
    scores = q @ k.transpose(-1, -2) * d ** -0.5                                   # (b, h, s, keys)
    sees = owner[None, :] == torch.arange(n, device=device)[:, None]               # (n, keys)
    visible = sees[:, None, None, None, :].expand(n, b, h, s, case.keys).clone()
    if case.empty_rows:
        blank = torch.rand((n, b, h, s), generator=generator, device=device) < 0.25   # a part sees no key there
        visible &= ~blank[..., None]
        visible[:, :, :, :: 7] = False                                             # every part: no key at all
    masked = torch.where(visible, scores[None], torch.tensor(float("-inf"), dtype=f64, device=device))
    lse = torch.logsumexp(masked, dim=-1)                                          # (n, b, h, s), -inf: no key
    p = torch.exp(masked - lse[..., None]).nan_to_num(0.0)
    outs = (p @ v[None]).to(parts_dtype)                                           # rounded as a part keeps it
    none = torch.isneginf(lse)
    outs[none] = float("nan")                                                      # never read: weight 0
    lses = lse.float()
    # the reference: the rounded parts merged in float64
    total = torch.logsumexp(lses.double(), dim=0)
    weight = torch.exp(lses.double() - total[None]).nan_to_num(0.0)
    ref = (weight[..., None] * outs.double().nan_to_num(0.0)).sum(0)
    return outs, lses, ref, total, weight


def check_merge_case(kernel, case: MergeCase, seed: int = 0, label: str | None = None) -> CaseResult:
    """Run one case on a poisoned output and compare it with the float64 merge of the same parts."""
    import torch
    result = CaseResult(label or kernel.label, kernel.entry[case.form], case.variant, case, passed=False)
    g = torch.Generator(device=kernel.device).manual_seed(seed)
    form = next(f for f in FORMS if f[0] == case.form)
    parts_dtype = torch.float32 if form[1] == FP32 else kernel.dtype
    out_dtype = torch.float32 if form[2] == FP32 else kernel.dtype
    d, dev = kernel.plan.head_dim, kernel.device
    outs, lses, ref, ref_lse, weight = partial_results(torch, case, d, parts_dtype, dev, g)
    bshd = case.layout == "bshd"

    def laid(t):   # a part in the case's layout, in a wider buffer when strided
        t = t.transpose(1, 2) if bshd else t
        if not case.strided:
            return t.contiguous()
        wide = torch.full(t.shape[:-1] + (t.shape[-1] + 16,), float("nan"), dtype=t.dtype, device=dev)
        wide[..., 8:8 + t.shape[-1]] = t
        return wide[..., 8:8 + t.shape[-1]]
    parts = [laid(outs[i]) for i in range(case.parts)]
    part_lses = [lses[i] if not case.strided else
                 torch.full((case.batch, case.heads + 1, case.seqlen), float("nan"), device=dev)[:, 1:].copy_(lses[i])
                 for i in range(case.parts)]
    shape = parts[0].shape
    out = torch.full(shape, float("nan"), dtype=out_dtype, device=dev)
    lse = torch.full((case.batch, case.heads, case.seqlen), float("nan"), device=dev)

    def launch(o, l_):
        return kernel(parts, part_lses, layout=case.layout, out_dtype=out_dtype, out=o, lse_out=l_)
    o, lse = launch(out, lse)
    pycuda_agreement(result, kernel, launch, ("o", "lse"), (o, lse))
    # torch's merge in the output's dtype: its error sets the bound, as torch's attention does for the forward
    low = (weight.to(out_dtype)[..., None] * outs.nan_to_num(0.0).to(out_dtype)).sum(0).float()
    view = o.transpose(1, 2) if bshd else o
    judge_rows(result, torch, view, ref.float(), low, lse, ref_lse.float(), kernel.plan.spec.dtype
               if out_dtype != torch.float32 else "fp32")
    return result


def verify_cases(kernel, shapes, masks) -> list[tuple]:
    """The merge cases of `attngen verify` (the forward shapes only choose quick or full)."""
    cases = merge_cases()
    if len(tuple(shapes)) < len(FULL_SUITE):
        cases = cases[:QUICK_CASES]
    return [(case.variant, kernel.entry[case.form], case, i,
             lambda seed, label, case=case: check_merge_case(kernel, case, seed, label))
            for i, case in enumerate(cases) if MASK in masks]


__all__ = ["MergeCase", "check_merge_case", "merge_cases", "partial_results", "verify_cases"]
