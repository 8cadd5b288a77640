"""attngen: FlashAttention-style CUDA kernels generated from YAML specs."""
__version__ = "0.1.0"

__all__ = ["__version__", "load"]


def load(spec_or_path, **kwargs):
    """Compile a spec (path, Spec or Plan) for the current GPU and return a callable kernel.

    Needs the ``gpu`` extra (torch, pycuda); see :func:`attngen.runtime.load`.
    """
    from .runtime import load as _load
    return _load(spec_or_path, **kwargs)
