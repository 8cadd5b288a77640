"""Paged decode with the contiguous cells' one launch: does a paged cell with `combine: auto` (the split kernel
merges its own splits; no combine kernel) close the paged calls' gap to contiguous caches? (#60: pages of 16
at 1.10x the contiguous cell's time, pages of 256, one run per tile as a contiguous copy, at 1.05x.)

Cells: decode steps of GQA 32/8, head dim 128, fp16, one new token, at B8 x 8192 keys (paged_page_sizes.py's
cell), B1 x 32768 and B32 x 4096. Per cell, alternating over ROUNDS rounds: the contiguous call as the table
serves it (attngen.attention_with_kvcache without a table); then on pools of shuffled pages of 16 and 256 keys,
h200_decode_d128 (the paged cell the table serves today: a combine kernel) and the two trial cells beside this
script (t_decode_d128_paged_auto[_pairs].yaml). Each timed per call (events around each call, queued behind a GPU
sleep: attngen bench's time) and back to back (30 calls between two events: a decode loop's), the input sets
cycling past L2. Every output is compared with the contiguous call's.

Usage: python3 docs/decode-h200/paged_auto/paged_auto_trial.py OUT.json [ROUNDS]"""
from pathlib import Path
import sys

import torch

import attngen
from attngen.eval.verify.decode import paged_cache
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "measurements"))
from gpu_timing import alternating_both, write_report  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
HQ, HKV, D = 32, 8, 128
CELLS = ((8, 8192), (1, 32768), (32, 4096))
PAGES = (16, 256)
SETS = 2


def main(out_path, rounds="5"):
    g = torch.Generator(device="cuda").manual_seed(0)
    kernels = {"h200_decode_d128": attngen.load(ROOT / "specs" / "h200_decode_d128.yaml")}
    for name in ("t_decode_d128_paged_auto", "t_decode_d128_paged_auto_pairs"):
        kernels[name] = attngen.load(HERE / f"{name}.yaml")
    rows = []
    for b, sk in CELLS:
        lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
        sets = []
        for _ in range(SETS):
            q = torch.randn(b, HQ, 1, D, generator=g, device="cuda").half()
            k, v = (torch.randn(b, HKV, sk, D, generator=g, device="cuda").half() for _ in range(2))
            pools = {pg: paged_cache(torch, k, v, None, pg, "bhsd", generator=g, spare=0) for pg in PAGES}
            sets.append((q, k, v, pools))

        def contiguous(q, k, v, pools):
            return attngen.attention_with_kvcache(q, k, v, cache_seqlens=lens)

        def paged(kernel, pg):
            def call(q, k, v, pools):
                kp, vp, table = pools[pg]
                return kernel(q, kp, vp, cache_seqlens=lens, block_table=table)
            return call
        calls = {"contiguous": contiguous}
        calls |= {f"{name} pages {pg}": paged(kern, pg) for pg in PAGES for name, kern in kernels.items()}
        reference = contiguous(*sets[0]).float()
        diffs = {n: (fn(*sets[0]).float() - reference).abs().max().item() for n, fn in calls.items()}
        attngen.check_errors()
        med, each = alternating_both(calls, sets, int(rounds))
        kv_bytes = 2 * b * HKV * sk * D * 2
        for n in calls:
            row = {"cell": f"B{b} {HQ}/{HKV} Sk{sk}", "call": n, **{m: round(t, 2) for m, t in med[n].items()},
                   "vs_contiguous": round(med[n]["us"] / med["contiguous"]["us"], 3),
                   "vs_contiguous_b2b": round(med[n]["b2b_us"] / med["contiguous"]["b2b_us"], 3),
                   "tb_per_s_b2b": round(kv_bytes / (med[n]["b2b_us"] * 1e-6) / 1e12, 3),
                   "max_diff_vs_contiguous": diffs[n], "rounds": each[n]}
            rows.append(row)
            print(f"{row['cell']:<20} {n:<42} {row['us']:8.2f} {row['b2b_us']:8.2f}  x{row['vs_contiguous']:.3f} "
                  f"x{row['vs_contiguous_b2b']:.3f}  diff {diffs[n]:.1e}", flush=True)
        sets = None
        torch.cuda.empty_cache()
    write_report(out_path, rows, f"python3 docs/decode-h200/paged_auto/paged_auto_trial.py OUT.json {rounds}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(*sys.argv[1:])
