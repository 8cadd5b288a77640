"""The e4m3 d96 cell (3-stage ring, 4 warps) against two trial cells (a 2-stage ring; 8 warps), kernels called
directly, CUDA graphs of 30 calls, caches rotated past the L2, alternating over 5 rounds in one process.
Usage: python3 docs/decode-h200/d96_copy/e4m3_rows/ring_trials/ring_ab.py OUT.json"""
import json, statistics, sys
import torch
sys.path.insert(0, "docs/measurements")
import fp8_kv_decode as fk
import attngen

HERE = "docs/decode-h200/d96_copy/e4m3_rows/ring_trials/"
cells = {"s3": attngen.load("specs/h200_decode_d96_kv_e4m3.yaml"),
         "s2": attngen.load(HERE + "h200_decode_d96_kv_e4m3_s2.yaml"),
         "w8": attngen.load(HERE + "h200_decode_d96_kv_e4m3_w8.yaml")}
ks, vs = torch.tensor([0.02], device="cuda"), torch.tensor([0.01], device="cuda")
rows = []
for B, H, Hkv, D, S in fk.CASES["d96"]:
    for paged in (False, True):
        q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.float16)
        lens = torch.full((B,), S, dtype=torch.int32, device="cuda")
        copies = max(2, min(8, -(-200_000_000 // (B * Hkv * S * D))))
        sets = fk.caches(B, Hkv, S, D, True, paged, copies)
        graphs = {}
        for name, kern in cells.items():
            def step(i, kern=kern):
                k, v, t = sets[i % len(sets)]
                return kern(q, k, v, cache_seqlens=lens, block_table=t, k_scale=ks, v_scale=vs)
            for i in range(len(sets)):
                step(i)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for i in range(30):
                    step(i)
            graphs[name] = g
        t = {n: [] for n in cells}
        for _ in range(5):
            for n in cells:
                t[n].append(fk.time_graph(graphs[n], 30))
        med = {n: statistics.median(x) for n, x in t.items()}
        row = {"layout": "paged16" if paged else "contiguous", "batch": B, "heads": H, "kv_heads": Hkv, "keys": S,
               "us": med, "s3_over": {n: med["s3"] / med[n] for n in cells}, "rounds": t,
               "splits": {n: c.last_splits for n, c in cells.items()}}
        rows.append(row)
        print(f"{row['layout']:>10} B{B} {H}/{Hkv} {S}: " + " ".join(f"{n} {med[n]:.1f}" for n in cells)
              + " | s3/x " + " ".join(f"{n} {row['s3_over'][n]:.3f}" for n in cells)
              + f" splits {row['splits']}", flush=True)
        del graphs, sets
        torch.cuda.empty_cache()
json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, open(sys.argv[1], "w"), indent=1)
