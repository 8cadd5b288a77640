"""e4m3 decode cells: the split count with two blocks per SM counted on large grids and caches (the
runtime's default, co_resident_blocks) against one block per SM (forced), alternating, twice; GPU us, queued,
caches rotated past L2. Usage (GPU machine, repository root): python3 docs/decode-h200/fp8_trials/co_resident.py OUT.json"""
import json, sys, time
import torch
from attngen.runtime import load
from attngen.core.launch_rules import num_splits, row_blocks, COMBINE_KERNEL_MIN_SLICE_TILES
from attngen.runtime.calls.decode import num_splits_for
from attngen.eval.bench.decode import median_time_us
T0 = time.time()
rows = []
for name in ("h200_decode_d128_kv_e4m3_contiguous", "h200_decode_d64_kv_e4m3_contiguous", "h200_decode_d64_kv_e4m3",
             "h200_decode_d128_kv_e4m3_contiguous_bf16"):
    kern = load(f"specs/{name}.yaml"); p = kern.plan; ck = p.combine == "kernel"
    for B in (2, 4, 8, 16, 32, 64):
        for hq, hkv in ((32, 8), (8, 1), (32, 32)):
            for sk in (8192, 16384, 32768, 65536, 131072):
                if time.time() - T0 > 330: break
                nt = -(-sk // p.block_n); blocks = B * hkv * row_blocks(p, hq, hkv, 1)
                one = num_splits(blocks, nt, 132, 1, p.max_splits, p.unsplit_in_flight,
                                 COMBINE_KERNEL_MIN_SLICE_TILES if ck else 1, not ck)
                new = num_splits_for(p, blocks, nt, 132)
                if one == new or B * hkv * sk * p.head_dim * 2 > 12e9:
                    continue
                d = p.head_dim
                kvb = 2 * B * hkv * sk * d
                rot = max(2, min(8, int(3 * 60e6 // kvb) + 1))
                dt = torch.bfloat16 if name.endswith("bf16") else torch.float16
                qs = [torch.randn(B, hq, 1, d, device="cuda", dtype=dt) for _ in range(rot)]
                ks = [torch.randn(B, hkv, sk, d, device="cuda", dtype=dt).to(torch.float8_e4m3fn) for _ in range(rot)]
                vs = [torch.randn(B, hkv, sk, d, device="cuda", dtype=dt).to(torch.float8_e4m3fn) for _ in range(rot)]
                kw = {"k_scale": torch.tensor([0.7], device="cuda"), "v_scale": torch.tensor([1.3], device="cuda")}
                t = {"one": [], "new": []}
                for _ in range(2):
                    t["one"].append(median_time_us(torch, lambda i: kern(qs[i], ks[i], vs[i], num_splits=one, **kw), 20, rot))
                    t["new"].append(median_time_us(torch, lambda i: kern(qs[i], ks[i], vs[i], **kw), 20, rot))
                assert kern.last_splits == new, (kern.last_splits, new)
                r = {"spec": name, "cell": f"B{B} {hq}/{hkv} Sk{sk}", "one_per_sm": one, "new": new,
                     "one_us": [round(x, 2) for x in t["one"]], "new_us": [round(x, 2) for x in t["new"]],
                     "new/one": round(min(t["new"]) / min(t["one"]), 3)}
                rows.append(r); print(json.dumps(r), flush=True)
                del qs, ks, vs; torch.cuda.empty_cache()
json.dump(rows, open(sys.argv[1], "w"), indent=1)
print("secs", round(time.time() - T0))
