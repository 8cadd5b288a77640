"""Verify in several processes on one GPU: each worker process loads the specs it takes from a shared
queue and runs their cases, sending each result back as it is judged; this process keeps the order,
the progress and the report.

Why processes: a case is host-bound (fresh inputs, two launches, the fp32 reference, a few host
synchronizations), so one process leaves the GPU mostly idle; threads would share one interpreter
lock. Processes take turns on the GPU (one context at a time) unless they share it through MPS: the
CLI starts a private daemon for them (mps.py). Each spec runs whole in one worker, with the seeds its
index gives it in a serial run, so the report is the one a serial run makes, case for case and in the
same order. A CUDA fault loses only its
own worker's context: that worker's remaining cases of its spec are reported as not run (as a serial
run reports them) and the worker stops; the other workers take the remaining specs. A worker that
dies leaves the cases it had not reported marked as not run. A case that runs out of GPU memory beside the
other workers (8 of them filled an 80 GB H100 on the largest varlen backward cases) is not a result: the worker
hands it back, and once the workers are done this process runs it again alone, with the whole GPU, as a
serial run would (it fails only if it runs out there too).
"""
from __future__ import annotations

import contextlib
import os
import queue as queue_module

from .cases import CaseResult, VerifyReport

# Past 8 the GPU, not the host, sets the pace on an H100/H200 when the workers take turns on it; under
# MPS 12 workers verified every spec in 70.8 s against 75.8 s for 8 (H200): --jobs 12 for who wants that.
WORKERS_MAX = 8


def default_jobs() -> int:
    """Worker processes when `--jobs` is not given: half the usable cores (a worker keeps one busy and
    torch's own threads want some), at most WORKERS_MAX."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(WORKERS_MAX, cores // 2))


def _worker(spec_paths, shapes, seed, device_index, tasks, results, worker_id, profile_dir=None):
    """A worker process: runs each spec index it takes from `tasks` until None, sending
    ("start", worker, index), ("case", index, CaseResult) per case and ("done", worker, index);
    ("raise", worker, index, exception) for an error that is no case result (the verifier's own).
    With `profile_dir`, it runs under cProfile and writes profile_dir/worker-<n>.prof as it returns (a
    worker _serve terminates after an error writes none)."""
    with profiled(None if profile_dir is None else os.path.join(profile_dir, f"worker-{worker_id}.prof")):
        _work(spec_paths, shapes, seed, device_index, tasks, results, worker_id)


@contextlib.contextmanager
def profiled(path: str | None):
    """The block run under cProfile, its profile written to `path` as it ends (None: not profiled);
    verify --profile's workers and its serial run."""
    if path is None:
        yield
        return
    import cProfile
    profile = cProfile.Profile()
    profile.enable()
    try:
        yield
    finally:
        profile.disable()
        profile.dump_stats(path)


def _work(spec_paths, shapes, seed, device_index, tasks, results, worker_id):
    """_worker's loop (see there)."""
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
            runner = Runner(seed, lambda case, index=index: results.put(("case", index, case)),
                            on_out_of_memory=lambda i, position, case: results.put(("defer", i, position, case)))
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
                    on_case=None, profile_dir=None) -> VerifyReport:
    """The report of verify_kernels(kernels, shapes) computed by `jobs` worker processes, each loading
    the specs (spec_paths[i] is kernels[i]'s) it takes. `on_case(result)` hears each case as it
    arrives (in completion order); the report lists them in serial order. `profile_dir`: each worker
    runs under cProfile and writes its profile there (_worker)."""
    from .rooms import kernel_cases
    shapes = tuple(shapes)
    expected = [kernel_cases(k, shapes, k.masks) for k in kernels]
    # Longest first, so the last specs taken are short ones and the workers finish together.
    order = sorted(range(len(kernels)), key=lambda i: -len(expected[i]))
    pending = [(i, kernels[i], expected[i]) for i in order]

    def ready(_wait):
        handed = pending.copy()
        pending.clear()
        return handed
    device_index = (kernels[0].device.index or 0) if kernels else 0
    return _serve(spec_paths, shapes, seed, jobs, device_index, ready, lambda: True, suite_name, on_case,
                  profile_dir=profile_dir)


def verify_streaming(spec_paths, shapes, *, jobs: int, suite_name: str, seed: int = 0, on_case=None,
                     on_loaded=None, on_compiled=None, compile_jobs: int | None = None,
                     profile_dir=None) -> VerifyReport:
    """verify_parallel with the compile overlapped: every part of every spec compiles in one batch (as
    load_kernels compiles them) on a thread of this process, and a spec goes to the workers as soon as
    its parts are built, instead of after the last of them. The report is the same (serial order, the
    serial seeds). `on_loaded(kernel, cases)` hears of each spec as it is handed out, `on_compiled(done,
    total, cached)` of each source built or found in the cache; a failed compile raises its ToolError once the batch ends (the
    workers stopped), as load_kernels does. `profile_dir`: as verify_parallel's."""
    import queue
    import threading
    from ...compile import compile_many, jobs_per_bundle
    from ...runtime import bundle_of, device_arch, gpu_modules
    from .rooms import kernel_cases
    from .runner import load_kernel
    torch, _ = gpu_modules()
    shapes = tuple(shapes)
    device_index = torch.cuda.current_device()
    arch = device_arch(torch, device_index)
    bundles = [bundle_of(str(path)) for path in spec_paths]
    compile_jobs_list, owner = [], []
    for index, parts in enumerate(jobs_per_bundle(bundles, arch)):
        compile_jobs_list += parts
        owner += [index] * len(parts)
    parts_left = [0] * len(bundles)
    for index in owner:
        parts_left[index] += 1
    built: queue.Queue = queue.Queue()     # spec indices whose parts are all compiled; None: the batch ended
    for index, left in enumerate(parts_left):
        if not left:
            built.put(index)
    batch_end: list = []
    done_sources = [0]
    failed: set[int] = set()        # specs with a part that did not compile: never handed out
    stop = threading.Event()        # set when the verifying fails: the compile drops its queued sources

    def on_done(job_index, result):
        if stop.is_set():
            raise _CompileStopped()     # compile_many cancels what it has queued and returns through here
        index = owner[job_index]
        parts_left[index] -= 1
        done_sources[0] += 1
        if on_compiled:
            on_compiled(done_sources[0], len(compile_jobs_list), bool(getattr(result, "cached", False)))
        if isinstance(result, BaseException):
            failed.add(index)           # the batch's ToolError names it once the batch ends
        elif not parts_left[index] and index not in failed:
            built.put(index)

    def compile_all():
        try:
            batch_end.append(compile_many(compile_jobs_list, workers=compile_jobs, progress=False, on_done=on_done))
        except BaseException as exc:  # noqa: BLE001 - raised in the calling thread
            batch_end.append(exc)
        finally:
            built.put(None)

    compiler = threading.Thread(target=compile_all, name="attngen-verify-compile", daemon=True)
    compiler.start()
    compiled_all = [False]

    def ready(wait: float):
        """The specs built since the last call, loaded: [(index, kernel, cases)]."""
        handed = []
        try:
            index = built.get(timeout=wait) if wait else built.get_nowait()
            while True:
                if index is None:
                    compiled_all[0] = True
                    end = batch_end[0] if batch_end else None
                    if isinstance(end, BaseException):
                        raise end
                    if end is not None:
                        end.raise_errors()
                else:
                    kernel = load_kernel(spec_paths[index], bundles[index])
                    cases = kernel_cases(kernel, shapes, kernel.masks)
                    if on_loaded:
                        on_loaded(kernel, len(cases))
                    handed.append((index, kernel, cases))
                index = built.get_nowait()
        except queue.Empty:
            pass
        return handed

    try:
        return _serve(spec_paths, shapes, seed, jobs, device_index, ready, lambda: compiled_all[0], suite_name,
                      on_case, count=len(bundles), profile_dir=profile_dir)
    except BaseException:
        stop.set()      # the running nvcc processes end; the queued sources are dropped
        raise


class _CompileStopped(Exception):
    """Raised into the compile batch of verify_streaming once the verifying has failed."""


def _serve(spec_paths, shapes, seed: int, jobs: int, device_index: int, ready, all_handed, suite_name: str,
           on_case, count: int | None = None, profile_dir=None) -> VerifyReport:
    """Run the specs `ready(wait)` hands out ([(index, kernel, cases)], waiting up to `wait` seconds for
    one; `all_handed()` true once it will hand out no more) in `jobs` worker processes; the report in
    index order. `count`: how many specs there are (default: those handed out at once)."""
    import multiprocessing
    from .runner import verify_report
    first = ready(0)
    count = len(first) if count is None else count
    kernels: list = [None] * count
    expected: list = [None] * count
    received: list[list[CaseResult]] = [[] for _ in range(count)]
    ctx = multiprocessing.get_context("spawn")     # CUDA cannot cross a fork
    tasks, results = ctx.Queue(), ctx.Queue()
    jobs = max(1, min(jobs, count))
    workers = [ctx.Process(target=_worker, args=(list(map(str, spec_paths)), shapes, seed, device_index, tasks,
                                                 results, w), kwargs={"profile_dir": profile_dir} if profile_dir else {},
                           daemon=True) for w in range(jobs)]
    for w in workers:
        w.start()
    handed = 0
    closed = False

    def hand_out(items):
        nonlocal handed, closed
        for index, kernel, cases in items:
            kernels[index], expected[index] = kernel, cases
            tasks.put(index)
            handed += 1
        if not closed and all_handed():
            for _ in range(jobs):
                tasks.put(None)
            closed = True

    running: dict[int, int] = {}        # worker -> the spec index it runs
    finished: set[int] = set()
    deferred: list[tuple[int, int]] = []    # (spec index, case position) of cases that ran out of memory
    error = None
    try:
        hand_out(first)
        while len(finished) < count and error is None:
            if not closed:
                hand_out(ready(0))
            try:
                message = results.get(timeout=0.05 if not closed else 0.5)
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
            elif kind == "defer":
                _, index, position, case = message
                received[index].append(case)        # its place in the report, until it runs alone
                deferred.append((index, position))
            elif kind == "start":
                running[message[1]] = message[2]
            elif kind == "done":
                running.pop(message[1], None)
                finished.add(message[2])
            else:
                error = message[3]
    except BaseException as exc:  # noqa: BLE001 - a failed compile or load: the workers stop, then it is raised
        error = exc
    finally:
        if not closed:      # the last spec may finish before the end of the compile is heard: stop the workers
            for _ in range(jobs):
                tasks.put(None)
        for proc in workers:
            if proc.is_alive() and error is not None:
                proc.terminate()
        for proc in workers:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    if error is not None:
        raise error
    while not all_handed():     # every worker stopped early: the specs not handed out yet are reported too
        for index, kernel, cases in ready(0.5):
            kernels[index], expected[index] = kernel, cases
    for index in range(count):
        if len(received[index]) < len(expected[index]):
            _not_run(received[index], expected[index], kernels[index].name,
                     "no verify worker was left to run it (each lost its CUDA context or exited)", on_case)
    for index, position in deferred:        # the workers are gone: each case alone on the GPU
        received[index][position] = run_alone(kernels[index], expected[index][position], index, seed, on_case)
    report = verify_report([k for k in kernels if k is not None], [case for cases in received for case in cases],
                           suite_name)
    if deferred:
        report.ran_alone = len(deferred)
    return report


def run_alone(kernel, case: tuple, kernel_index: int, seed: int, on_case) -> CaseResult:
    """One case of `kernel` run in this process, with the same seed as in a worker or a serial run."""
    from .runner import Runner
    return Runner(seed, on_case).run(kernel, [case], kernel_index, kernel.name)[0]


def _not_run(got: list[CaseResult], cases: list[tuple], label: str, why: str, on_case) -> None:
    """The cases of one spec past those `got` holds, reported as not run, in order."""
    for variant, function, shape, _index, _check in cases[len(got):]:
        case = CaseResult(label, function, variant, shape, passed=False, problems=[f"not run: {why}"])
        got.append(case)
        if on_case:
            on_case(case)
