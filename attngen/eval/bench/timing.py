"""How a bench times a call on the GPU: CUDA events around calls queued behind a GPU sleep, and the
eager time of the same calls back to back; what every call's bench times with."""
from __future__ import annotations

import statistics

SLEEP_CYCLES = 20_000_000  # ~10 ms of GPU sleep: enough for the host to enqueue every timed call


def time_calls(torch, fn, sets, *, reps: int, warmup: int = 5) -> tuple[float, float]:
    """Median and relative p10-p90 spread (percent) of fn(*set) in microseconds."""
    for i in range(warmup):
        fn(*sets[i % len(sets)])
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    torch.cuda._sleep(SLEEP_CYCLES)  # the host queues every call below while the GPU sleeps
    for i in range(reps):
        starts[i].record()
        fn(*sets[i % len(sets)])
        ends[i].record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends))
    med = statistics.median(times)
    p10, p90 = times[len(times) // 10], times[(len(times) * 9) // 10]
    return med, 100.0 * (p90 - p10) / med


def time_eager(torch, fn, sets, *, reps: int, rounds: int = 5) -> float:
    """Microseconds per call of fn(*set) called back to back, host included: the median over
    `rounds` of (wall clock of `reps` calls and the synchronize after them) / reps."""
    import time
    for i in range(5):
        fn(*sets[i % len(sets)])
    out = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(reps):
            fn(*sets[i % len(sets)])
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) / reps * 1e6)
    return statistics.median(out)
