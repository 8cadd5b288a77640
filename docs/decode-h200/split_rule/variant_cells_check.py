"""The combine-kernel variant cells (softcap, window, sink, ALiBi) of the d64, d128 and d256 families take
slice_cost_from_tiles 128 from their family without a sweep of their own. Spot check: where the slice cost's pick
(num_splits_for, today) and the wave rule's pick (the rule before it) differ, both counts forced, two alternating
rounds, GPU us (queued, K/V rotated past L2), and the error of each against fp32.
Usage (GPU machine, repository root): python3 docs/decode-h200/split_rule/variant_cells_check.py OUT.json"""
import json
import math
import sys
import torch
import attngen.core.launch_rules as lr
from attngen.runtime import load
from attngen.runtime.calls.decode import num_splits_for
from attngen.eval.bench.decode import median_time_us

SM = torch.cuda.get_device_properties(0).multi_processor_count
dt = torch.bfloat16
CELLS = {"d128_softcap": ("specs/h200_decode_d128_softcap_bf16.yaml", {"softcap": 30.0}),
         "d128_window": ("specs/h200_decode_d128_window_bf16.yaml", {"window": (16384, 0), "causal": True}),
         "d128_sink": ("specs/h200_decode_d128_sink_bf16.yaml", "sinks"),
         "d64_sink": ("specs/h200_decode_d64_sink_bf16.yaml", "sinks"),
         "d256_softcap": ("specs/h200_decode_d256_softcap_bf16.yaml", {"softcap": 50.0}),
         "d128_alibi": ("specs/h200_decode_d128_alibi_bf16.yaml", "alibi")}


def old_pick(plan, blocks, n_tiles):
    per_sm = lr.split_blocks_per_sm(plan.co_resident_blocks, blocks, n_tiles)
    in_flight = plan.unsplit_in_flight if per_sm == 1 else 0
    return lr.num_splits(blocks, n_tiles, SM, per_sm, plan.max_splits, in_flight, lr.COMBINE_KERNEL_MIN_SLICE_TILES, False)


def reference(q, k, v, d, h, hkv, kw):
    g = h // hkv
    s = (q.float() @ k.float().repeat_interleave(g, 1).transpose(-1, -2)) * d ** -0.5
    sk = k.shape[2]
    if "softcap" in kw:
        s = kw["softcap"] * torch.tanh(s / kw["softcap"])
    if "alibi_slopes" in kw:
        s = s - kw["alibi_slopes"].float()[None, :, None, None] * (sk - 1 - torch.arange(sk, device=q.device)).float()
    if "window" in kw and sk - 1 - kw["window"][0] > 0:
        s[..., : sk - 1 - kw["window"][0]] = float("-inf")
    if "sinks" in kw:
        sink = kw["sinks"].float()[None, :, None, None].expand(*s.shape[:3], 1)
        p = torch.cat([s, sink], -1).softmax(-1)[..., :-1]
    else:
        p = s.softmax(-1)
    return p @ v.float().repeat_interleave(g, 1)


rows = []
for name, (path, extra) in CELLS.items():
    kernel = load(path)
    plan, d = kernel.plan, kernel.plan.head_dim
    for b in (1, 2):
        for h, hkv in ((8, 1), (32, 8), (32, 1)):
            for sk in (16384, 32768, 131072):
                blocks, n_tiles = b * hkv * lr.row_blocks(plan, h, hkv, 1), math.ceil(sk / plan.block_n)
                picks = {"old": old_pick(plan, blocks, n_tiles), "new": num_splits_for(plan, blocks, n_tiles, SM)}
                if picks["old"] == picks["new"]:
                    continue
                rot = max(2, min(16, int(3 * 60e6 // (4 * b * hkv * sk * d)) + 1))
                qs = [torch.randn(b, h, 1, d, device="cuda", dtype=dt) for _ in range(rot)]
                ks = [torch.randn(b, hkv, sk, d, device="cuda", dtype=dt) for _ in range(rot)]
                vs = [torch.randn_like(k) for k in ks]
                if extra == "sinks":
                    kw = {"sinks": torch.randn(h, device="cuda", dtype=torch.float32)}
                elif extra == "alibi":
                    kw = {"alibi_slopes": torch.rand(h, device="cuda", dtype=torch.float32) * 1e-3}
                else:
                    kw = dict(extra)
                r = {"spec": name, "cell": f"B{b} {h}/{hkv} Sk{sk}", "picks": picks}
                kernel(qs[0], ks[0], vs[0], **kw)
                r["default"] = kernel.last_splits
                times = {}
                for _ in range(2):
                    for tag, n in picks.items():
                        us = median_time_us(torch, lambda i: kernel(qs[i], ks[i], vs[i], num_splits=n, **kw), 20, rot)
                        times.setdefault(tag, []).append(round(us, 2))
                ref = reference(qs[0], ks[0], vs[0], d, h, hkv, kw) if b * h * sk * d * 4 <= 5e8 else None
                for tag, n in picks.items():
                    err = None if ref is None else float((kernel(qs[0], ks[0], vs[0], num_splits=n, **kw).float() - ref).abs().max())
                    r[tag] = {"splits": n, "us": times[tag], "err": err}
                rows.append(r)
                print(json.dumps(r), flush=True)
                del qs, ks, vs, ref
                torch.cuda.empty_cache()
json.dump(rows, open(sys.argv[1], "w"), indent=1)
