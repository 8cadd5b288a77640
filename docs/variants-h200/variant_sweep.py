"""Every variant combination at FlashAttention's test head dims (32-256, 59 and 111 among them) through the
entry points, called as FlashAttention's tests call them (seqlen_q != seqlen_k, bottom-right masks, GQA 4/2,
a window of (48, 17)): a training step through attention, varlen training through attention_varlen (three
sequences of 1/77, 129/129 and 300/301 queries/keys) and a paged decode step through attention_with_kvcache,
bf16, causal and not (decode: causal). Each is checked against the fp32 reference under the error rule: out,
dq, dk, dv (the rounding floor added for gradients; varlen judged over the batch) and the sinks' gradient
(plus 1e-3; torch's error there the larger of its autograd's and what its own output's error moves the
gradient by when taken from the output, as attngen's backward takes it). A call the table does not serve
is recorded as refused. Prints counts per head dim and every row that did not pass; writes the rows to
OUT.json.

Usage (GPU machine, repository root, after `attngen warm --arch sm_90`): python3 docs/variants-h200/variant_sweep.py OUT.json"""
import json
import sys
import traceback

import torch

import attngen
from attngen.core.variants import ALIBI, SINK, SOFTCAP
from attngen.eval.verify.backward import rounding_floor, sink_output_error
from attngen.eval.verify.cases import attention_torch, error_bound, exact_fp32_matmul
from attngen.eval.verify.decode import DecodeCase, paged_cache, reference
from attngen.runtime.calls.varlen import cu_seqlens

DIMS = (32, 40, 59, 64, 80, 96, 111, 128, 160, 192, 224, 256)
COMBOS = {
    "plain": {}, "window": {"window": (48, 17)}, "softcap": {"softcap": 30.0}, "alibi": {"alibi": True},
    "softcap_alibi": {"softcap": 30.0, "alibi": True}, "window_softcap": {"window": (48, 17), "softcap": 30.0},
    "window_alibi": {"window": (48, 17), "alibi": True},
    "window_softcap_alibi": {"window": (48, 17), "softcap": 30.0, "alibi": True},
    "sinks": {"sinks": True}, "window_sinks": {"window": (48, 17), "sinks": True},
    # sinks beside softcap, ALiBi or both: the *_sink members hold them (trained) in the forward and varlen
    # calls; decode joins them after the kernel of the others (ops.library.join_sinks)
    "softcap_sinks": {"softcap": 30.0, "sinks": True}, "window_softcap_sinks": {"window": (48, 17), "softcap": 30.0, "sinks": True},
    "alibi_sinks": {"alibi": True, "sinks": True},
    "window_softcap_alibi_sinks": {"window": (48, 17), "softcap": 30.0, "alibi": True, "sinks": True},
}
DT = torch.bfloat16
results = []


def call_args(combo, heads, grad):
    kw = {}
    if "window" in combo:
        kw["window"] = combo["window"]
    if "softcap" in combo:
        kw["softcap"] = combo["softcap"]
    if combo.get("alibi"):
        kw["alibi_slopes"] = torch.rand(heads, device="cuda") * 0.3
    if combo.get("sinks"):
        kw["sinks"] = (torch.randn(heads, device="cuda") * 2).requires_grad_(grad and combo["sinks"] != "frozen")
    return kw


def ref_setup(kw, causal):
    window = kw.get("window")
    if window is not None:
        mask, window = "window", (window[0], 0 if causal else window[1])
    else:
        mask = "causal" if causal else "none"
    return mask, window


def mods(kw, sinks):
    return tuple((v, sinks if v is SINK else kw[v.argument]) for v in (SOFTCAP, ALIBI, SINK) if kw.get(v.argument) is not None)


def ref_grads(q, k, v, dout, kw, causal, d):
    mask, window = ref_setup(kw, causal)
    out = []
    for precise in (True, False):
        xs = [(x.detach().float() if precise else x.detach()).requires_grad_() for x in (q, k, v)]
        sinks = kw["sinks"].detach().float().requires_grad_() if "sinks" in kw else None
        with exact_fp32_matmul(torch):
            o, lse = attention_torch(*xs, scale=d ** -0.5, mask=mask, window=window,
                                     alignment=None if mask == "none" else "bottom_right", modifiers=mods(kw, sinks))
            g = torch.autograd.grad(o, xs + ([sinks] if sinks is not None else []), dout.to(o.dtype))
        out.append((o, g, lse, sinks))
    (ref, rg, lse_ref, sinks), (low, lg, _, _) = out
    if sinks is not None:   # torch's d sink error by the saved-output route: its own output's error
        lg = (*lg, sink_output_error(torch, dout, low.detach(), ref.detach(), lse_ref.detach(), sinks.detach()))
    return (ref, rg), (low, lg)


def judge(worst):
    """worst: {name: [err, low_err, floor]} -> (largest err / bound, its name and figures)."""
    name = max(worst, key=lambda n: worst[n][0] / (error_bound(worst[n][1]) + worst[n][2]))
    e, lo, fl = worst[name]
    return e / (error_bound(lo) + fl), f"{name} err {e:.3g} torch {lo:.3g} floor {fl:.3g}"


def record(call, name, d, causal, fn):
    row = {"call": call, "combo": name, "d": d, "causal": causal}
    try:
        ratio = fn()
        if isinstance(ratio, tuple):
            ratio, row["worst"] = ratio
        row["ratio"] = round(ratio, 3)
        row["status"] = "pass" if row["ratio"] <= 1 else "FAIL"
    except (LookupError, NotImplementedError) as exc:
        row["status"], row["why"] = "refused", str(exc).splitlines()[0][:200]
    except Exception as exc:     # noqa: BLE001
        row["status"], row["why"] = "ERROR", f"{type(exc).__name__}: {exc}"[:300]
        traceback.print_exc()
    results.append(row)


def dense(name, d, causal):
    combo = COMBOS[name]
    g = torch.Generator(device="cuda").manual_seed(d)
    q = torch.randn(2, 4, 197, d, device="cuda", generator=g).to(DT).requires_grad_()
    k, v = (torch.randn(2, 2, 311, d, device="cuda", generator=g).to(DT).requires_grad_() for _ in range(2))
    kw = call_args(combo, 4, True)
    align = "bottom_right" if causal or "window" in kw else None
    o = attngen.attention(q, k, v, causal=causal, alignment=align, **kw)
    dout = torch.randn_like(o)
    leaves = (q, k, v) + ((kw["sinks"],) if "sinks" in kw and kw["sinks"].requires_grad else ())
    grads = torch.autograd.grad(o, leaves, dout)
    (ref, rg), (low, lg) = ref_grads(q, k, v, dout, kw, causal, d)
    worst = {"out": [(o.float() - ref).abs().max().item(), (low.float() - ref).abs().max().item(), 0.0]}
    for n, a, r, lo in zip(("dq", "dk", "dv", "dsinks"), grads, rg, lg):
        worst[n] = [(a.float() - r).abs().max().item(), (lo.float() - r).abs().max().item(),
                    rounding_floor(torch, r, DT) + (1e-3 if n == "dsinks" else 0.0)]
        if n == "dsinks":   # torch's error: by its autograd or by its output, the larger
            worst[n][1] = max(worst[n][1], lg[4].abs().max().item())
    return judge(worst)


LQ, LK = (1, 129, 300), (77, 129, 301)


def varlen(name, d, causal):
    combo = COMBOS[name]
    g = torch.Generator(device="cuda").manual_seed(100 + d)
    q = torch.randn(sum(LQ), 4, d, device="cuda", generator=g).to(DT).requires_grad_()
    k, v = (torch.randn(sum(LK), 2, d, device="cuda", generator=g).to(DT).requires_grad_() for _ in range(2))
    cq, ck = cu_seqlens(torch, list(LQ), "cuda"), cu_seqlens(torch, list(LK), "cuda")
    kw = call_args(combo, 4, True)
    align = "bottom_right" if causal or "window" in kw else None   # FA's varlen convention (attngen's default: top_left)
    o = attngen.attention_varlen(q, k, v, cq, ck, max(LQ), max(LK), causal=causal, alignment=align, **kw)
    dout = torch.randn_like(o)
    leaves = (q, k, v) + ((kw["sinks"],) if "sinks" in kw and kw["sinks"].requires_grad else ())
    grads = torch.autograd.grad(o, leaves, dout)
    worst = {n: [0.0, 0.0, 0.0] for n in ("out", "dq", "dk", "dv")}
    sink_ref = sink_low = sink_by_output = 0.0
    aq = ak = 0
    for nq, nk in zip(LQ, LK):
        def t(x, a, n):
            return x.detach()[a:a + n].transpose(0, 1)[None]
        (ref, rg), (low, lg) = ref_grads(t(q, aq, nq), t(k, ak, nk), t(v, ak, nk), t(dout, aq, nq), kw, causal, d)
        pairs = (("out", t(o, aq, nq), ref, low, False), ("dq", t(grads[0], aq, nq), rg[0], lg[0], True),
                 ("dk", t(grads[1], ak, nk), rg[1], lg[1], True), ("dv", t(grads[2], ak, nk), rg[2], lg[2], True))
        for n, a, r, lo, floor in pairs:
            w = worst[n]
            w[0] = max(w[0], (a.float() - r).abs().max().item())
            w[1] = max(w[1], (lo.float() - r).abs().max().item())
            if floor:
                w[2] = max(w[2], rounding_floor(torch, r, DT))
        if len(leaves) == 4:
            sink_ref, sink_low, sink_by_output = sink_ref + rg[3], sink_low + lg[3], sink_by_output + lg[4]
        aq, ak = aq + nq, ak + nk
    if len(leaves) == 4:
        worst["dsinks"] = [(grads[3].float() - sink_ref).abs().max().item(),
                           max((sink_low.float() - sink_ref).abs().max().item(), sink_by_output.abs().max().item()),
                           1e-3]
    return judge(worst)


def decode(name, d, causal):
    combo = COMBOS[name]
    g = torch.Generator(device="cuda").manual_seed(200 + d)
    lengths = (700, 33, 1)
    q = torch.randn(3, 8, 1, d, device="cuda", generator=g).to(DT)
    k, v = (torch.randn(3, 2, 700, d, device="cuda", generator=g).to(DT) for _ in range(2))
    kw = call_args(combo, 8, False)
    mask, window = ref_setup(kw, causal)
    case = DecodeCase(3, 8, 2, 1, 700, lengths, causal=causal, window=window)
    ref, _, low = reference(torch, q, k, v, lengths, case, d ** -0.5, mods(kw, kw.get("sinks")))
    kp, vp, table = paged_cache(torch, k, v, lengths, 16, "bhsd")
    lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    with torch.no_grad():
        out = attngen.attention_with_kvcache(q, kp, vp, cache_seqlens=lens, block_table=table, causal=causal, **kw)
    return (out.float() - ref).abs().max().item() / error_bound((low.float() - ref).abs().max().item())


for d in DIMS:
    for name in COMBOS:
        for causal in (False, True):
            record("train", name, d, causal, lambda: dense(name, d, causal))
            record("varlen_train", name, d, causal, lambda: varlen(name, d, causal))
            if causal:
                record("decode", name, d, causal, lambda: decode(name, d, causal))
    done = [r for r in results if r["d"] == d]
    print(f"d{d}: " + ", ".join(f"{s} {sum(r['status'] == s for r in done)}" for s in ("pass", "FAIL", "refused", "ERROR")),
          flush=True)
summary = {s: sum(r["status"] == s for r in results) for s in ("pass", "FAIL", "refused", "ERROR")}
print("total", json.dumps(summary), "worst ratio", max(r.get("ratio", 0) for r in results))
for r in results:
    if r["status"] != "pass":
        print(r)
json.dump({"summary": summary, "rows": results}, open(sys.argv[1], "w"), indent=1)
