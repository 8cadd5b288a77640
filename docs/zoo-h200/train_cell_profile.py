"""Where a zoo training cell's time goes: the cell's step (attngen/eval/zoo.py's train cell) run 5 times under
torch.profiler after 5 warm-up steps, the CUDA kernels and the host's CUDA calls by total time.

    python3 docs/zoo-h200/train_cell_profile.py [LAYER ...]     (default: gptoss_20b_global gptoss_20b_local)
"""
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from attngen.eval import zoo  # noqa: E402

STEPS = 5


def main(names):
    for name in names:
        prepared = zoo.prepare(torch, zoo.LAYER[name], "train")
        for _ in range(STEPS):
            prepared.run()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(STEPS):
                prepared.run()
            torch.cuda.synchronize()
        print(f"{name}: {STEPS} steps")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=90))
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=10, max_name_column_width=90))


if __name__ == "__main__":
    main(sys.argv[1:] or ["gptoss_20b_global", "gptoss_20b_local"])
