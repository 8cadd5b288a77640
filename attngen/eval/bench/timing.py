"""How a bench times a call on the GPU: CUDA events around each call queued behind a GPU sleep, the same
calls back to back between two events, and the eager time of the calls back to back (host included); what
every call's bench times with."""
from __future__ import annotations

import statistics
import time
import warnings

SLEEP_CYCLES = 20_000_000  # ~10 ms of GPU sleep, the least: enough for the host to enqueue most timed calls
SLEEP_CYCLES_PER_SECOND = 2e9       # the H200's boost clock, about; a lower clock only sleeps longer
SLEEP_MARGIN = 2.0                  # the sleep covers twice the host time the queued calls are expected to take
SLEEP_CYCLES_MOST = 4_000_000_000   # ~2 s


def sleep_cycles(host_seconds: float, reps: int) -> int:
    """The GPU sleep that time_calls queues its calls behind: long enough for the host to queue `reps`
    calls of `host_seconds` each (with SLEEP_MARGIN), so each call's events time the GPU alone. A
    sleep that ends first lets the host's time between calls into the events: a training step with
    300 us of Python per call, 30 calls, timed its host and not its kernels behind 10 ms."""
    wanted = host_seconds * reps * SLEEP_MARGIN * SLEEP_CYCLES_PER_SECOND
    return int(min(max(SLEEP_CYCLES, wanted), SLEEP_CYCLES_MOST))


def time_calls(torch, fn, sets, *, reps: int, warmup: int = 5) -> tuple[float, float]:
    """Median and relative p10-p90 spread (percent) of fn(*set) in microseconds: GPU time, the calls
    queued behind a GPU sleep that covers their host time (sleep_cycles, from one call's; covered_by_sleep
    queues them again where it did not)."""
    warmup = max(1, warmup)
    for i in range(warmup - 1):
        fn(*sets[i % len(sets)])
    torch.cuda.synchronize()
    started = time.perf_counter()
    fn(*sets[(warmup - 1) % len(sets)])   # the last warm-up call's host time, the GPU idle (nothing to wait behind)
    host = time.perf_counter() - started
    torch.cuda.synchronize()
    times, _ = covered_by_sleep(lambda cycles: queue_behind_sleep(torch, fn, sets, reps, cycles), reps,
                                sleep_cycles(host, reps), "calls")
    times = sorted(times)
    med = statistics.median(times)
    p10, p90 = times[len(times) // 10], times[(len(times) * 9) // 10]
    return med, 100.0 * (p90 - p10) / med


def covered_by_sleep(run, reps: int, cycles: int, what: str):
    """run(cycles) -> (its result, the host's milliseconds to queue the `reps` calls, the sleep's milliseconds on
    the GPU), behind a sleep of `cycles`. Where the host was still queuing when the GPU woke (its Python slower
    than the warm-up call said, or the driver's launch queue full: the host then waits on the sleeping GPU), the
    later calls' times include the host's pace: run again behind a sleep sized from that queuing time, and warn
    where that did not cover it either. (The result, the cycles it ran behind.)"""
    result, queued_ms, slept_ms = run(cycles)
    if queued_ms > slept_ms and cycles < SLEEP_CYCLES_MOST:
        cycles = sleep_cycles(queued_ms / 1e3 / reps, reps)
        result, queued_ms, slept_ms = run(cycles)
    if queued_ms > slept_ms:
        warnings.warn(f"attngen bench: queuing {reps} {what} took the host {queued_ms:.1f} ms, longer than the GPU's "
                      f"{slept_ms:.1f} ms sleep ahead of them (a slow host, or the driver's launch queue full), so "
                      f"their GPU times include the host's pace; fewer reps or fewer launches a call time the GPU alone",
                      RuntimeWarning, stacklevel=3)
    return result, cycles


def queue_behind_sleep(torch, fn, sets, reps: int, cycles: int) -> tuple[list[float], float, float]:
    """`reps` calls of fn queued behind a GPU sleep of `cycles`, each between CUDA events: (each call's GPU
    microseconds, the host's milliseconds to queue them all, the sleep's milliseconds on the GPU). The
    events time the GPU alone where the first figure of milliseconds is below the second."""
    before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    before.record()
    torch.cuda._sleep(cycles)  # the host queues every call below while the GPU sleeps
    after.record()
    queuing = time.perf_counter()
    for i in range(reps):
        starts[i].record()
        fn(*sets[i % len(sets)])
        ends[i].record()
    queued_ms = (time.perf_counter() - queuing) * 1e3
    torch.cuda.synchronize()
    return ([s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends)], queued_ms, before.elapsed_time(after))


def time_back_to_back(torch, fn, sets, *, reps: int, runs: int = 3) -> float:
    """GPU microseconds per call of fn(*set) with `reps` calls back to back between two CUDA events, queued
    behind a GPU sleep that covers their host time: as a model's or a decode loop's calls run. time_calls
    records an event between every two calls, and no kernel starts before an event recorded ahead of it, so
    a kernel launched as a programmatic dependent of the call ahead cannot show there what its launch hides;
    here it can. The median of `runs` runs (covered_by_sleep: each run's calls queued before the GPU wakes)."""
    fn(*sets[0])
    torch.cuda.synchronize()
    started = time.perf_counter()
    fn(*sets[0])
    cycles = sleep_cycles(time.perf_counter() - started, reps)
    torch.cuda.synchronize()
    per_call = []
    for _ in range(runs):
        us, cycles = covered_by_sleep(lambda cycles: run_behind_sleep(torch, fn, sets, reps, cycles), reps, cycles,
                                      "calls back to back")
        per_call.append(us)
    return statistics.median(per_call)


def run_behind_sleep(torch, fn, sets, reps: int, cycles: int) -> tuple[float, float, float]:
    """`reps` calls of fn back to back between two CUDA events, queued behind a GPU sleep of `cycles`: (GPU
    microseconds per call, the host's milliseconds to queue them, the sleep's milliseconds on the GPU)."""
    before, after, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    before.record()
    torch.cuda._sleep(cycles)
    after.record()
    queuing = time.perf_counter()
    for i in range(reps):
        fn(*sets[i % len(sets)])
    end.record()
    queued_ms = (time.perf_counter() - queuing) * 1e3
    torch.cuda.synchronize()
    return after.elapsed_time(end) * 1000.0 / reps, queued_ms, before.elapsed_time(after)


def time_eager(torch, fn, sets, *, reps: int, rounds: int = 5) -> float:
    """Microseconds per call of fn(*set) called back to back, host included: the median over
    `rounds` of (wall clock of `reps` calls and the synchronize after them) / reps."""
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
