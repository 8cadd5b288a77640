"""MLA decode through the entry point (attngen.attention_with_kvcache, the table's pick), GPU time and eager time
(back to back, host included), bf16, one latent cache (576 columns, V its first 512), caches rotated past L2.
Run once per tree to compare two trees' picks and kernels (the procedure in this folder's README).
Usage (GPU machine, repository root): python3 docs/decode-h200/mla_seesaw/issue_cost/entry_mla.py OUT.json LABEL"""
import json
import math
import sys

import torch

import attngen
from attngen.eval.bench.decode import eager_time_us, median_time_us

CELLS = ((16, 128, 16384, 0), (8, 128, 8192, 0), (32, 128, 4096, 0), (4, 128, 8192, 0), (32, 16, 4096, 0),
         (8, 128, 8192, 64), (32, 128, 4096, 64))


def cell(b, h, sk, page):
    g = torch.Generator(device="cuda").manual_seed(0)
    cache_bytes = b * sk * 576 * 2
    rot = max(2, min(8, int(3 * 60e6 // cache_bytes) + 1))
    qs = [torch.randn((b, 1, h, 576), generator=g, device="cuda").bfloat16() for _ in range(rot)]
    lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
    if page:
        pages = b * sk // page
        caches = [torch.randn((pages, page, 1, 576), generator=g, device="cuda").bfloat16() for _ in range(rot)]
        table = torch.randperm(pages, device="cuda", generator=g).to(torch.int32).reshape(b, sk // page)
    else:
        caches = [torch.randn((b, sk, 1, 576), generator=g, device="cuda").bfloat16() for _ in range(rot)]
        table = None

    def call(i):
        c = caches[i]
        return attngen.attention_with_kvcache(qs[i], c, c[..., :512], cache_seqlens=lens, block_table=table,
                                              layout="bshd", scale=1 / math.sqrt(192))
    gpu = median_time_us(torch, call, 30, rot)
    eager = eager_time_us(torch, call, 30, rot)
    flops = 2 * b * h * sk * (576 + 512)
    return {"cell": f"B{b} {h}/1 {sk}" + (f" pages of {page}" if page else ""), "gpu_us": round(gpu, 2),
            "eager_us": round(eager, 2), "TFLOP_s": round(flops / gpu / 1e6, 1)}


rows = [cell(*c) for c in CELLS]
for r in rows:
    print(sys.argv[2], json.dumps(r), flush=True)
json.dump({"label": sys.argv[2], "device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows},
          open(sys.argv[1], "w"), indent=1)
