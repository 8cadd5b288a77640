"""The timing loop the MLA decode A/B scripts of this folder share: cells alternating in one process, each at
its own split count; GPU us per call queued behind a GPU sleep (docs/measurements/host_time.py's gpu_time),
caches rotated past L2 (a fresh cache per call of a set of 4); bytes = the cache read once (B x keys x 576 x 2);
FLOPs 2 x B x heads x new tokens x keys x (576 + 512); several new tokens causal. PAGE > 0: paged caches (pages of
PAGE, each sequence's pages shuffled in a pool; bytes still B x keys x 576 x 2)."""
import json
import math
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "docs" / "measurements"))
import host_time  # noqa: E402


def cell_rows(cells: dict, shapes, rounds: int, page: int, ratio: tuple[str, callable]) -> list[dict]:
    """One row per (batch, heads, keys, new tokens) of `shapes`: each cell's median GPU us, TB/s and TFLOP/s,
    splits, and `ratio` = (its name, a function of the row's us)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for b, h, keys, sq in shapes:
        q = torch.randn((b, sq, h, 576), generator=g, device="cuda").bfloat16()
        lens = torch.full((b,), keys, dtype=torch.int32, device="cuda")
        table = None
        if page:    # one pool per cache of the set; every pool's pages in one shuffled table (keys a multiple of page)
            cols = keys // page
            caches = [torch.randn((b * cols, page, 1, 576), generator=g, device="cuda").bfloat16() for _ in range(4)]
            table = torch.randperm(b * cols, generator=g, device="cuda").int().view(b, cols)
        else:
            caches = [torch.randn((b, keys, 1, 576), generator=g, device="cuda").bfloat16() for _ in range(4)]
        at = {"i": 0}

        def runner(kernel):
            def run():
                c = caches[at["i"] % 4]
                at["i"] += 1
                return kernel(q, c, c[..., :512], cache_seqlens=lens, layout="bshd", scale=1 / math.sqrt(192),
                              causal=sq > 1, block_table=table)
            return run

        calls = {n: runner(k) for n, k in cells.items()}
        times = {n: [] for n in calls}
        for _ in range(rounds):
            for n, fn in calls.items():
                times[n].append(host_time.gpu_time(fn, n=20, repeats=3))
        splits = {n: k.last_splits for n, k in cells.items()}
        gb = b * keys * 576 * 2 / 1e9
        gflop = 2 * b * h * sq * keys * (576 + 512) / 1e9
        us = {n: round(statistics.median(v), 2) for n, v in times.items()}
        row = {"cell": f"B{b} {h}/1 {keys} keys, {'one new token' if sq == 1 else f'{sq} new tokens'}", "gpu_us": us,
               "TB_s": {n: round(gb / (t * 1e-6) / 1e3, 3) for n, t in us.items()},
               "TFLOP_s": {n: round(gflop / (t * 1e-6) / 1e3, 1) for n, t in us.items()},
               ratio[0]: round(ratio[1](us), 4), "splits": splits}
        print(json.dumps(row), flush=True)
        rows.append(row)
        caches.clear()
        torch.cuda.empty_cache()
    return rows


def write(out_path: str, command: str, rows: list[dict]) -> None:
    json.dump({"command": command, "device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows},
              open(out_path, "w"), indent=1)
