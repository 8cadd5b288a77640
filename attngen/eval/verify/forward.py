"""The forward convention's verify cases: every mask variant of a kernel over the padded shapes of a
suite (and the long-keys shapes where its mask is an expression), then its varlen cases (varlen.py)
where it has varlen functions. A padded case: fresh inputs in the shape's layout, an output and LSE
poisoned with NaN with guard rows after seqlen_q, one launch, then the judges of cases.py."""
from __future__ import annotations

from .cases import (ERR_FACTOR, ERR_FLOOR, ROW_ALIGN, CaseResult, Shape, Variant, error_bound, judge_lse_values,
                    kernel_shapes, lse_values, make_inputs, poisoned_lse, poisoned_output, read_back,
                    reference_error_values, score_arguments, score_modifiers, variants)
from .pycuda_launch import pycuda_agreement
from .varlen import varlen_cases


def verify_cases(kernel, shapes, masks) -> list[tuple]:
    """(variant label, function, shape, index, check(seed, label) -> CaseResult) of every case of
    `kernel`: each mask variant over `shapes` (where it has padded functions: not `varlen: only`), then
    the varlen cases where it has varlen functions."""
    out = []
    padded = [m for m in masks if m in kernel.plan.entry_functions]
    for variant in variants(padded, kernel.plan.block_n):
        function = kernel.plan.entry_functions[variant.mask]
        for i, shape in enumerate(kernel_shapes(kernel.plan, shapes)):
            out.append((variant.label, function, shape, i,
                        lambda seed, label, variant=variant, shape=shape: check_case(kernel, variant, shape, seed,
                                                                                     spec_label=label)))
    if kernel.varlen_masks:
        out += varlen_cases(kernel, shapes, masks)
    return out


def check_case(kernel, variant: Variant, shape: Shape, seed: int, *, spec_label: str | None = None) -> CaseResult:
    """Run one (variant, shape) case of `kernel` and compare it with torch."""
    import torch
    from ...runtime import default_scale, to_bhsd
    plan = kernel.plan
    function = plan.entry_functions[variant.mask]
    result = CaseResult(spec_label or kernel.label, function, variant.label, shape, passed=False)
    device, dtype, d = kernel.device, kernel.dtype, plan.head_dim
    scale = default_scale(d)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    q, k, v = make_inputs(shape, d, dtype, device, gen, v_dim=plan.v_dim)
    guard_rows = -(-plan.block_m // ROW_ALIGN) * ROW_ALIGN
    o, o_guard = poisoned_output(shape, plan.v_dim, guard_rows, dtype, device)
    lse, lse_guard = poisoned_lse(shape, guard_rows, device)

    scores = score_arguments(plan, shape.batch, shape.heads, gen, device)

    def launch(out, lse_out):
        kernel(q, k, v, **variant.call_arguments(), **scores, scale=scale, layout=shape.layout, out=out,
               lse_out=lse_out)
    launch(o, lse)     # (verify's kernels synchronize after each call: a fault is reported with its launch)
    if device.type == "cuda":
        pycuda_agreement(result, kernel, launch, ("o", "lse"), (o, lse))

    qb, kb, vb, ob = (to_bhsd(t, shape.layout) for t in (q, k, v, o))
    err, low, ref_lse = reference_error_values(
        torch, qb, kb, vb, ob, scale=scale, mask=variant.mask, alignment=variant.alignment,
        window=variant.visible_window, modifiers=score_modifiers(plan, scores))
    values = read_back(torch, {"err": err, "low": low, "bad": (~torch.isfinite(ob)).sum(),
                               "stray": (~torch.isnan(o_guard)).sum(), **lse_values(torch, lse, ref_lse, lse_guard)})
    result.max_err, result.lowprec_err = values["err"], values["low"]
    problems = result.problems
    bad = int(values["bad"])
    if bad:
        problems.append(f"{bad} of {ob.numel()} output elements are NaN/inf (unwritten or overflowed)")
    stray = int(values["stray"])
    if stray:
        problems.append(f"{stray} elements written past seqlen_q in o")
    result.bound = error_bound(result.lowprec_err)
    if not bad and not result.max_err <= result.bound:
        problems.append(f"max error {result.max_err:.3g} exceeds {result.bound:.3g} "
                        f"({ERR_FACTOR:g} x torch {plan.spec.dtype} error {result.lowprec_err:.3g} + {ERR_FLOOR:g})")
    judge_lse_values(result, values, lse.numel())
    result.passed = not problems
    return result
