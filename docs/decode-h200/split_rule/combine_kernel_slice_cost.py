"""The combine-kernel decode cells (paged-capable; combine: kernel): their split rule today (the wave rule with
two-tile slices) against the slice-cost rule the merging cells use (launch_rules.slice_cost), on every cell of a
grid where the two picks differ; for the e4m3 cell also the slice-cost rule counting its two co-resident blocks per
SM wherever the cache has CO_RESIDENT_MIN_TILES tiles ("newco"). Each count forced, contiguous caches, GPU us
(queued, rotated past L2) in two alternating rounds, error against fp32 where it fits.
Usage (GPU machine, repository root): python3 docs/decode-h200/split_rule/combine_kernel_slice_cost.py OUT.json"""
import json
import sys
import torch
import attngen.core.launch_rules as lr
from attngen.runtime import load
from attngen.runtime.calls.decode import num_splits_for
from attngen.eval.bench.decode import median_time_us

SPECS = {"d128_bf16": "specs/h200_decode_d128_bf16.yaml", "d64_bf16": "specs/h200_decode_d64_bf16.yaml",
         "d256_bf16": "specs/h200_decode_d256_bf16.yaml", "d128_e4m3": "specs/h200_decode_d128_kv_e4m3.yaml"}
HEADS = ((8, 1), (32, 1), (16, 2), (32, 4), (32, 8), (64, 8))
SM = torch.cuda.get_device_properties(0).multi_processor_count


def slice_cost_pick(plan, blocks, n_tiles, per_sm):
    in_flight = plan.unsplit_in_flight if per_sm == 1 else 0
    return lr.num_splits(blocks, n_tiles, SM, per_sm, plan.max_splits, in_flight, 1, True)


rows = []
for name, path in SPECS.items():
    kernel = load(path)
    plan = kernel.plan
    e4, d = name.endswith("e4m3"), plan.head_dim
    dt = torch.float16 if e4 else torch.bfloat16
    for b in (1, 2, 4, 8, 16):
        for h, hkv in HEADS:
            for sk in (2048, 4096, 8192, 16384, 32768, 131072):
                blocks, n_tiles = b * hkv * lr.row_blocks(plan, h, hkv, 1), -(-sk // plan.block_n)
                picks = {"old": num_splits_for(plan, blocks, n_tiles, SM),
                         "new": slice_cost_pick(plan, blocks, n_tiles, lr.split_blocks_per_sm(plan.co_resident_blocks, blocks, n_tiles))}
                if e4:
                    picks["newco"] = slice_cost_pick(plan, blocks, n_tiles, plan.co_resident_blocks if n_tiles >= lr.CO_RESIDENT_MIN_TILES else 1)
                if len(set(picks.values())) == 1:
                    continue
                rot = max(2, min(16, int(3 * 60e6 // ((2 if e4 else 4) * b * hkv * sk * d)) + 1))
                qs = [torch.randn(b, h, 1, d, device="cuda", dtype=dt) for _ in range(rot)]
                ks = [torch.randn(b, hkv, sk, d, device="cuda", dtype=dt) for _ in range(rot)]
                vs = [torch.randn_like(k) for k in ks]
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
                assert kernel.last_splits == picks["old"], (kernel.last_splits, picks)
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
