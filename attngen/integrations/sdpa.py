"""attngen as torch's SDPA flash backend, through torch.nn.attention's flash-attention registry
(torch 2.11 or later).

    import attngen
    attngen.enable()      # F.scaled_dot_product_attention runs attngen where the dispatch table serves it
    ...
    attngen.disable()     # torch's own kernels again

or by the registry's name: `attngen.integrations.sdpa.register()` (adds the name, activates nothing),
then `torch.nn.attention.activate_flash_attention_impl("attngen")`.

Activating overrides the CUDA kernels of aten's four flash ops
(`_scaled_dot_product_flash_attention` and its backward, `_flash_attention_forward` and its
backward) with Python kernels that run the table's forward and backward specs and return aten's
tuples: out like q, the natural-log LSE fp32 (B, H, Sq) contiguous ((H, total_q) for varlen), rng
state (2,) and offset () uint64 left unwritten (as aten's own without dropout: nothing reads them),
an empty debug mask. A call attngen does not serve (dropout, a debug mask, fp32, seqused_k, ALiBi
through aten, a shape or head dim without a table entry, inputs a kernel refuses before it launches)
runs torch's original kernel, captured with torch.library.get_kernel before the override. Forward
and backward decide apart: the backward of either forward takes the other's out and LSE (both are
aten's contract). So that SDPA picks the flash ops, activation also puts FLASH_ATTENTION first in
its backend priority and turns its cuDNN backend off (torch 2.11 prefers cuDNN on Hopper), both
restored by `disable()`. `STATS` counts the calls each side ran.
"""
from __future__ import annotations

import collections
import warnings

from ..core.calls import table_call
from ..core.variants import call_mask

NAME = "attngen"
OPS = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
       "_flash_attention_forward", "_flash_attention_backward")

# (pass, who ran it) -> calls since import: ("fwd", "attngen"), ("bwd", "torch: dropout"), ...
STATS: collections.Counter = collections.Counter()
WHY: dict = {}          # "torch: <reason>" -> the last message attngen refused a call with
_MISSES: dict = {}      # call key of a table miss -> reason (a repeated unserved shape costs one dict get)
_BOUND: dict = {}       # torch, attngen's library module, half dtypes, the refusals: bound on install


def _torch():
    try:
        import torch
        import torch.nn.attention as attention
    except ImportError:
        raise ImportError("attngen's SDPA backend needs torch: pip install -e '.[gpu]' (`attngen doctor` prints "
                          "the command)") from None
    names = ("register_flash_attention_impl", "activate_flash_attention_impl", "restore_flash_attention_impl",
             "current_flash_attention_impl", "list_flash_attention_impls")
    if not all(hasattr(attention, n) for n in names) or not hasattr(torch.library, "get_kernel"):
        raise ImportError(f"torch {torch.__version__} has no flash-attention registry (torch.nn.attention."
                          "register_flash_attention_impl and torch.library.get_kernel: torch 2.11 or later)")
    return torch


def register() -> str:
    """Add "attngen" to torch's flash-attention registry (activates nothing; idempotent)."""
    attention = _torch().nn.attention
    if NAME not in attention.list_flash_attention_impls():
        attention.register_flash_attention_impl(NAME, register_fn=_install)
    return NAME


def enable() -> None:
    """Activate attngen as SDPA's flash backend (replaces any other registered one)."""
    torch = _torch()
    register()
    torch.nn.attention.activate_flash_attention_impl(NAME)


def disable() -> None:
    """Restore torch's own flash kernels, if attngen is the active implementation."""
    if enabled():
        _torch().nn.attention.restore_flash_attention_impl()


def enabled() -> bool:
    import sys
    attention = getattr(getattr(sys.modules.get("torch"), "nn", None), "attention", None)
    current = getattr(attention, "current_flash_attention_impl", None)
    return current is not None and current() == NAME


class _Handle:
    """What activation installed: the override library, and how to restore SDPA's backend choice."""

    def __init__(self, library, undo):
        self.library, self.undo = library, undo

    def remove(self) -> None:
        library, self.library = self.library, None
        if library is not None:
            library._destroy()
        undo, self.undo = self.undo, []
        for step in undo:
            step()
        _MISSES.clear()


def _install() -> _Handle:
    """The registry's register_fn: override aten's flash ops on CUDA, fall back to their originals."""
    torch = _torch()
    from torch.library import Library, get_kernel

    from ..errors import ToolError
    from ..ops import library
    from ..ops.dispatch import DISPATCH
    _BOUND.update(torch=torch, library=library, dispatch=DISPATCH, half=(torch.float16, torch.bfloat16),
                  refusals=(LookupError, NotImplementedError, TypeError, ValueError, ToolError))
    impls = dict(zip(OPS, (_sdpa_forward, _sdpa_backward, _flash_forward, _flash_backward)))
    originals = {name: get_kernel(getattr(torch.ops.aten, name).default, "CUDA") for name in OPS}
    lib = Library("aten", "IMPL", "CUDA")  # noqa: TOR901 (overriding aten's own kernels is the registry's design)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Warning only once for all operators", category=UserWarning)
        warnings.filterwarnings("ignore", message=".*Overriding a previously registered kernel", category=UserWarning)
        for name in OPS:
            lib.impl(name, _kernel(impls[name], originals[name]), "CUDA", with_keyset=True)
    return _Handle(lib, _flash_first(torch))


def _kernel(impl, original):
    def kernel(keyset, *args, **kwargs):
        return impl(original, keyset, *args, **kwargs)
    kernel.__name__ = kernel.__qualname__ = f"attngen{impl.__name__}"
    return kernel


def _flash_first(torch):
    """Make SDPA's choice of backend reach the flash ops: FLASH_ATTENTION first in the priority order,
    and the cuDNN backend off (torch 2.11 picks cuDNN before flash on Hopper whatever the order).
    Returns what undoes it, or None."""
    undo = []
    get = getattr(torch._C, "_get_sdp_priority_order", None)
    put = getattr(torch._C, "_set_sdp_priority_order", None)
    if get is not None and put is not None:
        before = [int(b) for b in get()]
        flash = int(torch.nn.attention.SDPBackend.FLASH_ATTENTION)
        put([flash] + [b for b in before if b != flash])
        undo.append(lambda: put(before))
    backends = torch.backends.cuda
    if hasattr(backends, "cudnn_sdp_enabled") and backends.cudnn_sdp_enabled():
        backends.enable_cudnn_sdp(False)
        undo.append(lambda: backends.enable_cudnn_sdp(True))
    return undo


# -- the kernels -------------------------------------------------------------------------------------

def _unserved(query, key, value, dropout_p, debug_mask, miss_key, call: str, mask: str):
    if dropout_p:
        return "torch: dropout"
    if debug_mask:
        return "torch: debug mask"
    if query.dtype not in _BOUND["half"] or key.dtype != query.dtype or value.dtype != query.dtype:
        return "torch: dtype"
    index = query.get_device()
    if index >= 0 and _BOUND["dispatch"].padded_head_dim(call, index, query.dtype, query.shape[-1], value.shape[-1],
                                                         mask, "", False if table_call(call).paged else None):
        # attngen would pad q, k and v to a head dim that serves the call's mask (a copy of each);
        # torch's kernel takes this head dim as it is
        return "torch: head dim"
    return _MISSES.get(miss_key)


def _refused(exc, miss_key) -> str:
    """The reason of a refusal attngen raised before launching; table misses are remembered."""
    if isinstance(exc, LookupError):
        reason = "torch: no table entry"
    elif isinstance(exc, NotImplementedError):
        reason = "torch: no backward spec"
    elif isinstance(exc, (TypeError, ValueError)):
        reason = "torch: inputs"
    else:
        reason = "torch: no kernel"
    WHY[reason] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, (LookupError, NotImplementedError)):
        if len(_MISSES) >= 4096:
            _MISSES.clear()
        _MISSES[miss_key] = reason
    return reason


def _rng(query):
    """aten's (rng_state, unused, debug_attn_mask) of a call without dropout: no kernel reads them (the backward
    reads the rng state only with dropout), so they are left unwritten, as allocations only (zeros would launch two
    fill kernels a call)."""
    torch = _BOUND["torch"]
    return (torch.empty(2, dtype=torch.uint64, device=query.device),
            torch.empty((), dtype=torch.uint64, device=query.device),
            torch.empty(0, dtype=query.dtype, device=query.device))


def _serve(step: str, reason, miss, run, fallback):
    """attngen's `run()` unless `reason` already names torch's kernel; a refusal raised before any
    launch becomes that reason. Torch's original kernel, `fallback()`, for the rest."""
    if reason is None:
        try:
            result = run()
        except _BOUND["refusals"] as exc:
            reason = _refused(exc, miss)
        else:
            STATS[step, NAME] += 1
            return result
    STATS[step, reason] += 1
    return fallback()


def _sdpa_forward(original, keyset, query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *,
                  scale=None):
    miss = ("sdpa", query.shape, key.shape, value.shape, query.dtype, query.device, is_causal)

    def run():
        # FlashAttention's causal mask is bottom-right aligned (the same as torch's when Sq == Sk)
        out, lse = _BOUND["library"].forward(query, key, value, is_causal, "bottom_right" if is_causal else None, scale,
                                             "bhsd", True)
        return (out, lse, None, None, query.shape[2], key.shape[2]) + _rng(query)
    return _serve("fwd", _unserved(query, key, value, dropout_p, return_debug_mask, miss, "forward",
                                   "causal" if is_causal else "none"), miss, run,
                  lambda: original.call_boxed(keyset, query, key, value, dropout_p, is_causal, return_debug_mask,
                                              scale=scale))


def _sdpa_backward(original, keyset, grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
                   dropout_p, is_causal, philox_seed, philox_offset, *, scale=None):
    miss = ("sdpa_backward", query.shape, key.shape, value.shape, query.dtype, query.device, is_causal)

    def run():
        return _BOUND["library"].backward(grad_out, query, key, value, out, logsumexp, is_causal,
                                          "bottom_right" if is_causal else None, scale, "bhsd",
                                          deterministic=_BOUND["torch"].are_deterministic_algorithms_enabled())
    return _serve("bwd", _unserved(query, key, value, dropout_p, False, miss, "backward",
                                   "causal" if is_causal else "none"), miss, run,
                  lambda: original.call_boxed(keyset, grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k,
                                              max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset,
                                              scale=scale))


def _flash_call(op, query, key, value, cum_seq_q, max_k, is_causal, left, right):
    """(window, varlen, alignment, miss key) of a _flash_attention_* call: aten's window_size_left/right
    (None or -1: an open side) as attngen's window, or None; FlashAttention's bottom-right alignment."""
    left = -1 if left is None else int(left)
    right = -1 if right is None else int(right)
    window = None if left < 0 and right < 0 else (left, right)
    varlen = cum_seq_q is not None
    miss = (op, query.shape, key.shape, value.shape, query.dtype, query.device, is_causal, window,
            max_k if varlen else None)
    return window, varlen, "bottom_right" if is_causal or window is not None else None, miss


def _flash_forward(original, keyset, query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                   return_debug_mask, *, scale=None, window_size_left=None, window_size_right=None, seqused_k=None,
                   alibi_slopes=None):
    window, varlen, align, miss = _flash_call("flash", query, key, value, cum_seq_q, max_k, is_causal, window_size_left,
                                              window_size_right)
    reason = _unserved(query, key, value, dropout_p, return_debug_mask, miss, "varlen" if varlen else "forward",
                       call_mask(is_causal, window))
    if reason is None and (seqused_k is not None or alibi_slopes is not None or varlen != (cum_seq_k is not None)):
        reason = "torch: seqused_k, alibi_slopes or one-sided offsets"

    def run():
        library = _BOUND["library"]
        if varlen:
            out, lse = library.varlen(query, key, value, cum_seq_q, cum_seq_k, int(max_q), int(max_k), is_causal, align,
                                      scale, True, window)
        elif window is not None:
            out, lse = library.forward_variant(query, key, value, is_causal, align, scale, "bshd", True, window, None,
                                               None)
        else:
            out, lse = library.forward(query, key, value, is_causal, align, scale, "bshd", True)
        if align is not None:
            # a row that sees no key: FlashAttention's LSE is +inf (its backward then gives the row zero
            # gradients), attngen's -inf
            lse = lse.masked_fill_(lse == float("-inf"), float("inf"))
        return (out, lse) + _rng(query)
    return _serve("fwd", reason, miss, run,
                  lambda: original.call_boxed(keyset, query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                                              is_causal, return_debug_mask, scale=scale,
                                              window_size_left=window_size_left, window_size_right=window_size_right,
                                              seqused_k=seqused_k, alibi_slopes=alibi_slopes))


def _flash_backward(original, keyset, grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
                    dropout_p, is_causal, rng_state, unused, *, scale=None, window_size_left=None,
                    window_size_right=None):
    window, varlen, align, miss = _flash_call("flash_backward", query, key, value, cum_seq_q, max_k, is_causal,
                                              window_size_left, window_size_right)
    reason = _unserved(query, key, value, dropout_p, False, miss, "varlen_backward" if varlen else "backward",
                       call_mask(is_causal, window))
    if reason is None and varlen and window is not None:
        reason = "torch: no varlen backward with a window"

    def run():
        library = _BOUND["library"]
        deterministic = _BOUND["torch"].are_deterministic_algorithms_enabled()
        if varlen:
            return library.varlen_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k,
                                           int(max_q), int(max_k), is_causal, align, scale, deterministic)
        return library.backward(grad_out, query, key, value, out, logsumexp, is_causal, align, scale, "bshd", window,
                                deterministic=deterministic)
    return _serve("bwd", reason, miss, run,
                  lambda: original.call_boxed(keyset, grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k,
                                              max_q, max_k, dropout_p, is_causal, rng_state, unused, scale=scale,
                                              window_size_left=window_size_left, window_size_right=window_size_right))


__all__ = ["NAME", "STATS", "WHY", "disable", "enable", "enabled", "register"]
