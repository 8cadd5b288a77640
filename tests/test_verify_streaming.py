"""verify_streaming's scheduling without a GPU: the compile batch, the loads, the worker processes and
the report are stood in for (the workers are spawned processes running `steady_worker` or
`broken_worker` below), so what is tested is the hand-out: specs go out as their sources are built,
the report keeps the serial order, a failed compile raises once the batch ends without loading its
spec, and a failure of the verifying stops the compile. tests/test_gpu_verify.py runs the real thing."""
from __future__ import annotations

import time
import types

import pytest

import attngen.compile as compile_module
import attngen.runtime as runtime
import attngen.eval.verify.rooms as rooms
import attngen.eval.verify.runner as runner
from attngen.eval.verify import parallel

SPECS = [str(i) for i in range(7)]      # spec i has i % 3 sources; spec 5 cannot run on the GPU


def stand_in_worker(tasks, results, worker_id, short_of_memory=()):
    """Three cases a spec; the (spec, case) pairs in short_of_memory are handed back as out of memory."""
    while True:
        index = tasks.get()
        if index is None:
            return
        results.put(("start", worker_id, index))
        for case in range(3):
            if (index, case) in short_of_memory:
                results.put(("defer", index, case, ("placeholder", index, case)))
            else:
                results.put(("case", index, (index, case)))
        results.put(("done", worker_id, index))


def steady_worker(spec_paths, shapes, seed, device_index, tasks, results, worker_id):
    stand_in_worker(tasks, results, worker_id)


def short_of_memory_worker(spec_paths, shapes, seed, device_index, tasks, results, worker_id):
    """steady_worker, but the second case of spec 2 runs out of GPU memory beside the other workers."""
    stand_in_worker(tasks, results, worker_id, short_of_memory={(2, 1)})


def broken_worker(spec_paths, shapes, seed, device_index, tasks, results, worker_id):
    index = tasks.get()
    results.put(("raise", worker_id, index, RuntimeError("the verifier broke")))


@pytest.fixture
def stand_ins(monkeypatch):
    """The GPU-side pieces replaced; returns what the run did (loads, compile callbacks, a stop)."""
    seen = types.SimpleNamespace(loaded=[], compiled=[], stopped=[], fail_job=None, delay=0.01)
    gpu = types.SimpleNamespace(cuda=types.SimpleNamespace(current_device=lambda: 0))
    monkeypatch.setattr(runtime, "gpu_modules", lambda: (gpu, None))
    monkeypatch.setattr(runtime, "device_arch", lambda torch, index: "sm_90")
    monkeypatch.setattr(runtime, "bundle_of", lambda path: ("plan", ["source"] * (int(path) % 3), path))

    def bundle_jobs(plan, sources, arch, label):
        if label == "5":
            raise ValueError("cannot run on sm_90")
        return [(label, part) for part in range(len(sources))]

    def compile_many(jobs, workers=None, progress=None, on_done=None):
        for i, _job in enumerate(jobs):
            time.sleep(seen.delay)
            result = RuntimeError("nvcc failed") if i == seen.fail_job else types.SimpleNamespace(cached=i % 2 == 0)
            try:
                on_done(i, result)
            except Exception as exc:
                seen.stopped.append(type(exc).__name__)
                raise

        class Batch:
            def raise_errors(self):
                if seen.fail_job is not None:
                    raise compile_module.ToolError("nvcc failed on one source")
        return Batch()

    class Kernel:
        def __init__(self, path):
            self.name, self.masks = f"k{path}", ()
            seen.loaded.append(path)

    monkeypatch.setattr(compile_module, "bundle_jobs", bundle_jobs)
    monkeypatch.setattr(compile_module, "compile_many", compile_many)
    monkeypatch.setattr(runner, "load_kernel", lambda path, bundle=None: Kernel(path))
    monkeypatch.setattr(rooms, "kernel_cases", lambda kernel, shapes, masks: [0, 1, 2])
    monkeypatch.setattr(runner, "verify_report", lambda kernels, cases, suite: (len(kernels), cases))
    monkeypatch.setattr(parallel, "_worker", steady_worker)
    return seen


def test_specs_go_out_as_they_are_built_and_the_report_keeps_the_serial_order(stand_ins):
    heard = []
    kernels, cases = parallel.verify_streaming(
        SPECS, (), jobs=3, suite_name="quick", on_case=heard.append,
        on_compiled=lambda done, total, hit: stand_ins.compiled.append((done, total, hit)))
    assert kernels == len(SPECS) and cases == [(i, c) for i in range(len(SPECS)) for c in range(3)]
    assert sorted(heard) == cases
    # specs with no source to build (0, 3, 6; 5 cannot run here) first, then in the order they are built
    assert stand_ins.loaded == ["0", "3", "5", "6", "1", "2", "4"]
    assert [c[:2] for c in stand_ins.compiled] == [(i, 4) for i in range(1, 5)]   # spec 1: 1, 2: 2, 4: 1


def test_a_case_short_of_memory_runs_again_alone_in_its_place(stand_ins, monkeypatch):
    """A case that ran out of GPU memory beside the other workers is run again by this process once they are done
    (run_alone, with its spec's kernel and its own case), and its result takes the placeholder's place."""
    monkeypatch.setattr(parallel, "_worker", short_of_memory_worker)
    alone = []

    def run_alone(kernel, case, kernel_index, seed, on_case):
        alone.append((kernel.name, case, kernel_index))
        on_case(("alone", kernel_index, case))
        return ("alone", kernel_index, case)
    monkeypatch.setattr(parallel, "run_alone", run_alone)
    monkeypatch.setattr(runner, "verify_report", lambda kernels, cases, suite: types.SimpleNamespace(cases=cases))
    heard = []
    report = parallel.verify_streaming(SPECS, (), jobs=3, suite_name="quick", on_case=heard.append)
    expected = [(i, c) for i in range(len(SPECS)) for c in range(3)]
    expected[expected.index((2, 1))] = ("alone", 2, 1)
    assert report.cases == expected and alone == [("k2", 1, 2)] and report.ran_alone == 1
    assert ("alone", 2, 1) in heard and not any(h[0] == "placeholder" for h in heard)


def test_a_failed_compile_raises_once_the_batch_ends_and_its_spec_is_not_loaded(stand_ins):
    stand_ins.fail_job = 2      # the second source of spec 2
    with pytest.raises(compile_module.ToolError, match="nvcc failed"):
        parallel.verify_streaming(SPECS, (), jobs=2, suite_name="quick")
    assert "2" not in stand_ins.loaded and "4" in stand_ins.loaded


def test_a_failure_of_the_verifying_stops_the_compile(stand_ins, monkeypatch):
    monkeypatch.setattr(parallel, "_worker", broken_worker)
    # Each stand-in compile takes long enough (4 jobs, 10 s in all) that the spawned worker reports its failure
    # before the batch ends, even on a loaded 2-core machine (at 0.5 s a job the batch could end first).
    stand_ins.delay = 2.5
    with pytest.raises(RuntimeError, match="the verifier broke"):
        parallel.verify_streaming(SPECS, (), jobs=2, suite_name="quick")
    deadline = time.time() + 10
    while not stand_ins.stopped and time.time() < deadline:
        time.sleep(0.05)
    assert stand_ins.stopped == ["_CompileStopped"]


def test_a_profiled_worker_writes_its_profile_even_when_it_stops_early(tmp_path):
    """verify --profile: a worker runs under cProfile and leaves worker-<n>.prof when it returns (one the
    parent terminates after an error leaves none); here it stops at once (without a GPU it reports why to
    the parent; with one there is no spec to take)."""
    import multiprocessing
    import pstats
    ctx = multiprocessing.get_context("spawn")      # as _serve starts them (and torch's settings stay there)
    tasks, results = ctx.Queue(), ctx.Queue()
    tasks.put(None)
    worker = ctx.Process(target=parallel._worker, args=(SPECS, (), 0, 0, tasks, results, 3),
                         kwargs={"profile_dir": str(tmp_path)})
    worker.start()
    worker.join(timeout=120)
    assert worker.exitcode == 0
    assert pstats.Stats(str(tmp_path / "worker-3.prof")).total_calls > 0


class ShortOfMemory(Exception):
    """Stands in for torch.cuda.OutOfMemoryError (CI has no torch)."""


def test_the_runner_hands_back_a_case_short_of_memory(monkeypatch):
    """In a worker (on_out_of_memory given) a case that runs out of GPU memory is handed back, its placeholder saying
    so, and on_case does not hear of it; in a serial run (none given) it is a failed case."""
    monkeypatch.setattr(runner, "convention_of", lambda kernel: "forward")
    monkeypatch.setattr(runner, "out_of_memory", lambda exc: isinstance(exc, ShortOfMemory))
    monkeypatch.setattr(runner, "release_cached_memory", lambda: None)
    monkeypatch.setattr(runner, "context_usable", lambda device: True)
    kernel = types.SimpleNamespace(label="k", device=types.SimpleNamespace(type="cuda"))

    def check(fails):
        def run(seed, label):
            if fails:
                raise ShortOfMemory("CUDA out of memory. Tried to allocate 1024.00 MiB")
            return runner.CaseResult(label, "f", "none", "shape", passed=True)
        return run
    cases = [("none", "f", types.SimpleNamespace(label="s"), i, check(i == 1)) for i in range(3)]
    heard, handed = [], []
    results = runner.Runner(0, heard.append, on_out_of_memory=lambda *a: handed.append(a)).run(kernel, cases, 4, "k")
    assert [r.passed for r in heard] == [True, True] and [h[:2] for h in handed] == [(4, 1)]
    assert handed[0][2] is results[1] and results[1].problems == [f"not run yet: {runner.OUT_OF_MEMORY_BESIDE_OTHERS}"]
    heard.clear()
    results = runner.Runner(0, heard.append).run(kernel, cases, 4, "k")
    assert [r.passed for r in heard] == [True, False, True] and "ShortOfMemory" in heard[1].problems[0]


def test_out_of_memory_is_torchs_gpu_error():
    torch = pytest.importorskip("torch")
    assert runner.out_of_memory(torch.cuda.OutOfMemoryError("CUDA out of memory"))
    assert not runner.out_of_memory(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not runner.out_of_memory(MemoryError())


def test_out_of_memory_is_the_drivers_too(monkeypatch):
    """A module load that found no GPU memory beside the other workers runs again alone as well: the runtime's
    driver error with CUDA_ERROR_OUT_OF_MEMORY, and PyCUDA's MemoryError (cuModuleGetFunction failed: out of
    memory); other driver errors and the host's MemoryError stay failures."""
    pytest.importorskip("torch")
    import sys
    import types
    from attngen.runtime.driver import DriverError
    assert runner.out_of_memory(DriverError("cuModuleLoadData", 2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"))
    assert not runner.out_of_memory(DriverError("cuLaunchKernel", 700, "CUDA_ERROR_ILLEGAL_ADDRESS", "illegal"))
    pycuda_driver = types.ModuleType("pycuda.driver")
    pycuda_driver.Error = type("Error", (Exception,), {})
    pycuda_driver.MemoryError = type("MemoryError", (pycuda_driver.Error,), {})
    monkeypatch.setitem(sys.modules, "pycuda.driver", pycuda_driver)
    assert runner.out_of_memory(pycuda_driver.MemoryError("cuModuleGetFunction failed: out of memory"))
    assert not runner.out_of_memory(pycuda_driver.Error("cuModuleGetFunction failed: invalid handle"))
    assert not runner.out_of_memory(MemoryError())
