"""The GPU timing the backward bench scripts in .ci share: the median of CUDA-event-timed calls."""
import statistics

import torch


def med(fn, reps=15):
    """Median GPU time of fn() in µs over `reps` calls, after 3 warm-up calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts)
