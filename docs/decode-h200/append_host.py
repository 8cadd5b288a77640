"""Host time of appending decode calls (FlashAttention's k=, v=, rotary_cos=, rotary_sin=): an append spec's
kernel called back to back on the full path every call (its prepared calls dropped before each: how every
append call ran before they had a prepared path) and on its prepared path, the public
attngen.attention_with_kvcache with and without new tokens; CPU, wall and GPU us per call with
docs/measurements/host_time.py's timers (rows round-robin, medians of 7 rounds).

Usage: python3 docs/decode-h200/append_host.py OUT.json"""
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "measurements"))
import host_time  # noqa: E402
import attngen  # noqa: E402

g = torch.Generator(device="cuda").manual_seed(0)
results = []
for d, spec, extra in ((128, "h200_decode_d128_append", {}),
                       (256, "h200_decode_d256_append_alibi", {"alibi": True, "window": (1024, 0), "paged": 16})):
    b, h, kvh, cap = 8, 32, 8, 4096
    r = lambda *s: torch.randn(s, generator=g, device="cuda").half()   # noqa: E731
    q, kn, vn = r(b, 1, h, d), r(b, 1, kvh, d), r(b, 1, kvh, d)
    angle = torch.rand((cap, d // 2), generator=g, device="cuda") * 6.283185307179586
    cos, sin = angle.cos().half(), angle.sin().half()
    lens = torch.full((b,), cap // 2, dtype=torch.int32, device="cuda")
    lens1 = lens + 1
    kw = {"causal": True, "layout": "bshd"}
    if extra.get("paged"):
        page = extra["paged"]
        kc, vc = r(b * cap // page, page, kvh, d), r(b * cap // page, page, kvh, d)
        kw["block_table"] = torch.randperm(b * cap // page, generator=g, device="cuda").int().view(b, -1)
    else:
        kc, vc = r(b, cap, kvh, d), r(b, cap, kvh, d)
    if extra.get("alibi"):
        kw["alibi_slopes"] = torch.rand(h, generator=g, device="cuda") * 0.1
    if extra.get("window"):
        kw.pop("causal")
        kw["window"] = extra["window"]
    kernel = attngen.load(str(ROOT / "specs" / f"{spec}.yaml"))
    label = f"B{b} {h}/{kvh} d{d} cache {cap}{' pages of 16' if extra.get('paged') else ''}" + \
        (" alibi window" if extra.get("alibi") else " causal")

    def full_path():
        kernel._prepared.clear()
        kernel(q, kc, vc, cache_seqlens=lens, k=kn, v=vn, rotary_cos=cos, rotary_sin=sin, **kw)

    results.append(host_time.row(f"{label}: {spec} full path every call", full_path))
    results.append(host_time.row(f"{label}: {spec} prepared", lambda: kernel(
        q, kc, vc, cache_seqlens=lens, k=kn, v=vn, rotary_cos=cos, rotary_sin=sin, **kw)))
    results.append(host_time.row(f"{label}: attention_with_kvcache append", lambda: attngen.attention_with_kvcache(
        q, kc, vc, kn, vn, cos, sin, cache_seqlens=lens, **kw)))
    results.append(host_time.row(f"{label}: attention_with_kvcache, no append", lambda: attngen.attention_with_kvcache(
        q, kc, vc, cache_seqlens=lens1, **kw)))
    host_time.measure_rows()
json.dump({"command": "python3 docs/decode-h200/append_host.py OUT.json", "device": torch.cuda.get_device_name(),
           "torch": torch.__version__, "rows": results}, open(sys.argv[1], "w"), indent=1)
