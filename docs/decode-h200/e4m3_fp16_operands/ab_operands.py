"""e4m3 decode with bf16 queries: bf16 tensor-core operands (the cells before kv_mma: fp16, as trial specs in
bf16_operands/; bit moves and an fma per byte pair) against fp16 operands (kv_mma: fp16: Q converted in registers,
one cvt.rn.f16x2.e4m3x2 per byte pair), and beside them the fp16-query cell on the same caches; alternating rounds
in one process, GPU us queued, caches rotated past L2; max |out - fp32 reference| of each where it fits.
GROUP: main (32/8, 8/1 and 32/32 heads; the d64 paged cell's fp16 operands as the trial in fp16_operands/, not
taken) or pairs (the merging cells of more than 4 query rows per KV head).
Usage (GPU machine, repository root): python3 docs/decode-h200/e4m3_fp16_operands/ab_operands.py OUT.json ROUNDS GROUP"""
import json, statistics, sys
import torch
from attngen.runtime import load
from attngen.eval.bench.decode import median_time_us
from attngen.eval.verify.decode import paged_cache

ROUNDS, GROUP = int(sys.argv[2]), sys.argv[3]
OLD = "docs/decode-h200/e4m3_fp16_operands/bf16_operands/"
SETS = {  # (label, paged, head_dim, bf16 operands, fp16 operands, fp16-query cell)
    "main": [
        ("d128 contiguous", False, 128, OLD + "h200_dec_d128_e4m3_s2_old_bf16.yaml",
         "specs/h200_decode_d128_kv_e4m3_contiguous_s2_bf16.yaml", "specs/h200_decode_d128_kv_e4m3_contiguous_s2.yaml"),
        ("d128 pages of 16", True, 128, OLD + "h200_dec_d128_e4m3_paged_old_bf16.yaml",
         "specs/h200_decode_d128_kv_e4m3_bf16.yaml", "specs/h200_decode_d128_kv_e4m3.yaml"),
        ("d64 contiguous", False, 64, OLD + "h200_dec_d64_e4m3_contig_old_bf16.yaml",
         "specs/h200_decode_d64_kv_e4m3_contiguous_bf16.yaml", "specs/h200_decode_d64_kv_e4m3_contiguous.yaml"),
        ("d64 pages of 16", True, 64, "specs/h200_decode_d64_kv_e4m3_bf16.yaml",
         "docs/decode-h200/e4m3_fp16_operands/fp16_operands/h200_decode_d64_kv_e4m3_m16_bf16.yaml", "specs/h200_decode_d64_kv_e4m3.yaml")],
    "pairs": [
        ("d128 contiguous pairs", False, 128, OLD + "h200_dec_d128_e4m3_pairs_old_bf16.yaml",
         "specs/h200_decode_d128_kv_e4m3_contiguous_pairs_bf16.yaml", "specs/h200_decode_d128_kv_e4m3_contiguous_pairs.yaml"),
        ("d64 contiguous pairs", False, 64, OLD + "h200_dec_d64_e4m3_pairs_old_bf16.yaml",
         "specs/h200_decode_d64_kv_e4m3_contiguous_pairs_bf16.yaml", "specs/h200_decode_d64_kv_e4m3_contiguous_pairs.yaml")]}[GROUP]
CELLS = {"main": [(1, 32, 8, 8192), (1, 32, 8, 32768), (4, 32, 8, 16384), (8, 32, 8, 8192), (8, 32, 8, 32768),
                  (16, 32, 8, 16384), (64, 32, 8, 4096), (1, 8, 1, 32768), (8, 32, 32, 8192)],
         "pairs": [(1, 64, 8, 4096), (1, 64, 8, 32768), (2, 16, 1, 8192), (1, 32, 4, 16384), (8, 64, 8, 8192),
                   (4, 16, 2, 32768)]}[GROUP]
rows = []
out = {"command": f"python3 docs/decode-h200/e4m3_fp16_operands/ab_operands.py OUT.json {ROUNDS} {GROUP}", "gpu": torch.cuda.get_device_name(),
       "torch": torch.__version__, "note": "k_scale 0.7, v_scale 1.3 per tensor; median of 30 calls per round", "rows": rows}
for label, paged, d, old, new, f16 in SETS:
    kern = {"bf16": load(old), "bf16_kv_mma_fp16": load(new), "fp16_queries": load(f16)}
    for b, h, hkv, sk in CELLS:
        rot = max(2, min(8, int(3 * 60e6 // (2 * b * hkv * sk * d)) + 1))
        lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
        caches = []
        for _ in range(rot):
            k = torch.randn(b, hkv, sk, d, device="cuda", dtype=torch.float16)
            v = torch.randn(b, hkv, sk, d, device="cuda", dtype=torch.float16)
            if paged:
                kp, vp, table = paged_cache(torch, k, v, None, 16, "bhsd", spare=0)[:3]
                caches.append((kp.to(torch.float8_e4m3fn), vp.to(torch.float8_e4m3fn), table))
            else:
                caches.append((k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn), None))
            keep = (k, v) if not caches[1:] else keep
        qb = [torch.randn(b, h, 1, d, device="cuda", dtype=torch.bfloat16) for _ in range(rot)]
        qh = [q.to(torch.float16) for q in qb]
        kw = {"k_scale": torch.tensor([0.7], device="cuda"), "v_scale": torch.tensor([1.3], device="cuda")}

        def call(name, i, splits=None):
            q = qh[i] if name == "fp16_queries" else qb[i]
            k8, v8, table = caches[i]
            extra = {"cache_seqlens": lens, "block_table": table} if paged else {}
            return kern[name](q, k8, v8, **extra, **kw)

        r = {"set": label, "cell": f"B{b} {h}/{hkv} Sk{sk}"}
        if b * h * sk * d * 4 <= 5e8:
            kf = keep[0].to(torch.float8_e4m3fn).float() * 0.7
            vf = keep[1].to(torch.float8_e4m3fn).float() * 1.3
            ref = ((qb[0].float() @ kf.repeat_interleave(h // hkv, 1).transpose(-1, -2)) * d ** -0.5).softmax(-1) \
                @ vf.repeat_interleave(h // hkv, 1)
            for name in kern:
                r[name + "_err"] = float((call(name, 0).float() - ref).abs().max())
            del kf, vf, ref
        times = {n: [] for n in kern}
        for rnd in range(ROUNDS):
            for name in (list(kern) if rnd % 2 == 0 else list(kern)[::-1]):
                times[name].append(round(median_time_us(torch, lambda i: call(name, i), 30, rot), 2))
        for name in kern:
            r[name + "_us"] = round(statistics.median(times[name]), 2); r[name + "_rounds"] = times[name]
        r["bf16_over_kv_mma_fp16"] = round(r["bf16_us"] / r["bf16_kv_mma_fp16_us"], 4)
        rows.append(r)
        print(json.dumps({k: v for k, v in r.items() if not k.endswith("_rounds")}), flush=True)
        json.dump(out, open(sys.argv[1], "w"), indent=1)
        del caches, qb, qh, keep
        torch.cuda.empty_cache()
