"""Verify in several processes on one GPU: each worker process loads the specs it takes from a shared
queue and runs their cases, sending each result back as it is judged; this process keeps the order,
the progress and the report.

Why processes: a case is host-bound (fresh inputs, two launches, the fp32 reference, a few host
synchronizations), so one process leaves the GPU mostly idle; threads would share one interpreter
lock. Each spec runs whole in one worker, with the seeds its index gives it in a serial run, so the
report is the one a serial run makes, case for case and in the same order. A CUDA fault loses only its
own worker's context: that worker's remaining cases of its spec are reported as not run (as a serial
run reports them) and the worker stops; the other workers take the remaining specs. A worker that
dies leaves the cases it had not reported marked as not run.
"""
from __future__ import annotations

import os
import queue as queue_module

from .cases import CaseResult, VerifyReport

WORKERS_MAX = 8     # past this the GPU, not the host, sets the pace on an H100/H200 (and each adds a context)


def default_jobs() -> int:
    """Worker processes when `--jobs` is not given: half the usable cores (a worker keeps one busy and
    torch's own threads want some), at most WORKERS_MAX."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(WORKERS_MAX, cores // 2))


def _worker(spec_paths, shapes, seed, device_index, tasks, results, worker_id):
    """A worker process: runs each spec index it takes from `tasks` until None, sending
    ("start", worker, index), ("case", index, CaseResult) per case and ("done", worker, index);
    ("raise", worker, index, exception) for an error that is no case result (the verifier's own)."""
    index = None
    try:
        import torch
        from .rooms import kernel_cases
        from .runner import Runner, load_kernel
        torch.cuda.set_device(device_index)
        torch.set_num_threads(1)    # its work is on the GPU; the workers' CPU-side pools would crowd the cores
        while True:
            index = tasks.get()
            if index is None:
                return
            results.put(("start", worker_id, index))
            kernel = load_kernel(spec_paths[index])
            runner = Runner(seed, lambda case, index=index: results.put(("case", index, case)))
            runner.run(kernel, kernel_cases(kernel, shapes, kernel.masks), index, kernel.name)
            results.put(("done", worker_id, index))
            if runner.context_lost:
                return          # this process's context is unusable: the others take the rest
    except BaseException as exc:  # noqa: BLE001 - sent to the parent, which raises it there
        import pickle
        try:
            pickle.dumps(exc)   # the queue pickles in a thread of its own, where a failure would be lost
        except Exception:
            exc = RuntimeError(f"{type(exc).__name__}: {exc}")
        results.put(("raise", worker_id, index, exc))


def verify_parallel(spec_paths, kernels, shapes, *, jobs: int, suite_name: str, seed: int = 0,
                    on_case=None) -> VerifyReport:
    """The report of verify_kernels(kernels, shapes) computed by `jobs` worker processes, each loading
    the specs (spec_paths[i] is kernels[i]'s) it takes. `on_case(result)` hears each case as it
    arrives (in completion order); the report lists them in serial order."""
    import multiprocessing
    from .rooms import kernel_cases
    from .runner import verify_report
    shapes = tuple(shapes)
    expected = [kernel_cases(k, shapes, k.masks) for k in kernels]
    received: list[list[CaseResult]] = [[] for _ in kernels]
    ctx = multiprocessing.get_context("spawn")     # CUDA cannot cross a fork
    tasks, results = ctx.Queue(), ctx.Queue()
    # Longest first, so the last specs taken are short ones and the workers finish together.
    for index in sorted(range(len(kernels)), key=lambda i: -len(expected[i])):
        tasks.put(index)
    jobs = max(1, min(jobs, len(kernels)))
    for _ in range(jobs):
        tasks.put(None)
    device_index = (kernels[0].device.index or 0) if kernels else 0
    workers = [ctx.Process(target=_worker, args=(list(map(str, spec_paths)), shapes, seed, device_index, tasks,
                                                 results, w), daemon=True) for w in range(jobs)]
    for w in workers:
        w.start()
    running: dict[int, int] = {}        # worker -> the spec index it runs
    finished: set[int] = set()
    error = None
    try:
        while len(finished) < len(kernels) and error is None:
            try:
                message = results.get(timeout=0.5)
            except queue_module.Empty:
                if not any(w.is_alive() for w in workers):
                    break           # every worker has stopped; what is missing is reported not run
                for w, proc in enumerate(workers):
                    if not proc.is_alive() and w in running:
                        index = running.pop(w)
                        _not_run(received[index], expected[index], kernels[index].name,
                                 f"the verify worker running it exited (code {proc.exitcode})", on_case)
                        finished.add(index)
                continue
            kind = message[0]
            if kind == "case":
                _, index, case = message
                received[index].append(case)
                if on_case:
                    on_case(case)
            elif kind == "start":
                running[message[1]] = message[2]
            elif kind == "done":
                running.pop(message[1], None)
                finished.add(message[2])
            else:
                error = message[3]
    finally:
        for proc in workers:
            if proc.is_alive() and error is not None:
                proc.terminate()
        for proc in workers:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    if error is not None:
        raise error
    for index in range(len(kernels)):
        if len(received[index]) < len(expected[index]):
            _not_run(received[index], expected[index], kernels[index].name,
                     "no verify worker was left to run it (each lost its CUDA context or exited)", on_case)
    return verify_report(kernels, [case for cases in received for case in cases], suite_name)


def _not_run(got: list[CaseResult], cases: list[tuple], label: str, why: str, on_case) -> None:
    """The cases of one spec past those `got` holds, reported as not run, in order."""
    for variant, function, shape, _index, _check in cases[len(got):]:
        case = CaseResult(label, function, variant, shape, passed=False, problems=[f"not run: {why}"])
        got.append(case)
        if on_case:
            on_case(case)
