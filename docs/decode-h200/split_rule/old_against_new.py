"""The split rule of this tree (the runtime's default count) against main's (old_rules.py beside this script, forced: `git show 3a080b2:attngen/core/launch_rules.py` with its
relative import of function_keys made absolute) on
every cell of a grid where they differ; alternating, twice; GPU us, queued, caches rotated past L2.
Usage (GPU machine, repository root): python3 docs/decode-h200/split_rule/old_against_new.py OUT.json"""
import json, sys, time
sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
import torch
import old_rules
from attngen.runtime import load
from attngen.core.launch_rules import row_blocks
from attngen.runtime.calls.decode import num_splits_for
from attngen.eval.bench.decode import median_time_us
T0 = time.time()
SPECS = ["h200_decode_d128_contiguous_bf16", "h200_decode_d64_contiguous_bf16", "h200_decode_d128_bf16",
         "h200_decode_d64_bf16", "h200_decode_d576_mla_bf16", "h200_decode_d128_kv_e4m3_contiguous",
         "h200_decode_d128_kv_e4m3"]
rows = []
for name in SPECS:
    kern = load(f"specs/{name}.yaml"); p = kern.plan; ck = p.combine == "kernel"
    e4m3 = "e4m3" in name; mla = "mla" in name
    heads = ((16, 1), (128, 1)) if mla else ((32, 8), (8, 1), (32, 32))
    for B in (1, 2, 4, 8, 16):
        for hq, hkv in heads:
            for sk in (1024, 1536, 2048, 3072, 4096, 4224, 6272, 8192, 10368, 16384, 32768, 131072):
                if time.time() - T0 > 300: break
                nt = -(-sk // p.block_n); blocks = B * hkv * row_blocks(p, hq, hkv, 1)
                old = old_rules.num_splits(blocks, nt, 132, 1, p.max_splits, p.unsplit_in_flight, 2 if ck else 1)
                new = num_splits_for(p, blocks, nt, 132)
                if old == new:
                    continue
                d, dv = p.head_dim, p.v_dim
                kvb = (1 if mla else 2) * B * hkv * sk * d * (1 if e4m3 else 2)
                rot = max(2, min(16, int(3 * 60e6 // kvb) + 1))
                dt = torch.float16 if e4m3 else torch.bfloat16
                qs = [torch.randn(B, hq, 1, d, device="cuda", dtype=dt) for _ in range(rot)]
                ks = [torch.randn(B, hkv, sk, d, device="cuda", dtype=dt) for _ in range(rot)]
                vs = [k[..., :dv] if mla else torch.randn_like(k) for k in ks]
                kw = {}
                if e4m3:
                    ks = [k.to(torch.float8_e4m3fn) for k in ks]; vs = [v.to(torch.float8_e4m3fn) for v in vs]
                    kw = {"k_scale": torch.tensor([0.7], device="cuda"), "v_scale": torch.tensor([1.3], device="cuda")}
                t = {"old": [], "new": []}
                for _ in range(2):
                    t["old"].append(median_time_us(torch, lambda i: kern(qs[i], ks[i], vs[i], num_splits=old, **kw), 30, rot))
                    t["new"].append(median_time_us(torch, lambda i: kern(qs[i], ks[i], vs[i], **kw), 30, rot))
                assert kern.last_splits == new, (kern.last_splits, new)
                r = {"spec": name, "cell": f"B{B} {hq}/{hkv} Sk{sk}", "old": old, "new": new,
                     "old_us": [round(x, 2) for x in t["old"]], "new_us": [round(x, 2) for x in t["new"]],
                     "new/old": round(min(t["new"]) / min(t["old"]), 3)}
                rows.append(r); print(json.dumps(r), flush=True)
                del qs, ks, vs
json.dump(rows, open(sys.argv[1], "w"), indent=1)
print("secs", round(time.time() - T0))
