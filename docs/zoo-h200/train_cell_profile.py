"""Where a zoo training cell's time goes: the cell's step (attngen/eval/zoo.py's train cell) run 5 times under
torch.profiler after 5 warm-up steps, the CUDA kernels and the host's CUDA calls by total time.

    python3 docs/zoo-h200/train_cell_profile.py [--stack] [LAYER ...]   (default: gptoss_20b_global gptoss_20b_local)

--stack: record Python stacks too and print the host's CUDA calls grouped by their 8 innermost frames
(where a blocking copy or synchronization comes from).
"""
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from attngen.eval import zoo  # noqa: E402

STEPS = 5


def main(names, stack=False):
    for name in names:
        prepared = zoo.prepare(torch, zoo.LAYER[name], "train")
        for _ in range(STEPS):
            prepared.run()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=stack) as prof:
            for _ in range(STEPS):
                prepared.run()
            torch.cuda.synchronize()
        print(f"{name}: {STEPS} steps")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=90))
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=10, max_name_column_width=90))
        if stack:
            print(prof.key_averages(group_by_stack_n=8).table(sort_by="self_cpu_time_total", row_limit=6,
                                                               max_name_column_width=60))


if __name__ == "__main__":
    args = sys.argv[1:]
    stack = "--stack" in args
    main([a for a in args if a != "--stack"] or ["gptoss_20b_global", "gptoss_20b_local"], stack)
