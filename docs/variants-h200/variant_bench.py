"""The built-in variants beside torch's peers in one process: sliding window, softcap and ALiBi.

Usage: python3 docs/variants-h200/variant_bench.py OUT.json [window,scores,scores64,expr,document,decode] [fp16|bf16]

- window: causal sliding windows of 256 / 1024 / 4096 keys (FlashAttention's window_size=(w, 0))
  at 4x16x8192 and 1x16x32768, d64 and d128, against torch.ops.aten._flash_attention_forward
  (FA2, window_size_left/right) and FlexAttention (compiled, a sliding-window mask_mod, its block
  mask built once outside the timing);
- scores: softcap 30 and ALiBi (slopes uniform below 0.3, per batch and head) at 4x16x2048 and
  2x16x8192, d128 and d64 (scores64: d64 alone), causal and not, against the spec they add the
  modifier to (PLAIN), FlexAttention
  with the equivalent score_mod, and (ALiBi) SDPA's memory-efficient backend with the bias as a
  float attn_mask; torch's FA2 build has no ALiBi (it refuses alibi_slopes).

- expr: the expression specs (h100_{mma,wgmma}_d128_expr_*) beside the built-in they write out
  (window, softcap, ALiBi: the hand-written spec with the same tiles) and FlexAttention with the same
  mod: a causal window of 256 / 1024 / 4096 at 4x16x8192 and 1x16x32768; softcap 30, ALiBi (per-head slopes) and
  both at 4x16x2048 and 2x16x8192, causal; a prefix-LM mask (prefix 1024) at 4x16x2048, 2x16x8192
  and 1x16x32768; document masking: 16 packed documents of 256..2048 tokens (causal within each),
  attngen's varlen call against Flex's document mask_mod on the packed sequence.
- decode: one new token against a KV cache (B x 32/8 heads x Sk, d128, contiguous, fp16 only):
  h200_decode_d128 over the whole cache (causal) beside h200_decode_d128_window with causal windows
  of 256 / 1024 / 4096, against torch.ops.aten._flash_attention_forward (FA2, Sq 1, causal
  bottom-right, window_size_left); softcap 30 and ALiBi (h200_decode_d128_softcap / _alibi) against
  the plain spec; the expression specs h200_decode_d128_expr_window and _expr_softcap_alibi beside
  them. A window reads only its keys, so the calls rotate over 2 caches and up to 32
  window positions (cache_seqlens; FA2 gets the same keys as a slice).

GPU time: CUDA events around calls queued behind a GPU sleep, input sets rotated through more than
3x the L2 cache, median of 20 (attngen.eval.bench.time_calls); eager time: calls back to back with
the host included (time_eager). fp16 (or bf16: the *_bf16 specs), (B, S, H, D) tensors; each attngen
result is also compared with its peer (max |difference|).
"""
import json
import math
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from attngen.eval.bench import time_calls, time_eager
from attngen.runtime import load

DEV = torch.device("cuda")
GEN = torch.Generator(device=DEV).manual_seed(0)
REPS = 20
# One compiled FlexAttention per (shape, mod, mask): more than dynamo's default number of recompiles,
# past which it would fall back to the unfused (and unmeasurable) math path.
for _limit in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit"):
    if hasattr(torch._dynamo.config, _limit):
        setattr(torch._dynamo.config, _limit, 256)
FLEX = torch.compile(flex_attention, dynamic=False)
KERNELS: dict = {}
# The specs the softcap and ALiBi specs add their modifier to, per head dim (their cost is against these).
PLAIN = {128: {"mma": "h100_mma_d128", "wgmma": "h100_wgmma_d128_n128c2ps2r24x240ppet"},
         64: {"mma": "h100_mma_d64", "wgmma": "h100_wgmma_d64"}}
DTYPE = torch.float16
SUFFIX = ""     # the specs of DTYPE: "" (fp16) or "_bf16"


def kernel(name):
    """The spec `name` of the bench's dtype (its _bf16 twin for bf16)."""
    name += SUFFIX
    if name not in KERNELS:
        KERNELS[name] = load(f"specs/{name}.yaml")
    return KERNELS[name]


def padded(kern):
    """Whether a kernel takes padded calls: the mma.sync variant members (h100_mma_d{64,128,256}_<variant>) serve
    varlen calls only (varlen: only) and are left out of the padded rows; their committed figures predate that."""
    return kern.plan.spec.padded


def input_sets(b, h, s, d):
    """(q, k, v) sets in (B, S, H, D), enough to rotate through 3x the L2 cache (2 to 8)."""
    set_bytes = 3 * b * h * s * d * 2
    l2 = torch.cuda.get_device_properties(DEV).L2_cache_size
    n = max(2, min(8, math.ceil(3 * l2 / set_bytes)))
    return [tuple(torch.randn(b, s, h, d, generator=GEN, device=DEV).to(DTYPE) for _ in range(3)) for _ in range(n)]


def bhsd(sets):
    return [tuple(t.transpose(1, 2).contiguous() for t in st) for st in sets]


def timed(fn, sets):
    gpu, _ = time_calls(torch, fn, sets, reps=REPS)
    return {"gpu_us": gpu, "eager_us": time_eager(torch, fn, sets, reps=REPS)}


def fa2(q, k, v, causal, scale, **kw):
    s = q.shape[1]
    return torch.ops.aten._flash_attention_forward(q, k, v, None, None, s, s, 0.0, causal, False, scale=scale,
                                                   **kw)[0]


def max_diff(a, b):
    return (a.float() - b.float()).abs().max().item()


def window_rows():
    rows = []
    for d in (128, 64):
        for b, h, s in ((4, 16, 8192), (1, 16, 32768)):
            sets = input_sets(b, h, s, d)
            fsets = bhsd(sets)
            scale = d ** -0.5
            for w in (256, 1024, 4096):
                q, k, v = sets[0]
                row = {"variant": "window", "d": d, "shape": f"{b}x{h}x{s}", "window": w}
                ref = fa2(q, k, v, True, scale, window_size_left=w, window_size_right=0)
                row["fa2"] = timed(lambda q, k, v: fa2(q, k, v, True, scale, window_size_left=w, window_size_right=0),
                                   sets)
                mask = create_block_mask(lambda b_, h_, qi, ki: (qi >= ki) & (qi - ki <= w), None, None, s, s)
                row["flex"] = timed(lambda q, k, v: FLEX(q, k, v, block_mask=mask, scale=scale), fsets)
                for kind in ("mma", "wgmma"):
                    kern = kernel(f"h100_{kind}_d{d}_window")
                    if not padded(kern):
                        continue
                    call = lambda q, k, v: kern(q, k, v, causal=True, window=(w, 0), layout="bshd", scale=scale)
                    row[kind] = {**timed(call, sets), "max_diff_fa2": max_diff(call(q, k, v), ref)}
                rows.append(row)
                print(json.dumps(row), flush=True)
            del sets, fsets
            torch.cuda.empty_cache()
    return rows


def score_rows(head_dims=(128, 64)):
    return [row for d in head_dims for row in score_rows_at(d)]


def score_rows_at(d):
    rows = []
    scale = d ** -0.5
    for b, h, s in ((4, 16, 2048), (2, 16, 8192)):
        sets = input_sets(b, h, s, d)
        fsets = bhsd(sets)
        slopes = torch.rand(b, h, generator=GEN, device=DEV) * 0.3
        mods = {"softcap": lambda x, b_, h_, qi, ki: 30.0 * torch.tanh(x / 30.0),
                "alibi": lambda x, b_, h_, qi, ki: x - slopes[b_, h_] * (qi - ki).abs()}
        args = {"softcap": {"softcap": 30.0}, "alibi": {"alibi_slopes": slopes}}
        for causal in (False, True):
            q, k, v = sets[0]
            mask = create_block_mask(lambda b_, h_, qi, ki: qi >= ki, None, None, s, s) if causal else None
            row = {"variant": "scores", "d": d, "shape": f"{b}x{h}x{s}", "causal": causal,
                   "fa2": timed(lambda q, k, v: fa2(q, k, v, causal, scale), sets)}
            i = torch.arange(s, device=DEV)
            bias = (-slopes[:, :, None, None] * (i[:, None] - i[None, :]).abs().float()).to(DTYPE)
            if causal:
                bias = bias.masked_fill(i[:, None] < i[None, :], float("-inf"))

            def efficient(q, k, v):
                with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)
            row["sdpa_efficient_alibi"] = timed(efficient, fsets)
            alibi_ref = efficient(*fsets[0]).transpose(1, 2)
            del bias
            for name, mod in mods.items():
                row[f"flex_{name}"] = timed(lambda q, k, v: FLEX(q, k, v, score_mod=mod, block_mask=mask, scale=scale),
                                            fsets)
            for kind in ("mma", "wgmma"):
                if not padded(kernel(f"h100_{kind}_d{d}_alibi")):
                    continue
                plain = kernel(PLAIN[d][kind])
                row[kind] = timed(lambda q, k, v: plain(q, k, v, causal=causal, layout="bshd", scale=scale), sets)
                for name in mods:
                    kern = kernel(f"h100_{kind}_d{d}_{name}")
                    call = lambda q, k, v: kern(q, k, v, causal=causal, layout="bshd", scale=scale, **args[name])
                    row[f"{kind}_{name}"] = timed(call, sets)
                row[f"{kind}_alibi"]["max_diff_sdpa"] = max_diff(
                    kernel(f"h100_{kind}_d{d}_alibi")(q, k, v, causal=causal, layout="bshd", scale=scale,
                                                     alibi_slopes=slopes), alibi_ref)
            rows.append(row)
            print(json.dumps(row), flush=True)
        del sets, fsets
        torch.cuda.empty_cache()
    return rows


def add(row, name, fn, sets, ref=None):
    """Time fn over the input sets into row[name]; with a reference, its max |difference| on the first."""
    row[name] = timed(fn, sets)
    if ref is not None:
        row[name]["max_diff"] = max_diff(fn(*sets[0]), ref)


def expr_rows():
    rows = []
    d = 128
    scale = d ** -0.5

    for b, h, s in ((4, 16, 8192), (1, 16, 32768)):
        sets = input_sets(b, h, s, d)
        fsets = bhsd(sets)
        for w in (256, 1024, 4096):
            row = {"variant": "expr_window", "d": d, "shape": f"{b}x{h}x{s}", "window": w}
            mask = create_block_mask(lambda b_, h_, qi, ki: (qi >= ki) & (qi - ki <= w), None, None, s, s)
            flex = lambda q, k, v: FLEX(q, k, v, block_mask=mask, scale=scale)
            add(row, "flex", flex, fsets)
            ref = flex(*fsets[0]).transpose(1, 2)
            for kind in ("mma", "wgmma"):
                hand, expr = kernel(f"h100_{kind}_d128_window"), kernel(f"h100_{kind}_d128_expr_window")
                if padded(hand):
                    add(row, f"{kind}_builtin", lambda q, k, v: hand(q, k, v, causal=True, window=(w, 0), layout="bshd",
                                                                      scale=scale), sets, ref)
                add(row, f"{kind}_expr", lambda q, k, v: expr(q, k, v, params={"left": w}, layout="bshd", scale=scale),
                    sets, ref)
            rows.append(row)
            print(json.dumps(row), flush=True)
        del sets, fsets
        torch.cuda.empty_cache()
    for b, h, s in ((4, 16, 2048), (2, 16, 8192)):
        sets = input_sets(b, h, s, d)
        fsets = bhsd(sets)
        slopes = torch.rand(h, generator=GEN, device=DEV) * 0.3
        mask = create_block_mask(lambda b_, h_, qi, ki: qi >= ki, None, None, s, s)
        mods = {"softcap": lambda x, b_, h_, qi, ki: 30.0 * torch.tanh(x / 30.0),
                "alibi": lambda x, b_, h_, qi, ki: x - slopes[h_] * (qi - ki).abs(),
                "softcap_alibi": lambda x, b_, h_, qi, ki: 30.0 * torch.tanh(x / 30.0) - slopes[h_] * (qi - ki).abs()}
        params = {"softcap": {"cap": 30.0}, "alibi": {"slope": slopes}, "softcap_alibi": {"cap": 30.0, "slope": slopes}}
        builtin = {"softcap": {"softcap": 30.0}, "alibi": {"alibi_slopes": slopes}}
        for name, mod in mods.items():
            row = {"variant": f"expr_{name}", "d": d, "shape": f"{b}x{h}x{s}", "causal": True}
            flex = lambda q, k, v: FLEX(q, k, v, score_mod=mod, block_mask=mask, scale=scale)
            add(row, "flex", flex, fsets)
            ref = flex(*fsets[0]).transpose(1, 2)
            for kind in ("mma", "wgmma"):
                hand = kernel(f"h100_{kind}_d128_{name}") if name in builtin else None
                if hand is not None and padded(hand):
                    add(row, f"{kind}_builtin", lambda q, k, v: hand(q, k, v, causal=True, layout="bshd", scale=scale,
                                                                      **builtin[name]), sets, ref)
                expr = kernel(f"h100_{kind}_d128_expr_{name}")
                add(row, f"{kind}_expr", lambda q, k, v: expr(q, k, v, causal=True, layout="bshd", scale=scale,
                                                               params=params[name]), sets, ref)
            rows.append(row)
            print(json.dumps(row), flush=True)
        del sets, fsets
        torch.cuda.empty_cache()
    prefix = 1024
    for b, h, s in ((4, 16, 2048), (2, 16, 8192), (1, 16, 32768)):
        sets = input_sets(b, h, s, d)
        fsets = bhsd(sets)
        row = {"variant": "expr_prefix_lm", "d": d, "shape": f"{b}x{h}x{s}", "prefix": prefix}
        mask = create_block_mask(lambda b_, h_, qi, ki: (ki < prefix) | (qi >= ki), None, None, s, s)
        flex = lambda q, k, v: FLEX(q, k, v, block_mask=mask, scale=scale)
        add(row, "flex", flex, fsets)
        ref = flex(*fsets[0]).transpose(1, 2)
        for kind in ("mma", "wgmma"):
            expr = kernel(f"h100_{kind}_d128_expr_prefix_lm")
            add(row, f"{kind}_expr", lambda q, k, v: expr(q, k, v, params={"prefix": prefix}, layout="bshd",
                                                           scale=scale), sets, ref)
            plain = kernel(PLAIN[128][kind])
            add(row, f"{kind}_causal", lambda q, k, v: plain(q, k, v, causal=True, layout="bshd", scale=scale), sets)
        rows.append(row)
        print(json.dumps(row), flush=True)
        del sets, fsets
        torch.cuda.empty_cache()
    return rows + document_rows()


def document_rows():
    """Document masking: 16 packed documents of 256..2048 tokens, causal within each: the expression
    specs' varlen call (mma.sync and Hopper) and the built-in causal varlen call beside Flex's
    document mask_mod on the packed sequence."""
    rows = []
    d = 128
    scale = d ** -0.5
    # document masking: packed documents, causal within each
    lens = (torch.randint(256, 2049, (16,), generator=GEN, device=DEV)).tolist()
    total, h = sum(lens), 16
    cu = torch.tensor([0] + list(__import__("itertools").accumulate(lens)), device=DEV, dtype=torch.int32)
    doc = torch.repeat_interleave(torch.arange(len(lens), device=DEV), torch.tensor(lens, device=DEV))
    n = max(2, min(8, math.ceil(3 * torch.cuda.get_device_properties(DEV).L2_cache_size / (3 * total * h * d * 2))))
    packed = [tuple(torch.randn(total, h, d, generator=GEN, device=DEV).to(DTYPE) for _ in range(3)) for _ in range(n)]
    fsets = [tuple(t.transpose(0, 1).unsqueeze(0).contiguous() for t in st) for st in packed]
    mask = create_block_mask(lambda b_, h_, qi, ki: (doc[qi] == doc[ki]) & (qi >= ki), None, None, total, total)
    row = {"variant": "expr_document", "d": d, "shape": f"{len(lens)} docs, {total} tokens, {h} heads"}
    flex = lambda q, k, v: FLEX(q, k, v, block_mask=mask, scale=scale)
    add(row, "flex", flex, fsets)
    ref = flex(*fsets[0])[0].transpose(0, 1)
    mx = max(lens)
    # the built-in causal varlen call: the mma.sync expression's tiles (its window spec's window function,
    # unbounded on the left) and the Hopper varlen spec (the ping-pong base of the Hopper expression)
    for kind, builtin, kw in (("mma", "h100_mma_d128_window", {"window": (1 << 20, 0)}),
                              ("wgmma", "h100_wgmma_d128_varlen", {})):
        expr, hand = kernel(f"h100_{kind}_d128_expr_document"), kernel(builtin)
        add(row, f"{kind}_expr", lambda q, k, v: expr.varlen(q, k, v, cu, cu, max_seqlen_q=mx, scale=scale), packed,
            ref)
        add(row, f"{kind}_builtin_causal", lambda q, k, v: hand.varlen(q, k, v, cu, cu, max_seqlen_q=mx, scale=scale,
                                                                       causal=True, **kw), packed, ref)
    rows.append(row)
    print(json.dumps(row), flush=True)
    return rows


def decode_rows():
    rows = []
    d, h, hk = 128, 32, 8
    scale = d ** -0.5
    plain, windowed = kernel("h200_decode_d128"), kernel("h200_decode_d128_window")
    softcap, alibi = kernel("h200_decode_d128_softcap"), kernel("h200_decode_d128_alibi")
    expr_window, expr_scores = kernel("h200_decode_d128_expr_window"), kernel("h200_decode_d128_expr_softcap_alibi")
    for b, cap in ((1, 32768), (8, 32768), (8, 8192)):
        caches = [tuple(torch.randn(b, cap, hk, d, generator=GEN, device=DEV).to(DTYPE) for _ in range(2))
                  for _ in range(2)]
        q = torch.randn(b, 1, h, d, generator=GEN, device=DEV).to(DTYPE)
        slopes = torch.rand(b, h, generator=GEN, device=DEV) * 0.3
        for w in (None, 4096, 1024, 256):
            span = cap if w is None else w + 1
            positions = 1 if w is None else max(1, min(32, (cap - span) // (span + 128) + 1))
            sets = [(c, cap - j * (span + 128)) for c in range(len(caches)) for j in range(positions)]
            lens = {length: torch.full((b,), length, dtype=torch.int32, device=DEV) for _, length in sets}
            window = {} if w is None else {"window_size_left": w, "window_size_right": 0}

            def peer(c, length):
                kc, vc = caches[c]
                return torch.ops.aten._flash_attention_forward(q, kc[:, :length], vc[:, :length], None, None, 1,
                                                               length, 0.0, True, False, scale=scale, **window)[0]

            def ours(c, length, kern=plain if w is None else windowed, **kw):
                kc, vc = caches[c]
                return kern(q, kc, vc, cache_seqlens=lens[length], causal=True, layout="bshd", scale=scale,
                            **({} if w is None else {"window": (w, 0)}), **kw)
            row = {"variant": "decode", "d": d, "shape": f"B{b} {h}/{hk} Sk{cap}", "window": w,
                   "positions": len(sets), "fa2": timed(peer, sets)}
            row["attngen"] = {**timed(ours, sets), "max_diff_fa2": max_diff(ours(*sets[0]), peer(*sets[0]))}
            if w is None:
                row["softcap"] = timed(lambda c, length: ours(c, length, softcap, softcap=30.0), sets)
                row["alibi"] = timed(lambda c, length: ours(c, length, alibi, alibi_slopes=slopes), sets)
                head_slopes = slopes[0].contiguous()
                row["expr_softcap_alibi"] = timed(lambda c, length: expr_scores(
                    q, caches[c][0], caches[c][1], cache_seqlens=lens[length], causal=True, layout="bshd",
                    scale=scale, params={"cap": 30.0, "slope": head_slopes}), sets)
            else:
                def expression(c, length):
                    return expr_window(q, caches[c][0], caches[c][1], cache_seqlens=lens[length], layout="bshd",
                                       scale=scale, params={"left": w})
                row["expr_window"] = {**timed(expression, sets),
                                      "max_diff_builtin": max_diff(expression(*sets[0]), ours(*sets[0]))}
            rows.append(row)
            print(json.dumps(row), flush=True)
        del caches
        torch.cuda.empty_cache()
    return rows


def main():
    global DTYPE, SUFFIX
    out = sys.argv[1]
    which = sys.argv[2].split(",") if len(sys.argv) > 2 else ["window", "scores"]
    if len(sys.argv) > 3 and sys.argv[3] == "bf16":
        DTYPE, SUFFIX = torch.bfloat16, "_bf16"
    rows = ((window_rows() if "window" in which else []) + (score_rows() if "scores" in which else [])
            + (score_rows((64,)) if "scores64" in which else [])
            + (expr_rows() if "expr" in which else []) + (document_rows() if "document" in which else [])
            + (decode_rows() if "decode" in which else []))
    with open(out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "dtype": str(DTYPE),
                   "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
