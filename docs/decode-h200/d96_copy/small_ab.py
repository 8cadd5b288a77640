"""Small d96 decode steps (the model zoo's Phi-3 paged decode and its neighbours), GPU time in CUDA graphs as
copy_ab.py times them, for the template before and after (one process per template; compare the JSON files).

    python3 docs/decode-h200/d96_copy/small_ab.py OUT.json [ROUNDS]"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "measurements"))
import fp8_kv_decode as fk  # noqa: E402

# (label, per-sequence keys, paged, query dtype); 32/32 heads of 96, one new token
CASES = [("zoo lengths, pages of 16", (1024, 545, 300, 1), True, "bf16"),
         ("zoo lengths, contiguous", (1024, 545, 300, 1), False, "bf16"),
         ("B4 1024, pages of 16", (1024,) * 4, True, "bf16"),
         ("B4 1024, contiguous", (1024,) * 4, False, "bf16"),
         ("B1 2048, pages of 16", (2048,), True, "fp16"),
         ("B8 2048, pages of 16", (2048,) * 8, True, "fp16")]


def main():
    out_path, rounds = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 5
    H = Hkv = 32
    D, calls, rows = 96, 30, []
    for label, lengths, paged, qdt in CASES:
        qdtype = torch.float16 if qdt == "fp16" else torch.bfloat16
        B, S = len(lengths), max(lengths)
        S = -(-S // 16) * 16
        q = torch.randn(B, H, 1, D, device="cuda", dtype=qdtype)
        lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
        sets = [(k.to(qdtype), v.to(qdtype), t) for k, v, t in fk.caches(B, Hkv, S, D, False, paged, 8)]
        g = fk.graph_of(q, sets, lens, (None, None), calls)
        times = [fk.time_graph(g, calls) for _ in range(rounds)]
        row = {"case": label, "query": qdt, "us": round(statistics.median(times), 3), "rounds": [round(t, 3) for t in times]}
        rows.append(row)
        print(json.dumps(row))
        del g, sets
    with open(out_path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "command": f"python3 docs/decode-h200/d96_copy/small_ab.py OUT.json {rounds}", "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
