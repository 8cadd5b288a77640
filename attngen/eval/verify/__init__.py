"""Verify generated kernels on the GPU against torch, the way FlashAttention tests itself.

For every spec, mask variant and shape of a suite: fresh random inputs, an output poisoned with
NaN (with guard rows after seqlen_q that must stay NaN), one launch, then

- reference: attention in fp32 on the upcast inputs (explicit matmul / softmax, no TF32);
- low-precision baseline: the same attention computed by torch in the kernel's dtype;
- accept when max|out - ref| <= error_bound(max|baseline - ref|), that is ERR_FACTOR times the
  baseline's error plus ERR_FLOOR, every output element finite and written, no write past seqlen_q;
- lse (when the kernel writes it, always here): |lse - ref_lse| <= LSE_ATOL + LSE_RTOL * |ref_lse|
  against torch.logsumexp of the scaled fp32 scores.

A room per call convention: each builds its own cases (forward.py with varlen.py, decode.py,
backward.py, forward_fp8.py, merge.py) on the shared judges of cases.py; rooms.py looks a kernel's
convention up in core.calls.CALLS and hands its cases to the runner (runner.py), which names none.
Returns data; the CLI prints. Nothing imports torch before a function runs.
"""
from __future__ import annotations

from .rooms import CASES, convention_of, kernel_cases
from .runner import Runner, context_usable, load_kernels, verify_report

# Re-exported: tests, docs and `attngen sweep` import the cases, judges and suites from
# attngen.eval.verify, as they did before verify became a package.
from .cases import (CaseResult, CaseShape, ERR_FACTOR, ERR_FLOOR, FULL_SUITE, LONG_KEYS, LSE_ATOL,
                    LSE_RTOL, QUICK_SUITE, ROW_ALIGN, Shape, Variant, VerifyReport, attention_torch, case_seed,
                    error_bound, exact_fp32_matmul, judge_lse, judge_rows, kernel_shapes, make_inputs,
                    poisoned_lse, poisoned_output, reference_errors, score_arguments, score_modifiers, suite,
                    variants, window_variants)
from .forward import check_case
from .parallel import default_jobs, verify_parallel, verify_streaming
from .pycuda_launch import PycudaUnavailable


def verify_kernel(kernel, shapes=None, *, masks=None, seed: int = 0, spec_label: str | None = None,
                  on_case=None) -> list[CaseResult]:
    """Every mask variant of `kernel` (or just `masks`) over `shapes` (default: the full suite).

    `kernel` is an attngen Kernel (or anything with its plan, label, masks, device, dtype and call
    signature). `on_case(result)` is called after each case.
    """
    shapes = FULL_SUITE if shapes is None else tuple(shapes)
    masks = kernel.masks if masks is None else tuple(masks)
    return Runner(seed, on_case).run(kernel, kernel_cases(kernel, shapes, masks), 0, spec_label)


def case_count(kernels, shapes) -> int:
    return sum(len(kernel_cases(k, tuple(shapes), k.masks)) for k in kernels)


def verify_kernels(kernels, shapes, *, suite_name: str = "custom", seed: int = 0, on_case=None) -> VerifyReport:
    """Every case of every kernel, one runner for all (a lost CUDA context stops the rest)."""
    runner = Runner(seed, on_case)
    cases = []
    for i, kernel in enumerate(kernels):
        cases += runner.run(kernel, kernel_cases(kernel, tuple(shapes), kernel.masks), i, kernel.name)
    return verify_report(kernels, cases, suite_name)


__all__ = ["CASES", "ERR_FACTOR", "ERR_FLOOR", "FULL_SUITE", "LONG_KEYS", "LSE_ATOL", "LSE_RTOL", "QUICK_SUITE",
           "ROW_ALIGN", "CaseResult", "CaseShape", "PycudaUnavailable", "Runner", "Shape", "Variant", "VerifyReport",
           "attention_torch", "case_count", "case_seed", "check_case", "context_usable", "convention_of", "default_jobs",
           "error_bound", "exact_fp32_matmul", "judge_lse", "judge_rows", "kernel_cases", "kernel_shapes",
           "load_kernels", "make_inputs", "poisoned_lse", "poisoned_output", "reference_errors", "score_arguments",
           "score_modifiers", "suite", "variants", "verify_kernel", "verify_kernels", "verify_parallel", "verify_streaming",
           "window_variants"]
