"""The e4m3 combine-kernel cells (paged caches, pages of 16): the split pick today (COMBINE_KERNEL_CO_RESIDENT
((16, 128), (8, 256))) against the pick with (32, 64) added back (two blocks per SM counted from 32 blocks and 64
tiles, the rule these cells had before the slice-cost change), every cell of the grid where the two differ, both
counts forced, alternating rounds, GPU us queued, caches rotated past L2; error against fp32 where it fits.
Usage: python3 docs/decode-h200/e4m3_routing/co_resident_64.py OUT.json ROUNDS"""
import json, statistics, sys
import torch
import attngen.core.launch_rules as lr
from attngen.runtime import load
from attngen.runtime.calls.decode import num_splits_for
from attngen.eval.bench.decode import median_time_us
from attngen.eval.verify.decode import paged_cache

SM = torch.cuda.get_device_properties(0).multi_processor_count
ROUNDS = int(sys.argv[2])
NOW = ((16, 128), (8, 256))          # the rule from c3e5d982 to this change
WITH = ((32, 64), (16, 128), (8, 256))
assert lr.COMBINE_KERNEL_CO_RESIDENT == WITH, lr.COMBINE_KERNEL_CO_RESIDENT
LANDED = lr.COMBINE_KERNEL_CO_RESIDENT
SPECS = {"d128_e4m3": "specs/h200_decode_d128_kv_e4m3.yaml", "d128_e4m3_bf16": "specs/h200_decode_d128_kv_e4m3_bf16.yaml",
         "d64_e4m3": "specs/h200_decode_d64_kv_e4m3.yaml", "d256_e4m3": "specs/h200_decode_d256_kv_e4m3.yaml"}
HEADS = ((32, 8), (8, 1), (32, 32))
rows = []
out = {"command": f"python3 docs/decode-h200/e4m3_routing/co_resident_64.py OUT.json {ROUNDS}", "gpu": torch.cuda.get_device_name(),
       "torch": torch.__version__, "rows": rows}


def pick(plan, blocks, n_tiles, pairs):
    lr.COMBINE_KERNEL_CO_RESIDENT = pairs
    try:
        return num_splits_for(plan, blocks, n_tiles, SM)
    finally:
        lr.COMBINE_KERNEL_CO_RESIDENT = LANDED


for name, path in SPECS.items():
    kernel = load(path)
    plan, d = kernel.plan, kernel.plan.head_dim
    dt = torch.bfloat16 if name.endswith("bf16") else torch.float16
    for b in (1, 2, 4, 8, 16, 32, 64):
        for h, hkv in HEADS:
            for sk in (4096, 8192, 12288, 16384):
                blocks, n_tiles = b * hkv * lr.row_blocks(plan, h, hkv, 1), -(-sk // plan.block_n)
                picks = {"now": pick(plan, blocks, n_tiles, NOW), "with_32_64": pick(plan, blocks, n_tiles, WITH)}
                if picks["now"] == picks["with_32_64"]:
                    continue
                rot = max(2, min(8, int(3 * 60e6 // (2 * b * hkv * sk * d)) + 1))
                qs = [torch.randn(b, h, 1, d, device="cuda", dtype=dt) for _ in range(rot)]
                lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
                pools = []
                for _ in range(rot):
                    k = torch.randn(b, hkv, sk, d, device="cuda", dtype=torch.float16)
                    v = torch.randn(b, hkv, sk, d, device="cuda", dtype=torch.float16)
                    kp, vp, table = paged_cache(torch, k, v, None, 16, "bhsd", spare=0)[:3]
                    pools.append((kp.to(torch.float8_e4m3fn), vp.to(torch.float8_e4m3fn), table, k, v))
                    del kp, vp
                kw = {"k_scale": torch.tensor([0.7], device="cuda"), "v_scale": torch.tensor([1.3], device="cuda")}
                call = lambda i, n: kernel(qs[i], pools[i][0], pools[i][1], cache_seqlens=lens, block_table=pools[i][2],
                                           num_splits=n, **kw)
                r = {"spec": name, "cell": f"B{b} {h}/{hkv} Sk{sk}", "blocks": blocks, "tiles": n_tiles, "picks": picks}
                kernel(qs[0], pools[0][0], pools[0][1], cache_seqlens=lens, block_table=pools[0][2], **kw)
                r["default"] = kernel.last_splits
                times = {t: [] for t in picks}
                for rnd in range(ROUNDS):
                    for tag in (list(picks) if rnd % 2 == 0 else list(picks)[::-1]):
                        times[tag].append(round(median_time_us(torch, lambda i: call(i, picks[tag]), 30, rot), 2))
                if b * h * sk * d * 4 <= 5e8:
                    kf = pools[0][3].to(torch.float8_e4m3fn).float() * 0.7
                    vf = pools[0][4].to(torch.float8_e4m3fn).float() * 1.3
                    ref = ((qs[0].float() @ kf.repeat_interleave(h // hkv, 1).transpose(-1, -2)) * d ** -0.5).softmax(-1) \
                        @ vf.repeat_interleave(h // hkv, 1)
                    for tag in picks:
                        r[tag + "_err"] = float((call(0, picks[tag]).float() - ref).abs().max())
                    del kf, vf, ref
                for tag in picks:
                    r[tag + "_us"] = round(statistics.median(times[tag]), 2); r[tag + "_rounds"] = times[tag]
                r["now_over_with"] = round(r["now_us"] / r["with_32_64_us"], 4)
                rows.append(r)
                print(json.dumps({k: r[k] for k in ("spec", "cell", "blocks", "tiles", "picks", "default", "now_us", "with_32_64_us", "now_over_with")}), flush=True)
                json.dump(out, open(sys.argv[1], "w"), indent=1)
                del qs, pools
                torch.cuda.empty_cache()
json.dump(out, open(sys.argv[1], "w"), indent=1)
