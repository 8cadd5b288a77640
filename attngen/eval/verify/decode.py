"""Decode verification: the same error rule as `attngen verify` (max|out - ref| <= 2 x the error of
torch's own low-precision attention + a floor, against an fp32 reference), per sequence of a batch
with its own length, on poisoned outputs. A spec of an e4m3 KV cache (kv_dtype: e4m3) gets its random
caches quantised (scale = amax / 448, per tensor, or per KV head on odd seeds); its reference is fp32
attention over the dequantised cache, and torch's attention in the queries' dtype over that same cache
sets the bound."""
from __future__ import annotations

from dataclasses import dataclass, replace

from .pycuda_launch import pycuda_agreement
from .cases import FULL_SUITE, CaseResult, attention_torch, exact_fp32_matmul, judge_rows, score_arguments, \
    score_modifiers

QUICK_CASES = 5   # the first cases of decode_cases for `attngen verify --quick`
# The page sizes a paged spec is verified with (its kernel takes any power of two from 1 to 512): a key
# per page (every row of a tile from its own page), pages inside a tile, and pages holding whole tiles.
PAGE_SIZES = (1, 16, 256)


@dataclass(frozen=True)
class DecodeCase:
    batch: int
    heads: int
    kv_heads: int
    seqlen_q: int
    capacity: int
    lengths: tuple[int, ...] | None   # per sequence; None: every sequence fills the cache
    causal: bool = False
    layout: str = "bhsd"
    num_splits: int | None = None
    page_size: int | None = None      # paged: the cache lives in shuffled pages of a pool, through a table
    window: tuple[int, int] | None = None   # (left, right) from each new token's own position (window mask)
    expression: bool = False          # the spec's mask expression is the mask (masks: [expr])

    @property
    def mask(self) -> str:
        """The kernel function the case calls."""
        if self.expression:
            return "expr"
        if self.window is not None:
            return "window"
        return "causal" if self.causal else "none"

    @property
    def variant(self) -> str:
        """The variant column of the report."""
        if self.expression:
            return "expr"
        if self.window is not None:
            return (f"window({self.window[0]},{self.window[1]})" + ("+causal" if self.causal else "")
                    + ":bottom_right")
        return "causal:bottom_right" if self.causal else "none"

    @property
    def visible_window(self) -> tuple[int, int] | None:
        """The window the reference draws: causal bounds its right side at 0."""
        if self.window is None:
            return None
        return (self.window[0], 0) if self.causal else self.window

    @property
    def label(self) -> str:
        lens = "full" if self.lengths is None else ",".join(map(str, self.lengths))
        return (f"{self.batch}x{self.heads}/{self.kv_heads}xq{self.seqlen_q}xcap{self.capacity} lens[{lens}] "
                f"{'causal ' if self.causal else ''}{self.layout} splits={self.num_splits or 'auto'}"
                + (f" paged{self.page_size}" if self.page_size else "")
                + (f" window({self.window[0]},{self.window[1]})" if self.window is not None else "")
                + (" expr" if self.expression else ""))


def paged_cases(block_n: int, pg: int) -> tuple[DecodeCase, ...]:
    """Cases through shuffled page tables of pages of `pg` keys: lengths of 1, a tile - 1, exactly a
    page, a page +- 1, the capacity, and very different lengths in one batch."""
    n = block_n
    pcap = max(12 * pg, 4 * n + 37)
    return (
        DecodeCase(4, 32, 8, 1, pcap, (1, max(pg - 1, n - 1), pg, pg + 1), page_size=pg),
        DecodeCase(3, 32, 8, 4, pcap, (pcap, 5, min(7 * pg + 3, pcap - 1)), causal=True, page_size=pg),
        DecodeCase(2, 16, 2, 1, pcap, (pcap, 2 * pg), layout="bshd", num_splits=5, page_size=pg),
        DecodeCase(2, 32, 32, 1, pcap, (3 * pg + 1, 1), num_splits=1, page_size=pg),
    )


def decode_cases(block_n: int, paged: bool = False) -> tuple[DecodeCase, ...]:
    """Lengths of 1, a tile +- 1, the capacity, and very different lengths in one batch; GQA groups
    1, 4 and 8 with 1 and 4 new tokens (up to 32 group rows: two row blocks of 16); both layouts;
    one split, the heuristic's and many. Paged: the paged cases of each of PAGE_SIZES (the first of
    each page size first)."""
    n = block_n
    cap = 4 * n + 37
    paged_sets = [paged_cases(n, pg) for pg in PAGE_SIZES] if paged else []
    paged = tuple(c for i in range(4) for cases in paged_sets for c in cases[i:i + 1])
    plain = (
        DecodeCase(1, 8, 8, 1, 1000, None),
        DecodeCase(2, 32, 8, 1, cap, (1, cap)),
        DecodeCase(3, 32, 8, 4, cap, (n - 1, n, n + 1), causal=True),
        DecodeCase(3, 32, 8, 4, cap, (4, 2 * n + 3, cap), causal=False),
        DecodeCase(2, 64, 8, 4, cap, (5, 3 * n - 1), causal=True, layout="bshd"),
        DecodeCase(4, 16, 2, 1, 8 * n, (1, 7 * n + 5, 2 * n, 8 * n), num_splits=1),
        DecodeCase(4, 16, 2, 1, 8 * n, (1, 7 * n + 5, 2 * n, 8 * n), num_splits=8),
        DecodeCase(1, 32, 32, 2, 20 * n + 3, (20 * n + 3,), causal=True, layout="bshd"),
        DecodeCase(2, 8, 1, 16, 3 * n, (3, 3 * n), causal=True),   # MQA, 16 new tokens: 128 rows, 8 row blocks
    )
    return plain[:3] + paged + plain[3:]   # --quick takes the first few: both kinds of cache


def window_cases(block_n: int, paged: bool = False) -> tuple[DecodeCase, ...]:
    """Windows (left, right) counted from each new token: of 0 and 1 key, a tile +- 1 (from one
    token, and from four with causal), one-sided ones, and one wider than any sequence; over
    sequences shorter than the window, a tile +- 1 long and many tiles long; the heuristic's splits,
    many splits over a window of several tiles, GQA/MQA, both layouts, and paged caches."""
    n = block_n
    cap = 8 * n + 37
    cases = [
        DecodeCase(3, 32, 8, 1, cap, (1, n + 1, cap), window=(0, 0)),
        DecodeCase(3, 32, 8, 4, cap, (3, n, cap), window=(1, -1)),
        DecodeCase(3, 32, 8, 4, cap, (n - 1, 3 * n + 5, cap), window=(n - 1, n + 1)),
        DecodeCase(2, 16, 2, 4, cap, (2 * n + 3, cap), causal=True, window=(n + 1, 1), layout="bshd"),
        DecodeCase(2, 8, 1, 16, cap, (5, cap), window=(-1, 2)),
        DecodeCase(4, 16, 2, 1, cap, (1, 7 * n + 5, 2 * n, cap), causal=True, window=(3 * n + 5, -1), num_splits=8),
        DecodeCase(1, 32, 32, 2, cap, (cap,), causal=True, window=(2 * n - 1, 0), num_splits=3),
        DecodeCase(2, 32, 8, 1, cap, (cap, 4), window=(5000, 5000)),
    ]
    for pg in PAGE_SIZES if paged else ():
        pcap = max(12 * pg, 4 * n + 37)
        cases += [
            DecodeCase(3, 32, 8, 4, pcap, (pcap, 5, min(7 * pg + 3, pcap - 1)), causal=True, window=(pg + n + 1, 0),
                       page_size=pg),
            DecodeCase(2, 16, 2, 1, pcap, (pcap, 2 * pg), layout="bshd", window=(3 * pg + n - 1, -1), num_splits=5,
                       page_size=pg),
        ]
    return tuple(cases)


def reference(torch, q, k, v, lengths, case: DecodeCase, scale: float, modifiers: tuple = ()):
    """(fp32 reference O, its LSE, torch's low-precision O): each sequence against its own keys, with
    its own length as Sk for the masks and score modifiers (`modifiers`: (ScoreVariant, value) of the
    whole batch); masks are bottom-right (token t of Sq sits at key len - Sq + t)."""
    outs, lses, lows = [], [], []
    mask = case.mask
    align = "bottom_right" if mask in ("causal", "window") else None
    for b in range(q.shape[0]):
        L = k.shape[2] if lengths is None else lengths[b]
        qb, kb, vb = q[b:b + 1], k[b:b + 1, :, :L], v[b:b + 1, :, :L]
        mods = tuple((s, s.select_batches(value, slice(b, b + 1)) if s.select_batches else value)
                     for s, value in modifiers)
        args = dict(scale=scale, mask=mask, alignment=align, window=case.visible_window, modifiers=mods)
        with exact_fp32_matmul(torch):
            ref, lse = attention_torch(qb.float(), kb.float(), vb.float(), **args)
        # torch's attention in q's dtype (an e4m3 cache's dequantised fp32 values rounded to it; else k, v as given)
        low, _ = attention_torch(qb, kb.to(qb.dtype), vb.to(qb.dtype), **args)
        outs.append(ref), lses.append(lse), lows.append(low.float())
    return torch.cat(outs), torch.cat(lses), torch.cat(lows)


def check_decode_case(kernel, case: DecodeCase, seed: int = 0, label: str | None = None) -> CaseResult:
    """Run one case on a poisoned output and compare it with the fp32 reference."""
    import torch
    result = CaseResult(label or kernel.label, kernel.entry[case.mask], case.variant, case, passed=False)
    g = torch.Generator(device=kernel.device).manual_seed(seed)
    d, dtype, dev = kernel.plan.head_dim, kernel.dtype, kernel.device

    def randn(*size):
        return torch.randn(size, generator=g, device=dev, dtype=torch.float32).to(dtype)

    b, h, kvh, sq, cap = case.batch, case.heads, case.kv_heads, case.seqlen_q, case.capacity
    if case.layout == "bshd":
        q, k, v = randn(b, sq, h, d), randn(b, cap, kvh, d), randn(b, cap, kvh, d)
        out = torch.full((b, sq, h, d), float("nan"), dtype=dtype, device=dev)
        view = lambda t: t.permute(0, 2, 1, 3)   # noqa: E731
    else:
        q, k, v = randn(b, h, sq, d), randn(b, kvh, cap, d), randn(b, kvh, cap, d)
        out = torch.full((b, h, sq, d), float("nan"), dtype=dtype, device=dev)
        view = lambda t: t   # noqa: E731
    lens = None if case.lengths is None else torch.tensor(case.lengths, dtype=torch.int32, device=dev)
    scale = d ** -0.5
    kc, vc, table = k, v, None
    kv_scales = {}
    if kernel.plan.kv_dtype == "e4m3":
        per_head = seed % 2 == 1
        (kc, k, ks), (vc, v, vs) = (e4m3_cache(torch, t, case.layout, per_head, dtype) for t in (k, v))
        kv_scales = {"k_scale": ks, "v_scale": vs}
    if case.page_size:
        if kv_scales:   # the pools are built on the bytes (index writes of float8 are not in every torch)
            byte_pools = paged_cache(torch, kc.view(torch.uint8), vc.view(torch.uint8), case.lengths, case.page_size,
                                     case.layout, g)
            kc, vc, table = byte_pools[0].view(kc.dtype), byte_pools[1].view(vc.dtype), byte_pools[2]
        else:
            kc, vc, table = paged_cache(torch, k, v, case.lengths, case.page_size, case.layout, g)
    scores = score_arguments(kernel.plan, b, h, g, dev)
    extra = {"window": case.window} if case.window is not None else {}

    def launch(o, _lse=None):
        return kernel(q, kc, vc, cache_seqlens=lens, block_table=table, causal=case.causal,
                      num_splits=case.num_splits, return_lse=True, layout=case.layout, out=o, **extra, **scores,
                      **kv_scales)
    o, lse = launch(out)
    torch.cuda.synchronize(dev)
    pycuda_agreement(result, kernel, launch, ("o", "lse"), (o, lse))
    ref, ref_lse, low = reference(torch, view(q), view(k), view(v), case.lengths, case, scale,
                                  score_modifiers(kernel.plan, scores))
    judge_rows(result, torch, view(o), ref, low, lse, ref_lse, kernel.plan.spec.dtype)
    return result


def e4m3_cache(torch, x, layout: str, per_head: bool, dtype):
    """(e4m3 cache, its dequantised values in fp32, fp32 scale) of a random cache x (bhsd or bshd), as
    vLLM stores one: scale = amax / 448 over the tensor or, per_head, over each KV head ((Hkv,) scales).
    The fp32 reference reads the dequantised values as they are, torch's low-precision attention rounded
    to the queries' dtype (reference)."""
    head_dim = 1 if layout == "bhsd" else 2
    xf = x.float()
    if per_head:
        dims = tuple(d for d in range(4) if d != head_dim)
        scale = (xf.abs().amax(dim=dims).clamp(min=1e-6) / 448.0).contiguous()
        shape = [1, 1, 1, 1]
        shape[head_dim] = -1
        shaped = scale.view(shape)
    else:
        scale = (xf.abs().amax().clamp(min=1e-6) / 448.0).reshape(1)
        shaped = scale
    x8 = (xf / shaped).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return x8, x8.float() * shaped, scale


def paged_cache(torch, k, v, lengths, page_size: int, layout: str, generator=None, spare: int = 3):
    """(k pool, v pool, block table) holding the contiguous caches k and v (in `layout`) in pages of
    a pool in shuffled order, with `spare` unused pages of noise; each sequence gets the pages its
    length needs (`lengths` None: the whole cache) and table entries past them are -1."""
    bhsd = layout == "bhsd"
    seq_dim = 2 if bhsd else 1
    b, cap, pg = k.shape[0], k.shape[seq_dim], page_size
    heads, d = k.shape[1 if bhsd else 2], k.shape[3]
    need = [-(-(cap if lengths is None else length) // pg) for length in (lengths or [None] * b)]
    pool_pages = sum(need) + spare
    order = torch.randperm(pool_pages, generator=generator, device=k.device)
    shape = [pool_pages, heads, pg, d] if bhsd else [pool_pages, pg, heads, d]

    def noise():
        return torch.randn(shape, generator=generator, device=k.device, dtype=torch.float32).to(k.dtype)

    kp, vp = noise(), noise()
    table = torch.full((b, -(-cap // pg)), -1, dtype=torch.int32, device=k.device)
    at = 0
    for s, n in enumerate(need):
        ids = order[at:at + n]
        at += n
        table[s, :n] = ids.int()
        for src, pool in ((k, kp), (v, vp)):
            rows = src[s].narrow(seq_dim - 1, 0, min(n * pg, cap))
            if n * pg > cap:   # the last page runs past the cache: its tail rows are never read
                pad = list(rows.shape)
                pad[seq_dim - 1] = n * pg - cap
                rows = torch.cat([rows, torch.zeros(pad, dtype=rows.dtype, device=rows.device)], dim=seq_dim - 1)
            pool[ids] = (rows.reshape(heads, n, pg, d).transpose(0, 1) if bhsd else rows.reshape(n, pg, heads, d))
    return kp, vp, table


def verify_cases(kernel, shapes, masks) -> list[tuple]:
    """The decode cases of `attngen verify` for the masks asked (the forward shapes only choose
    quick, fewer than the full suite, or full)."""
    cases = decode_cases(kernel.plan.block_n, kernel.plan.paged)
    if "expr" in masks:   # the expression is the only mask: every case through it (no causal= argument)
        cases = tuple(dict.fromkeys(replace(c, causal=False, expression=True) for c in cases))
    windows = window_cases(kernel.plan.block_n, kernel.plan.paged) if "window" in masks else ()
    if len(tuple(shapes)) < len(FULL_SUITE):
        cases, windows = cases[:QUICK_CASES], windows[:QUICK_CASES]
    out = []
    for i, case in enumerate(cases + windows):
        if case.mask not in masks:
            continue
        out.append((case.variant, kernel.entry[case.mask], case, i,
                    lambda seed, label, case=case: check_decode_case(kernel, case, seed, label)))
    return out
