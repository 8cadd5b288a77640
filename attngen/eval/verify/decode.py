"""Decode verification: the same error rule as `attngen verify` (max|out - ref| <= 2 x the error of
torch's own low-precision attention + a floor, against an fp32 reference), per sequence of a batch
with its own length, on poisoned outputs. Append specs (append: true) also run append cases: new
tokens rotated (both rotary modes), written into contiguous and paged caches (cache_batch_idx,
cache_leftpad) and attended, checked against a torch reference that rotates, appends and attends in
fp32, and the cache contents after the call against the expected ones. A spec of an e4m3 KV cache
(kv_dtype: e4m3) gets its random caches quantised (scale = amax / 448, per tensor, or per KV head on
odd seeds); its reference is fp32 attention over the dequantised cache, and torch's attention in the
queries' dtype over that same cache sets the bound."""
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
    # Append cases (append specs): `lengths` are then the keys before the new tokens (cache_seqlens).
    seqlen_new: int = 0               # new tokens per sequence (k, v); 0: none
    rotary_dim: int = 0               # rotated dims (-1: head_dim; capped at head_dim); 0: no rotary
    interleaved: bool = True          # rotary_interleaved
    batch_idx: bool = False           # cache_batch_idx: the cache has batch + 2 rows, the sequences in a shuffled order
    leftpad: tuple[int, ...] | None = None   # cache_leftpad per sequence (contiguous caches)

    @property
    def appends(self) -> bool:
        return bool(self.seqlen_new or self.batch_idx or self.leftpad is not None)

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
                + (" expr" if self.expression else "")
                + (f" new{self.seqlen_new}" if self.seqlen_new else "")
                + (f" rotary{self.rotary_dim}{'i' if self.interleaved else 'c'}" if self.rotary_dim else "")
                + (" batch_idx" if self.batch_idx else "")
                + (f" leftpad[{','.join(map(str, self.leftpad))}]" if self.leftpad is not None else ""))


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


def latent_cases(block_n: int, paged: bool = False) -> tuple[DecodeCase, ...]:
    """The shapes a latent-cache (MLA) model decodes with: one KV head for 16 query heads (DeepSeek over 8
    GPUs) or 128 (one GPU), 1 or 2 new tokens (speculative), long and uneven lengths, splits (the heuristic's,
    7, and a tile each); paged with pages of 1, 64 (FlashMLA's) and 256."""
    n = block_n
    cap = 40 * n + 29
    cases = [
        DecodeCase(2, 16, 1, 1, cap, (cap, 3 * n + 1), layout="bshd"),
        DecodeCase(3, 128, 1, 1, 6 * n + 5, (6 * n + 5, 1, 2 * n), layout="bshd"),
        DecodeCase(2, 16, 1, 2, cap, (n + 1, cap), causal=True, layout="bshd", num_splits=7),
        # a tile per split (41): past WIDE_COMBINE_MIN_SPLITS, so the combine part's wide function merges them
        DecodeCase(1, 16, 1, 1, cap, None, num_splits=41),
    ]
    for pg in (1, 64, 256) if paged else ():
        pcap = -(-max(8 * pg, 12 * n + 3) // pg) * pg
        cases.append(DecodeCase(3, 16, 1, 1, pcap, (pcap, 2 * pg + 1, n - 1), layout="bshd", page_size=pg))
    cases.append(DecodeCase(2, 32, 1, 2, 8 * n + 7, (8 * n + 7, n), causal=True, layout="bshd",
                            page_size=16 if paged else None))
    return tuple(cases)


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
        pcap = -(-max(12 * pg, 4 * n + 37) // pg) * pg    # whole pages: the table's capacity, rotary's rows
        cases += [
            DecodeCase(3, 32, 8, 4, pcap, (pcap, 5, min(7 * pg + 3, pcap - 1)), causal=True, window=(pg + n + 1, 0),
                       page_size=pg),
            DecodeCase(2, 16, 2, 1, pcap, (pcap, 2 * pg), layout="bshd", window=(3 * pg + n - 1, -1), num_splits=5,
                       page_size=pg),
        ]
    return tuple(cases)


def append_cases(block_n: int, paged: bool = False, window: bool = False) -> tuple[DecodeCase, ...]:
    """New tokens appended and attended: one and several (across a tile boundary; fewer than the new
    queries), rotary of the whole head dim, of part of it (24 dims: not a multiple of 16) and none, both
    rotary modes, cache_batch_idx over a cache with more rows than sequences, cache_leftpad (with and
    without new tokens), GQA/MQA, both layouts, one split and many; paged: pages of PAGE_SIZES."""
    n = block_n
    cap = 4 * n + 37
    cases = [
        DecodeCase(3, 32, 8, 1, cap, (0, n - 1, cap - 1), seqlen_new=1, rotary_dim=-1),
        DecodeCase(2, 32, 8, 4, cap, (n - 2, 2 * n + 1), causal=True, seqlen_new=4, rotary_dim=-1, interleaved=False),
        DecodeCase(3, 16, 2, 2, cap, (5, n, 3 * n), causal=True, layout="bshd", seqlen_new=2, rotary_dim=24,
                   batch_idx=True),
        DecodeCase(3, 32, 8, 1, cap, (n + 5, 3 * n, 10), layout="bshd", seqlen_new=1, rotary_dim=64,
                   interleaved=False, leftpad=(3, n + 1, 10)),
        DecodeCase(4, 16, 2, 4, 8 * n, (1, 7 * n + 5, 2 * n, 8 * n - 4), causal=True, num_splits=8, seqlen_new=2,
                   rotary_dim=-1),
        DecodeCase(2, 8, 1, 3, cap, (n - 1, 2 * n), causal=True, seqlen_new=3, num_splits=1),
        DecodeCase(3, 32, 8, 2, cap, (n, 7, 2 * n), causal=True, batch_idx=True, leftpad=(4, 0, n)),
    ]
    if window:
        cases += [DecodeCase(3, 32, 8, 4, cap, (n - 3, 3 * n, cap - 4), causal=True, window=(n - 1, 0), seqlen_new=4,
                             rotary_dim=-1),
                  DecodeCase(2, 16, 2, 1, cap, (2 * n, 5), window=(3, -1), seqlen_new=1, rotary_dim=32,
                             interleaved=False, layout="bshd")]
    for pg in PAGE_SIZES if paged else ():
        pcap = -(-max(12 * pg, 4 * n + 37) // pg) * pg    # whole pages: the table's capacity, rotary's rows
        cases += [
            DecodeCase(3, 32, 8, 2, pcap, (pg - 1, 5, 3 * n), causal=True, page_size=pg, seqlen_new=2, rotary_dim=-1),
            DecodeCase(2, 16, 2, 1, pcap, (pcap - 1, 2 * pg), layout="bshd", page_size=pg, seqlen_new=1, rotary_dim=64,
                       interleaved=False, num_splits=5),
        ]
    return tuple(cases)


def rotate(torch, x, cos, sin, positions, interleaved: bool):
    """x (B, H, S, D) rotated as FlashAttention's apply_rotary_emb, in fp32 and rounded once to x's dtype:
    row s of sequence b at positions[b][s] (rows of cos / sin, (seqlen_ro, rotary_dim / 2)); dims from
    rotary_dim on unchanged."""
    if cos is None:
        return x
    rd = 2 * cos.shape[1]
    xf = x.float()
    c = cos.float()[positions][:, None]   # (B, 1, S, rd / 2)
    s = sin.float()[positions][:, None]
    r = xf[..., :rd]
    if interleaved:
        x1, x2 = r[..., 0::2], r[..., 1::2]
        out = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
    else:
        x1, x2 = r[..., :rd // 2], r[..., rd // 2:]
        out = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    return torch.cat((out, xf[..., rd:]), dim=-1).to(x.dtype)


def check_append_case(kernel, case: DecodeCase, seed: int = 0, label: str | None = None) -> CaseResult:
    """One append case: q, the cache and the new tokens random, the output poisoned; the output and LSE
    against the reference of the rotated, appended cache (fp32), and the cache after the call against
    the expected one (the new rows rotated as the reference rotates them, every other row untouched)."""
    import torch
    result = CaseResult(label or kernel.label, kernel.entry[case.mask], case.variant, case, passed=False)
    g = torch.Generator(device=kernel.device).manual_seed(seed)
    d, dtype, dev = kernel.plan.head_dim, kernel.dtype, kernel.device

    def randn(*size):
        return torch.randn(size, generator=g, device=dev, dtype=torch.float32).to(dtype)

    b, h, kvh, sq, cap, new = case.batch, case.heads, case.kv_heads, case.seqlen_q, case.capacity, case.seqlen_new
    rows = b + 2 if case.batch_idx else b
    # Every tensor is made (B, H, S, D) and handed to the call in its layout: "bshd" as a contiguous copy.
    q, kc, vc = randn(b, h, sq, d), randn(rows, kvh, cap, d), randn(rows, kvh, cap, d)
    kn, vn = (randn(b, kvh, new, d), randn(b, kvh, new, d)) if new else (None, None)
    rd = min(d if case.rotary_dim < 0 else case.rotary_dim, d)
    cos = sin = None
    if rd and new:
        angle = torch.rand((cap, rd // 2), generator=g, device=dev) * 6.283185307179586
        cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
    lens = torch.tensor(case.lengths, dtype=torch.int32, device=dev)
    idx = torch.randperm(rows, generator=g, device=dev)[:b].int() if case.batch_idx else None
    pad = torch.tensor(case.leftpad, dtype=torch.int32, device=dev) if case.leftpad is not None else None
    cache_row = idx.tolist() if idx is not None else list(range(b))
    per_token = case.mask != "none"
    q_pos = torch.tensor([[min(L + (t if per_token else 0), cap - 1) for t in range(sq)] for L in case.lengths],
                         device=dev)
    k_pos = torch.tensor([[L + t for t in range(new)] for L in case.lengths], device=dev, dtype=torch.long)

    # The expected cache after the call, and each sequence's attended keys (from its leftpad on).
    k_after, v_after = kc.clone(), vc.clone()
    if new:
        k_rot = rotate(torch, kn, cos, sin, k_pos, case.interleaved)
        for i, L in enumerate(case.lengths):
            k_after[cache_row[i], :, L:L + new] = k_rot[i]
            v_after[cache_row[i], :, L:L + new] = vn[i]
    starts = case.leftpad or (0,) * b
    totals = [L + new - p for L, p in zip(case.lengths, starts)]
    k_seq = torch.zeros((b, kvh, cap, d), dtype=dtype, device=dev)
    v_seq = torch.zeros_like(k_seq)
    for i in range(b):
        k_seq[i, :, :totals[i]] = k_after[cache_row[i], :, starts[i]:starts[i] + totals[i]]
        v_seq[i, :, :totals[i]] = v_after[cache_row[i], :, starts[i]:starts[i] + totals[i]]

    bshd = case.layout == "bshd"
    to_layout = (lambda t: t.transpose(1, 2).contiguous()) if bshd else (lambda t: t)   # noqa: E731
    from_layout = (lambda t: t.transpose(1, 2)) if bshd else (lambda t: t)   # noqa: E731
    kc_call, vc_call, table = to_layout(kc.clone()), to_layout(vc.clone()), None
    if case.page_size:
        kc_call, vc_call, table = paged_cache(torch, to_layout(kc), to_layout(vc), [L + new for L in case.lengths],
                                              case.page_size, case.layout, g)
    q_call = to_layout(q)
    kn_call, vn_call = (to_layout(kn), to_layout(vn)) if new else (None, None)
    out = torch.full_like(q_call, float("nan"))
    scores = score_arguments(kernel.plan, b, h, g, dev)
    extra = {"window": case.window} if case.window is not None else {}

    def launch(o, _lse=None):
        return kernel(q_call, kc_call, vc_call, cache_seqlens=lens, block_table=table, causal=case.causal,
                      num_splits=case.num_splits, return_lse=True, layout=case.layout, out=o, k=kn_call, v=vn_call,
                      rotary_cos=cos, rotary_sin=sin, cache_batch_idx=idx, cache_leftpad=pad,
                      rotary_interleaved=case.interleaved, **extra, **scores)
    o, lse = launch(out)
    pycuda_agreement(result, kernel, launch, ("o", "lse"), (o, lse))   # a second append writes the same rows
    # The cache after the call (paged: each sequence's pages read back in order).
    if case.page_size:
        for i, L in enumerate(case.lengths):
            got_k = unpage(torch, kc_call, table[i], L + new, case.page_size, case.layout)
            got_v = unpage(torch, vc_call, table[i], L + new, case.page_size, case.layout)
            _cache_problems(result, torch, got_k, k_after[i, :, :L + new], got_v, v_after[i, :, :L + new], dtype,
                            f"sequence {i}")
    else:
        _cache_problems(result, torch, from_layout(kc_call), k_after, from_layout(vc_call), v_after, dtype, "cache")
    q_rot = rotate(torch, q, cos, sin, q_pos, case.interleaved)
    ref, ref_lse, low = reference(torch, q_rot, k_seq, v_seq, totals, case, d ** -0.5,
                                  score_modifiers(kernel.plan, scores))
    problems = list(result.problems)
    judge_rows(result, torch, from_layout(o), ref, low, lse, ref_lse, kernel.plan.spec.dtype)
    if problems and result.passed:   # the cache's problems fail the case too
        result.passed = False
    return result


def _cache_problems(result, torch, got_k, want_k, got_v, want_v, dtype, what: str) -> None:
    """Cache contents after an append: V exactly, K within an element's rounding (the kernel's rotation
    may fuse a multiply-add the reference rounds twice), nothing NaN."""
    tol = 1e-2 if dtype == torch.bfloat16 else 2e-3
    if not torch.equal(got_v, want_v):
        result.problems.append(f"{what}: v after the append differs from the expected cache")
    diff = (got_k.float() - want_k.float()).abs()
    bad = diff > tol * (1 + want_k.float().abs())
    if bool(bad.any()) or bool(torch.isnan(got_k).any()):
        result.problems.append(f"{what}: k after the append differs from the expected rotated cache by up to "
                               f"{diff.nan_to_num(float('inf')).max().item():.3g}")


def unpage(torch, pool, table_row, length: int, page_size: int, layout: str):
    """The first `length` keys of one sequence of a paged pool, (kv_heads, length, head_dim)."""
    pages = -(-length // page_size)
    ids = table_row[:pages].long()
    p = pool[ids]   # bhsd: (pages, H, pg, D); bshd: (pages, pg, H, D)
    if layout == "bhsd":
        p = p.transpose(0, 1)
    else:
        p = p.permute(2, 0, 1, 3)
    return p.reshape(p.shape[0], pages * page_size, p.shape[-1])[:, :length]


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
    d, dv, dtype, dev = kernel.plan.head_dim, kernel.plan.v_dim, kernel.dtype, kernel.device
    v_in_k = kernel.plan.v_in_k     # one latent cache: V is the first dv columns of each K row

    def randn(*size):
        return torch.randn(size, generator=g, device=dev, dtype=torch.float32).to(dtype)

    b, h, kvh, sq, cap = case.batch, case.heads, case.kv_heads, case.seqlen_q, case.capacity
    if case.layout == "bshd":
        q, k, v = randn(b, sq, h, d), randn(b, cap, kvh, d), randn(b, cap, kvh, dv)
        out = torch.full((b, sq, h, dv), float("nan"), dtype=dtype, device=dev)
        view = lambda t: t.permute(0, 2, 1, 3)   # noqa: E731
    else:
        q, k, v = randn(b, h, sq, d), randn(b, kvh, cap, d), randn(b, kvh, cap, dv)
        out = torch.full((b, h, sq, dv), float("nan"), dtype=dtype, device=dev)
        view = lambda t: t   # noqa: E731
    if v_in_k:
        v = k[..., :dv]
    lengths = case.lengths
    if lengths is None and kernel.plan.append:
        lengths = [cap] * b   # an appending kernel reads every sequence's length; none given means all keys
    lens = None if lengths is None else torch.tensor(lengths, dtype=torch.int32, device=dev)
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
            if v_in_k:
                vc = kc[..., :dv]
    scores = score_arguments(kernel.plan, b, h, g, dev)
    extra = {"window": case.window} if case.window is not None else {}

    def launch(o, _lse=None):
        return kernel(q, kc, vc, cache_seqlens=lens, block_table=table, causal=case.causal,
                      num_splits=case.num_splits, return_lse=True, layout=case.layout, out=o, **extra, **scores,
                      **kv_scales)
    o, lse = launch(out)
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
    heads = k.shape[1 if bhsd else 2]
    need = [-(-(cap if lengths is None else length) // pg) for length in (lengths or [None] * b)]
    pool_pages = sum(need) + spare
    order = torch.randperm(pool_pages, generator=generator, device=k.device)

    def noise(d):   # a pool of pages of d columns (V's may differ from K's)
        shape = [pool_pages, heads, pg, d] if bhsd else [pool_pages, pg, heads, d]
        return torch.randn(shape, generator=generator, device=k.device, dtype=torch.float32).to(k.dtype)

    kp, vp = noise(k.shape[3]), noise(v.shape[3])
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
            d = src.shape[3]
            pool[ids] = (rows.reshape(heads, n, pg, d).transpose(0, 1) if bhsd else rows.reshape(n, pg, heads, d))
    return kp, vp, table


def verify_cases(kernel, shapes, masks) -> list[tuple]:
    """The decode cases of `attngen verify` for the masks asked (the forward shapes only choose
    quick, fewer than the full suite, or full)."""
    cases = decode_cases(kernel.plan.block_n, kernel.plan.paged)
    if "expr" in masks:   # the expression is the only mask: every case through it (no causal= argument)
        cases = tuple(dict.fromkeys(replace(c, causal=False, expression=True) for c in cases))
    windows = window_cases(kernel.plan.block_n, kernel.plan.paged) if "window" in masks else ()
    appends = append_cases(kernel.plan.block_n, kernel.plan.paged, "window" in masks) if kernel.plan.append else ()
    if kernel.plan.v_in_k:   # a latent cache's own shapes first (--quick takes them)
        cases = latent_cases(kernel.plan.block_n, kernel.plan.paged) + cases
    if len(tuple(shapes)) < len(FULL_SUITE):
        cases, windows, appends = cases[:QUICK_CASES], windows[:QUICK_CASES], appends[:QUICK_CASES]
    out = []
    for i, case in enumerate(cases + windows + appends):
        if case.mask not in masks:
            continue
        check = check_append_case if case.appends else check_decode_case
        out.append((case.variant, kernel.entry[case.mask], case, i,
                    lambda seed, label, case=case, check=check: check(kernel, case, seed, label)))
    return out
