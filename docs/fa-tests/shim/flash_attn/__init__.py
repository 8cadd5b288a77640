"""A stand-in `flash_attn` package: FlashAttention 2's public functions, each served by attngen.

Only for running FlashAttention's own test file against attngen (docs/fa-tests/README.md). Every
function translates its arguments and calls attngen.attention / attention_varlen /
attention_with_kvcache; what attngen has no counterpart for raises NotImplementedError("unsupported:
...") and the runner's plugin counts the test as unsupported. Nothing here is FlashAttention's code.
"""
from .flash_attn_interface import (  # noqa: F401
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
)

__all__ = ["flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func", "flash_attn_varlen_func",
           "flash_attn_varlen_kvpacked_func", "flash_attn_varlen_qkvpacked_func", "flash_attn_with_kvcache"]
__version__ = "2.8.4+attngen-shim"
