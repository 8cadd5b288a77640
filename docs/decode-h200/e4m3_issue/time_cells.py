"""e4m3-cache decode cells at their default split counts: GPU us queued (median of 30 calls, caches rotated past L2),
and a hash of each output's bytes on a fixed input, so that two trees' runs can be compared bit for bit.
Usage: python3 docs/decode-h200/e4m3_issue/time_cells.py OUT.json [CELL_SUBSTRING]  (only the cells whose name holds it)"""
import hashlib, json, sys
import torch
from attngen.runtime import load
from attngen.eval.bench.decode import median_time_us
from attngen.eval.verify.decode import paged_cache

# (cell, B, heads, KV heads, keys, pages): fp16 queries unless the cell says bf16; pages of 16 where paged
CASES = [("h200_decode_d128_kv_e4m3_contiguous_s2", 8, 32, 8, 8192, False),
         ("h200_decode_d128_kv_e4m3_contiguous_s2", 8, 32, 8, 16384, False),
         ("h200_decode_d128_kv_e4m3_contiguous_s2", 8, 32, 8, 32768, False),
         ("h200_decode_d128_kv_e4m3_contiguous_s2", 32, 32, 8, 4096, False),
         ("h200_decode_d128_kv_e4m3_contiguous_s2_bf16", 8, 32, 8, 16384, False),
         ("h200_decode_d128_kv_e4m3_contiguous", 1, 32, 8, 32768, False),
         ("h200_decode_d128_kv_e4m3_contiguous", 4, 32, 8, 4096, False),
         ("h200_decode_d128_kv_e4m3", 8, 32, 8, 8192, True),
         ("h200_decode_d128_kv_e4m3", 8, 32, 8, 16384, True),
         ("h200_decode_d128_kv_e4m3", 1, 32, 8, 32768, True),
         ("h200_decode_d128_kv_e4m3_contiguous_pairs", 8, 64, 8, 8192, False),
         ("h200_decode_d64_kv_e4m3_contiguous", 8, 32, 8, 16384, False),
         ("h200_decode_d64_kv_e4m3", 8, 32, 8, 16384, True),
         ("h200_decode_d256_kv_e4m3", 8, 32, 8, 8192, False)]
kernels = {}
out = {"command": "python3 docs/decode-h200/e4m3_issue/time_cells.py OUT.json", "gpu": torch.cuda.get_device_name(),
       "torch": torch.__version__, "note": "k_scale 0.7, v_scale 1.3 per tensor; 3 rounds of the median of 30 calls",
       "rows": []}
for name, b, h, hkv, sk, paged in CASES:
    if len(sys.argv) > 2 and sys.argv[2] not in name:
        continue
    kernel = kernels.setdefault(name, load(f"specs/{name}.yaml"))
    d = kernel.plan.head_dim
    dt = torch.bfloat16 if name.endswith("bf16") else torch.float16
    rot = max(2, min(8, int(3 * 60e6 // (2 * b * hkv * sk * d)) + 1))
    g = torch.Generator(device="cuda").manual_seed(1)
    qs = [torch.randn((b, h, 1, d), generator=g, device="cuda").to(dt) for _ in range(rot)]
    lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
    caches = []
    for _ in range(rot):
        k = torch.randn((b, hkv, sk, d), generator=g, device="cuda").half()
        v = torch.randn((b, hkv, sk, d), generator=g, device="cuda").half()
        if paged:
            kp, vp, table = paged_cache(torch, k, v, None, 16, "bhsd", spare=0)[:3]
            caches.append((kp.to(torch.float8_e4m3fn), vp.to(torch.float8_e4m3fn), {"cache_seqlens": lens, "block_table": table}))
        else:
            caches.append((k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn), {}))
        del k, v
    kw = {"k_scale": torch.tensor([0.7], device="cuda"), "v_scale": torch.tensor([1.3], device="cuda")}
    call = lambda i: kernel(qs[i], caches[i][0], caches[i][1], **caches[i][2], **kw)
    o = call(0); torch.cuda.synchronize()
    digest = hashlib.sha256(o.contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()[:16]
    times = [median_time_us(torch, call, 30, rot) for _ in range(3)]
    row = {"cell": name, "grid": f"B{b} {h}/{hkv} Sk{sk}" + (" pages16" if paged else ""), "splits": kernel.last_splits,
           "us": round(sorted(times)[1], 2), "rounds": [round(t, 2) for t in times], "out_sha": digest}
    out["rows"].append(row); print(json.dumps(row), flush=True)
    json.dump(out, open(sys.argv[1], "w"), indent=1)
    del qs, caches; torch.cuda.empty_cache()
