"""Decode with append (flash_attn_with_kvcache's k=, v=, rotary) against the same decode without it:
GPU us (host_time.gpu_time: calls queued behind a GPU sleep, CUDA events, median of 7 rounds of 50),
bf16, causal, one new token per sequence, rotary over the whole head dim (GPT-NeoX pairs), a
contiguous cache and one of 16-key pages. Each call writes the same new rows (cache_seqlens does not
move), so every call does the same work. TB/s counts the K and V bytes the call reads.

Usage (GPU machine, repository root): python3 docs/decode-h200/append_bench.py [OUT.json]"""
import json
import sys
from pathlib import Path

import torch

import attngen
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))   # the shared helpers
from host_time import gpu_time

CELLS = [(b, 32, 8, 8192, d) for d in (64, 128, 256) for b in (1, 8, 32)]


def paged(cache, page):
    b, s, h, d = cache.shape
    pool = cache.reshape(b * s // page, page, h, d).contiguous()
    table = torch.arange(b * s // page, device="cuda", dtype=torch.int32).reshape(b, s // page)
    return pool, table


def run():
    rows = []
    for b, hq, hkv, cap, d in CELLS:
        g = torch.Generator(device="cuda").manual_seed(d + b)
        q = torch.randn(b, 1, hq, d, device="cuda", generator=g, dtype=torch.bfloat16)
        kc, vc = (torch.randn(b, cap, hkv, d, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(2))
        kn, vn = (torch.randn(b, 1, hkv, d, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(2))
        angles = torch.rand(cap, d // 2, device="cuda", generator=g) * 6.28
        cos, sin = angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)
        lens = torch.full((b,), cap - 1, dtype=torch.int32, device="cuda")
        row = {"shape": f"B{b} {hq}/{hkv} Sk{cap} d{d}"}
        nbytes = 2 * b * cap * hkv * d * 2
        for kind in ("contiguous", "paged16"):
            if kind == "paged16":
                kp, table = paged(kc, 16)
                vp, _ = paged(vc, 16)
                caches, extra = (kp, vp), {"block_table": table}
            else:
                caches, extra = (kc, vc), {}
            with torch.no_grad():
                plain = gpu_time(lambda: attngen.attention_with_kvcache(q, *caches, cache_seqlens=lens + 1, causal=True,
                                                                        layout="bshd", **extra))
                try:
                    app = gpu_time(lambda: attngen.attention_with_kvcache(q, *caches, kn, vn, cos, sin, cache_seqlens=lens,
                                                                          causal=True, rotary_interleaved=False,
                                                                          layout="bshd", **extra))
                except (LookupError, NotImplementedError, ValueError) as exc:
                    app = str(exc).splitlines()[0][:120]
            row[kind] = {"decode_us": round(plain, 2), "append_us": round(app, 2) if isinstance(app, float) else app,
                         "append_TBps": round(nbytes / app / 1e6, 2) if isinstance(app, float) else None}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


if __name__ == "__main__":
    out = run()
    if len(sys.argv) > 1:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": out},
                  open(sys.argv[1], "w"), indent=1)
