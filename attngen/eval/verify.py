"""Verify generated kernels on the GPU against torch, the way FlashAttention tests itself.

For every spec, mask variant and shape of a suite: fresh random inputs, an output poisoned with
NaN (with guard rows after seqlen_q that must stay NaN), one launch, then

- reference: attention in fp32 on the upcast inputs (explicit matmul / softmax, no TF32);
- low-precision baseline: the same attention computed by torch in the kernel's dtype;
- accept when max|out - ref| <= error_bound(max|baseline - ref|), that is ERR_FACTOR times the
  baseline's error plus ERR_FLOOR, every output element finite and written, no write past seqlen_q;
- lse (when the kernel writes it, always here): |lse - ref_lse| <= LSE_ATOL + LSE_RTOL * |ref_lse|
  against torch.logsumexp of the scaled fp32 scores.

Returns data; the CLI prints. Nothing imports torch before a function runs.
"""
from __future__ import annotations

# The cases and their judges live in cases.py, below the per-call verify modules this runner looks
# up; every name stays importable from here.
from .cases import (CaseResult, CaseShape, ERR_FACTOR, ERR_FLOOR, FULL_SUITE, LONG_KEYS, LSE_ATOL,
                    LSE_RTOL, QUICK_SUITE, ROW_ALIGN, Shape, Variant, VerifyReport, attention_torch,
                    case_seed, check_case, error_bound, exact_fp32_matmul, judge_lse, judge_rows,
                    kernel_shapes, make_inputs, poisoned_lse, poisoned_output, reference_errors,
                    score_arguments, score_modifiers, suite, variants, window_variants,
                    pycuda_agreement, MASKS, reference_scores)  # noqa: F401
from .pycuda_launch import PycudaUnavailable


class _Runner:
    """Runs cases in order. A case that raises is a failed case; after a CUDA fault that leaves
    the context unusable, every remaining case (of every kernel) is reported as not run."""

    def __init__(self, seed: int, on_case):
        self.seed = seed
        self.on_case = on_case
        self.context_lost: str | None = None

    def run(self, kernel, shapes, masks, kernel_index: int, spec_label: str | None) -> list[CaseResult]:
        label = spec_label or kernel.label
        results = []
        for variant, function, shape, index, check in kernel_cases(kernel, shapes, masks):
            if self.context_lost:
                r = CaseResult(label, function, variant, shape, passed=False,
                               problems=[f"not run: the CUDA context was lost {self.context_lost}"])
            else:
                try:
                    r = check(case_seed(self.seed, kernel_index, variant, index), label)
                except (TypeError, ValueError, PycudaUnavailable):
                    raise               # the verifier called the kernel wrongly, or cannot launch: not a result
                except Exception as exc:
                    r = CaseResult(label, function, variant, shape, passed=False,
                                   problems=[f"{type(exc).__name__}: {exc}"])
                    if not context_usable(kernel.device):
                        self.context_lost = f"after {label} {variant} {shape.label}"
            results.append(r)
            if self.on_case:
                self.on_case(r)
        return results


def kernel_cases(kernel, shapes, masks) -> list[tuple]:
    """(variant label, function, shape, index, check(seed, label) -> CaseResult) of every case of `kernel`:
    each mask variant over `shapes` (and over the varlen suite when the kernel has varlen
    functions), or the cases a kernel of another kind brings itself
    (eval.conventions, e.g. a decode kernel's per-sequence lengths)."""
    from .conventions import kernel_cases as convention_cases
    own = convention_cases(kernel)
    if own is not None:
        return own(kernel, shapes, masks)
    out = []
    for variant in variants(masks, kernel.plan.block_n):
        function = kernel.plan.entry_functions[variant.mask]
        for i, shape in enumerate(kernel_shapes(kernel.plan, shapes)):
            out.append((variant.label, function, shape, i,
                        lambda seed, label, variant=variant, shape=shape: check_case(kernel, variant, shape, seed,
                                                                                     spec_label=label)))
    if kernel.varlen_masks:
        from .varlen_verify import varlen_cases
        out += varlen_cases(kernel, shapes, masks)
    return out


def verify_kernel(kernel, shapes=None, *, masks=None, seed: int = 0, spec_label: str | None = None,
                  on_case=None) -> list[CaseResult]:
    """Every mask variant of `kernel` (or just `masks`) over `shapes` (default: the full suite).

    `kernel` is an attngen Kernel (or anything with its plan, label, masks, device, dtype and call
    signature). `on_case(result)` is called after each case.
    """
    shapes = FULL_SUITE if shapes is None else tuple(shapes)
    masks = kernel.masks if masks is None else tuple(masks)
    return _Runner(seed, on_case).run(kernel, shapes, masks, 0, spec_label)


def context_usable(device) -> bool:
    """False after a CUDA fault that left the context unusable (nothing more can run on it)."""
    import torch
    if device.type != "cuda":
        return True
    try:
        torch.cuda.synchronize(device)
        return torch.ones(1, device=device).add_(1).item() == 2.0
    except RuntimeError:
        return False


# -- specs ---------------------------------------------------------------------------------------

def load_kernels(spec_paths, *, on_compile=None, on_batch=None, jobs: int | None = None) -> list:
    """attngen.load each spec, synchronizing after every launch so a fault is reported with the case
    that caused it. Every part of every spec is compiled first, in one parallel batch (compile.
    precompile, `jobs` nvcc at once), so the loads find their cubins cached; `on_batch(batch)`
    hears of that batch (default: its summary line on stderr), `on_compile(spec_path, arch)` of
    any compile a load still does."""
    from ..compile import precompile, print_summary
    from ..runtime import bundle_of, device_arch, gpu_modules, kernel_class
    torch, _ = gpu_modules()
    bundles = [bundle_of(str(path)) for path in spec_paths]
    batch = precompile(bundles, device_arch(torch, torch.cuda.current_device()), workers=jobs)
    (on_batch or print_summary)(batch)
    kernels = []
    for path, (plan, sources, label) in zip(spec_paths, bundles):
        hook = None if on_compile is None else (lambda arch, path=path: on_compile(path, arch))
        kernels.append(kernel_class(plan).from_sources(plan, sources, label=label, on_compile=hook, synchronize=True))
    return kernels


def case_count(kernels, shapes) -> int:
    return sum(len(kernel_cases(k, tuple(shapes), k.masks)) for k in kernels)


def verify_kernels(kernels, shapes, *, suite_name: str = "custom", seed: int = 0, on_case=None) -> VerifyReport:
    import torch
    runner = _Runner(seed, on_case)
    cases = []
    for i, kernel in enumerate(kernels):
        cases += runner.run(kernel, tuple(shapes), kernel.masks, i, kernel.name)
    device = kernels[0].device if kernels else None
    name = torch.cuda.get_device_name(device) if device is not None and device.type == "cuda" else str(device)
    return VerifyReport(name, kernels[0].arch if kernels else "", torch.__version__, suite_name, cases)
