"""Decode steps through attngen.attention_with_kvcache, GPU time in CUDA graphs (docs/measurements/fp8_kv_decode.py's
loop: calls replayed from a graph, caches rotated past the L2), for a before/after of the decode template in two
processes: run it once per template and compare the JSON files.

    python3 docs/decode-h200/d96_copy/copy_ab.py OUT.json [ROUNDS] [--no-d96-e4m3] [--table TABLE.yaml]

Cases: d96 16-bit caches (Phi-3-mini's 32/32 heads, and 32/8), contiguous and pages of 16; e4m3 caches at d64,
d96 and d128 (the cells whose copy the change rewrote). --no-d96-e4m3 leaves out the d96 e4m3 cases (a template
before the change has no such cell); --table reads that dispatch table in place of the checkout's (a table A/B).
Each row names the spec the table gave the call."""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "measurements"))
import fp8_kv_decode as fk  # noqa: E402
from attngen.eval import table_ab  # noqa: E402

# (cache dtype, B, H, Hkv, D, keys, paged, query dtype)
CASES = [("fp16", 8, 32, 32, 96, 4096, False, "fp16"), ("fp16", 8, 32, 32, 96, 16384, False, "fp16"),
         ("fp16", 8, 32, 32, 96, 4096, True, "fp16"), ("fp16", 8, 32, 32, 96, 16384, True, "fp16"),
         ("fp16", 1, 32, 32, 96, 32768, False, "fp16"), ("fp16", 8, 32, 8, 96, 16384, False, "fp16"),
         ("fp16", 8, 32, 32, 96, 8192, False, "bf16"),
         ("e4m3", 8, 32, 32, 96, 16384, False, "fp16"), ("e4m3", 8, 32, 32, 96, 16384, True, "fp16"),
         ("e4m3", 8, 32, 8, 128, 16384, False, "fp16"), ("e4m3", 8, 32, 8, 128, 16384, True, "fp16"),
         ("e4m3", 1, 32, 8, 128, 32768, True, "fp16"), ("e4m3", 8, 32, 8, 64, 16384, True, "fp16")]


def main():
    out_path = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2].isdigit() else 3
    skip_d96_e4m3 = "--no-d96-e4m3" in sys.argv
    table = sys.argv[sys.argv.index("--table") + 1] if "--table" in sys.argv else None
    if table:
        table_ab.read_table_from(table)
    specs = table_ab.record_specs()
    scales = (torch.tensor([0.02], device="cuda"), torch.tensor([0.01], device="cuda"))
    calls, rows = 30, []
    for cache, B, H, Hkv, D, S, paged, qdt in CASES:
        if skip_d96_e4m3 and cache == "e4m3" and D == 96:
            continue
        qdtype = torch.float16 if qdt == "fp16" else torch.bfloat16
        q = torch.randn(B, H, 1, D, device="cuda", dtype=qdtype)
        lens = torch.full((B,), S, dtype=torch.int32, device="cuda")
        copies = max(2, min(8, -(-200_000_000 // (2 * B * Hkv * S * D))))
        sets = fk.caches(B, Hkv, S, D, cache == "e4m3", paged, copies)
        if cache != "e4m3" and qdtype != torch.float16:
            sets = [(k.to(qdtype), v.to(qdtype), t) for k, v, t in sets]
        specs.clear()
        g = fk.graph_of(q, sets, lens, scales, calls)
        times = [fk.time_graph(g, calls) for _ in range(rounds)]
        us = statistics.median(times)
        kv_bytes = 2 * B * Hkv * S * D * (1 if cache == "e4m3" else 2)
        row = {"cache": cache if cache == "e4m3" else qdt, "query": qdt, "batch": B, "heads": H, "kv_heads": Hkv, "head_dim": D, "keys": S,
               "layout": "paged16" if paged else "contiguous", "us": round(us, 2), "TB_s": round(kv_bytes / us / 1e6, 3),
               "rounds": [round(t, 2) for t in times], "specs": sorted(set(specs))}
        rows.append(row)
        print(json.dumps(row))
        del g, sets
        torch.cuda.empty_cache()
    with open(out_path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "command": "python3 docs/decode-h200/d96_copy/copy_ab.py OUT.json %d%s%s" % (
                       rounds, " --no-d96-e4m3" if skip_d96_e4m3 else "", f" --table {table}" if table else ""),
                   "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
