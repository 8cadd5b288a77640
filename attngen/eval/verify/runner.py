"""The verify runner: runs the cases it is handed (each call's verify module builds them) and
reports every one, a failed launch included; loads the kernels it runs. It names no call convention."""
from __future__ import annotations

import time

from .cases import CaseResult, VerifyReport, case_seed
from .pycuda_launch import PycudaUnavailable
from .rooms import convention_of


class Runner:
    """Runs the cases it is handed, in order. A case that raises is a failed case; after a CUDA fault
    that leaves the context unusable, every remaining case (of every kernel) is reported as not run.
    `on_out_of_memory(kernel_index, position, placeholder)`: where given (a worker beside others on one GPU),
    a case that runs out of GPU memory is handed to it instead of failing, with the CaseResult that stands
    in for it until it runs again alone (parallel.py); on_case does not hear of it."""

    def __init__(self, seed: int, on_case, on_out_of_memory=None):
        self.seed = seed
        self.on_case = on_case
        self.on_out_of_memory = on_out_of_memory
        self.context_lost: str | None = None

    def run(self, kernel, cases, kernel_index: int, spec_label: str | None) -> list[CaseResult]:
        """`cases`: (variant label, function, shape, index, check(seed, label) -> CaseResult) of
        `kernel`, as its call's verify module builds them."""
        label = spec_label or kernel.label
        call = convention_of(kernel)
        results = []
        for position, (variant, function, shape, index, check) in enumerate(cases):
            start = time.perf_counter()
            ran = not self.context_lost
            if not ran:
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
                    if self.on_out_of_memory is not None and out_of_memory(exc):
                        release_cached_memory()
                        r.problems = [f"not run yet: {OUT_OF_MEMORY_BESIDE_OTHERS}"]
                        results.append(r)
                        self.on_out_of_memory(kernel_index, position, r)
                        continue
                    if not context_usable(kernel.device):
                        self.context_lost = f"after {label} {variant} {shape.label}"
            r.seconds = round(time.perf_counter() - start, 4)
            if ran:
                r.call = call           # (a case that did not run has none: time_by_call leaves it out)
            results.append(r)
            if self.on_case:
                self.on_case(r)
        return results


OUT_OF_MEMORY_BESIDE_OTHERS = "it ran out of GPU memory beside the other verify workers; it runs again alone at the end"


def out_of_memory(exc: BaseException) -> bool:
    """The GPU's memory ran out (not the host's): torch's error, a driver call of attngen's runtime that returned
    CUDA_ERROR_OUT_OF_MEMORY, or PyCUDA's error of the same (a module loaded beside the other workers' can find
    no room: cuModuleGetFunction failed: out of memory)."""
    import sys
    import torch
    from ...runtime.driver import OUT_OF_MEMORY, DriverError
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    if isinstance(exc, DriverError):
        return exc.code == OUT_OF_MEMORY
    pycuda_driver = sys.modules.get("pycuda.driver")   # imported only where PyCUDA launched the case
    return pycuda_driver is not None and isinstance(exc, pycuda_driver.MemoryError)


def release_cached_memory() -> None:
    """Hand this process's cached GPU blocks back, so that the other workers sharing the GPU can use them."""
    import torch
    torch.cuda.empty_cache()


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
    from ...compile import precompile, print_summary
    from ...runtime import bundle_of, device_arch, gpu_modules
    torch, _ = gpu_modules()
    bundles = [bundle_of(str(path)) for path in spec_paths]
    batch = precompile(bundles, device_arch(torch, torch.cuda.current_device()), workers=jobs)
    (on_batch or print_summary)(batch)
    return [load_kernel(path, bundle, on_compile=on_compile) for path, bundle in zip(spec_paths, bundles)]


def load_kernel(spec_path, bundle=None, *, on_compile=None):
    """One spec's kernel as verify runs it (a synchronize after every launch); `bundle`: its
    (plan, sources, label) when already read."""
    from ...runtime import bundle_of, kernel_class
    plan, sources, label = bundle_of(str(spec_path)) if bundle is None else bundle
    hook = None if on_compile is None else (lambda arch: on_compile(spec_path, arch))
    return kernel_class(plan).from_sources(plan, sources, label=label, on_compile=hook, synchronize=True)


def verify_report(kernels, cases: list[CaseResult], suite_name: str) -> VerifyReport:
    """The report of `cases` run on `kernels`: the device, its arch and torch's version beside them."""
    import torch
    device = kernels[0].device if kernels else None
    name = torch.cuda.get_device_name(device) if device is not None and device.type == "cuda" else str(device)
    return VerifyReport(name, kernels[0].arch if kernels else "", torch.__version__, suite_name, cases)
