"""Decode timing beside torch SDPA's flash and cuDNN backends, with the K/V caches rotated through
enough copies that they do not sit in L2, and the device-to-device copy bandwidth of the same run
as the ceiling. Bytes counted: K and V read once per KV head (2 x B x Hkv x Sk x D x element size)."""
from __future__ import annotations

from dataclasses import dataclass

L2_MARGIN = 2.0   # rotate so that the buffers in flight exceed this many L2 sizes


@dataclass(frozen=True)
class DecodeCell:
    batch: int
    heads: int
    kv_heads: int
    seqlen_k: int
    seqlen_q: int = 1

    @property
    def label(self) -> str:
        return f"B{self.batch} {self.heads}/{self.kv_heads} Sk{self.seqlen_k} Sq{self.seqlen_q}"


def default_cells() -> tuple[DecodeCell, ...]:
    """The issue's grid: B in {1, 8, 64}, Hq/Hkv in {32/8, 32/32, 64/8}, Sk in {2k, 8k, 32k; 128k at
    B=1}, Sq in {1, 4}."""
    out = []
    for b in (1, 8, 64):
        for hq, hk in ((32, 8), (32, 32), (64, 8)):
            for sk in (2048, 8192, 32768) + ((131072,) if b == 1 else ()):
                for sq in (1, 4):
                    out.append(DecodeCell(b, hq, hk, sk, sq))
    return tuple(out)


def median_time_us(torch, fn, reps: int, rotate: int) -> float:
    """Median of `reps` CUDA-event timings of fn(i), i cycling over `rotate` input sets; the calls
    are queued behind a GPU sleep (attngen bench's method), so host time between them is hidden."""
    from .bench import time_calls
    return time_calls(torch, fn, [(i,) for i in range(rotate)], reps=reps)[0]


def copy_bandwidth(torch, nbytes: int = 1 << 30, reps: int = 20) -> float:
    """Device-to-device copy bandwidth (bytes read + written per second) of this GPU now."""
    a = torch.empty(nbytes // 2, dtype=torch.float16, device="cuda")
    b = torch.empty_like(a)
    us = median_time_us(torch, lambda i: b.copy_(a), reps, 1)
    return 2 * a.numel() * 2 / (us * 1e-6)


def bench_cell(torch, kernel, cell: DecodeCell, *, backends=("flash", "cudnn"), reps: int = 30) -> dict:
    """Times (us) of the kernel and each SDPA backend on one cell, fresh caches rotated past L2."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    d, dtype = kernel.plan.head_dim, kernel.dtype
    kv_bytes = 2 * cell.batch * cell.kv_heads * cell.seqlen_k * d * 2
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rotate = max(1, min(16, int(L2_MARGIN * l2 // kv_bytes) + 1))
    qs = [torch.randn(cell.batch, cell.heads, cell.seqlen_q, d, device="cuda", dtype=dtype) for _ in range(rotate)]
    ks = [torch.randn(cell.batch, cell.kv_heads, cell.seqlen_k, d, device="cuda", dtype=dtype) for _ in range(rotate)]
    vs = [torch.randn_like(k) for k in ks]
    causal = cell.seqlen_q > 1
    out = {"cell": cell.label, "kv_bytes": kv_bytes, "rotate": rotate}
    out["attngen_us"] = median_time_us(
        torch, lambda i: kernel(qs[i], ks[i], vs[i], causal=causal, validate=False), reps, rotate)
    out["splits"] = getattr(kernel, "last_splits", None)
    names = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    for name in backends:
        # SDPA's causal is top-left; for Sq new tokens at the end of Sk keys the decode mask is
        # bottom-right, which SDPA expresses as an explicit mask only, so causal cells time SDPA
        # without a mask (it does slightly more work: Sq x Sq scores it should hide).
        def call(i, backend=names[name]):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(qs[i], ks[i], vs[i], enable_gqa=cell.heads != cell.kv_heads)
        try:
            out[f"{name}_us"] = median_time_us(torch, call, reps, rotate)
        except RuntimeError as exc:
            out[f"{name}_us"] = None
            out[f"{name}_error"] = str(exc).splitlines()[0][:200]
    return out
