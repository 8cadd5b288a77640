"""A combine-kernel cell's split pick today (num_splits_for) against the rule before the slice cost came to these
cells (the wave rule with two-tile slices; two blocks per SM only from CO_RESIDENT_MIN_BLOCKS blocks), on cells the
first sweep (combine_kernel_slice_cost.py) did not time: d96 bf16, MLA (d576, one latent cache; 16 and 128 heads),
the d64 and d256 e4m3 cells, and d128 spot checks. Its JSON was taken with a trial rule: the slice cost from 128
tiles for every cell one block per SM streams, and e4m3 cells counting two blocks per SM from 16 blocks and 64
tiles or 8 blocks and 256 tiles; what it found set the families' slice_cost_from_tiles and
COMBINE_KERNEL_CO_RESIDENT. Every cell of the grid where the two picks differ, both counts forced, two alternating rounds, GPU us
(queued, rotated past L2), error against fp32 where it fits. The default must be the new pick.
Usage (GPU machine, repository root): python3 docs/decode-h200/split_rule/combine_kernel_rule_check.py OUT.json"""
import json
import sys
import torch
import attngen.core.launch_rules as lr
from attngen.runtime import load
from attngen.runtime.calls.decode import num_splits_for
from attngen.eval.bench.decode import median_time_us

SM = torch.cuda.get_device_properties(0).multi_processor_count
GQA = ((8, 1), (32, 1), (16, 2), (32, 4), (32, 8), (64, 8))
SPECS = {"d96_bf16": ("specs/h200_decode_d96_bf16.yaml", GQA, (1, 2, 4, 8)),
         "mla_bf16": ("specs/h200_decode_d576_mla_bf16.yaml", ((16, 1), (128, 1)), (1, 2, 4, 8, 16, 32, 64)),
         "d64_e4m3": ("specs/h200_decode_d64_kv_e4m3.yaml", GQA, (1, 2, 4, 8, 16)),
         "d256_e4m3": ("specs/h200_decode_d256_kv_e4m3.yaml", GQA, (1, 2, 4, 8, 16)),
         "d128_bf16": ("specs/h200_decode_d128_bf16.yaml", ((8, 1), (32, 8)), (1, 2)),
         "d128_e4m3": ("specs/h200_decode_d128_kv_e4m3.yaml", ((8, 1), (32, 8)), (1, 2, 8))}


def old_pick(plan, blocks, n_tiles):
    per_sm = lr.split_blocks_per_sm(plan.co_resident_blocks, blocks, n_tiles)   # the merging cells' thresholds
    in_flight = plan.unsplit_in_flight if per_sm == 1 else 0
    return lr.num_splits(blocks, n_tiles, SM, per_sm, plan.max_splits, in_flight, lr.COMBINE_KERNEL_MIN_SLICE_TILES, False)


rows = []
for name, (path, heads, batches) in SPECS.items():
    kernel = load(path)
    plan = kernel.plan
    e4, mla, d = name.endswith("e4m3"), name.startswith("mla"), plan.head_dim
    dt = torch.float16 if e4 else torch.bfloat16
    for b in batches:
        for h, hkv in heads:
            for sk in (2048, 4096, 8192, 16384, 32768, 131072):
                blocks, n_tiles = b * hkv * lr.row_blocks(plan, h, hkv, 1), -(-sk // plan.block_n)
                picks = {"old": old_pick(plan, blocks, n_tiles), "new": num_splits_for(plan, blocks, n_tiles, SM)}
                if picks["old"] == picks["new"]:
                    continue
                rot = max(2, min(16, int(3 * 60e6 // ((1 if e4 else 2) * (1 if mla else 2) * b * hkv * sk * d)) + 1))
                qs = [torch.randn(b, h, 1, d, device="cuda", dtype=dt) for _ in range(rot)]
                ks = [torch.randn(b, hkv, sk, d, device="cuda", dtype=dt) for _ in range(rot)]
                vs = [k[..., :plan.v_dim] if mla else torch.randn_like(k) for k in ks]
                kw = {}
                if e4:
                    ks = [k.to(torch.float8_e4m3fn) for k in ks]; vs = [v.to(torch.float8_e4m3fn) for v in vs]
                    kw = {"k_scale": torch.tensor([0.7], device="cuda"), "v_scale": torch.tensor([1.3], device="cuda")}
                ref = None
                if b * h * sk * d * 4 <= 5e8:
                    kf = ks[0].float() * (0.7 if e4 else 1.0); vf = vs[0].float() * (1.3 if e4 else 1.0)
                    ref = ((qs[0].float() @ kf.repeat_interleave(h // hkv, 1).transpose(-1, -2)) * d ** -0.5).softmax(-1) \
                        @ vf.repeat_interleave(h // hkv, 1)
                    del kf, vf
                r = {"spec": name, "cell": f"B{b} {h}/{hkv} Sk{sk}", "picks": picks}
                kernel(qs[0], ks[0], vs[0], **kw)
                r["default"] = kernel.last_splits
                times = {}
                for _ in range(2):
                    for tag, n in picks.items():
                        us = median_time_us(torch, lambda i: kernel(qs[i], ks[i], vs[i], num_splits=n, **kw), 20, rot)
                        times.setdefault(tag, []).append(round(us, 2))
                for tag, n in picks.items():
                    err = None if ref is None else float((kernel(qs[0], ks[0], vs[0], num_splits=n, **kw).float() - ref).abs().max())
                    r[tag] = {"splits": n, "us": times[tag], "err": err}
                rows.append(r)
                print(json.dumps(r), flush=True)
                del qs, ks, vs, ref
                torch.cuda.empty_cache()
json.dump(rows, open(sys.argv[1], "w"), indent=1)
