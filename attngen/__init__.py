"""attngen: FlashAttention-style CUDA kernels generated from YAML specs.

attngen.attention / attention_varlen / attention_with_kvcache / attention_fp8 call the committed kernel that
serves the GPU, dtype, head dim and shape (attngen.ops); attngen.merge_attention / merge_attention_list merge
partial results (attention over key subsets) by their LSE; attngen.load(spec) compiles and loads
one spec (attngen.runtime). Both need the ``gpu`` extra (torch) and a CUDA GPU.
attngen.enable() / attngen.disable() make plain F.scaled_dot_product_attention run attngen's kernels
where the dispatch table serves the call (attngen.integrations.sdpa; docs/integrations.md).
"""
from .shipped import VERSION as __version__

__all__ = ["__version__", "attention", "attention_fp8", "attention_varlen", "attention_with_kvcache", "check_errors",
           "disable", "enable", "load", "merge_attention", "merge_attention_list", "quantize_fp8"]


def check_errors(device=None) -> None:
    """Raise attngen.runtime.InputError if a kernel clamped a bad length, page id or offset since the
    last check (calls never wait for the GPU to check them); see attngen.runtime.check_errors."""
    from .runtime import check_errors as _check     # on first use: `import attngen` loads no runtime
    _check(device)


def enable() -> None:
    """Make torch's F.scaled_dot_product_attention run attngen's forward and backward for every call
    the dispatch table serves, and torch's own flash kernel for the rest (torch 2.11's flash-attention
    registry, under the name "attngen"; see attngen.integrations.sdpa)."""
    from .integrations.sdpa import enable as _enable     # on first use: `import attngen` loads no torch
    _enable()


def disable() -> None:
    """Undo attngen.enable(): torch's own flash kernels again."""
    from .integrations.sdpa import disable as _disable
    _disable()


def load(spec_or_path, **kwargs):
    """Compile a spec (path, Spec or Plan) for the current GPU and return a callable kernel.

    Needs the ``gpu`` extra (torch); see :func:`attngen.runtime.load`.
    """
    from .runtime import load as _load              # on first use: `import attngen` loads no runtime
    return _load(spec_or_path, **kwargs)


def __getattr__(name):
    # The entry points import torch: only when asked for, so the CPU-only install imports attngen.
    if name in ("attention", "attention_fp8", "attention_varlen", "attention_with_kvcache", "merge_attention",
                "merge_attention_list"):
        from . import ops
        ops._bind()   # registers the torch ops and binds them before anything traces a call
        globals()[name] = getattr(ops, name)
        return globals()[name]
    if name == "quantize_fp8":
        from .runtime.calls.forward_fp8 import quantize_fp8
        globals()[name] = quantize_fp8
        return quantize_fp8
    raise AttributeError(f"module 'attngen' has no attribute {name!r}")
