"""Many compiles at once (compile.compile_many) and `attngen warm`: N jobs on J workers take about
N/J of the serial time, results come back in the jobs' order, a failed job is reported with its
label, and a cache hit never reaches the pool. Tests stand in for nvcc with a fake that sleeps
(fake_build's well-formed cubins, so its entries are real cache hits); those marked `nvcc` run it."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from attngen import compile as compile_mod
from attngen.compile import CompileJob, CompileResult, compile_many
from attngen.errors import NoGpuError, ToolError
from hostile_helpers import assert_clean, error_lines, invoke, use_fake_nvcc
from test_hostile_cache import FAKE_SOURCE, fake_build

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "specs"
DELAY = 0.3            # seconds one fake compile takes


def source(i: int) -> str:
    """A source of its own (kernel attngen_t<i>_none), so each has its own cache entry."""
    return FAKE_SOURCE.replace("attngen_t_none", f"attngen_t{i}_none")


class SleepyNvcc:
    """Stands in for compile.run_nvcc: sleeps (`delays` by kernel name, else DELAY), then builds
    fake_build's cubin; a source holding BROKEN fails as nvcc does. Counts calls and the most
    running at once."""

    def __init__(self, delays=None):
        self.delays = delays or {}
        self.calls = 0
        self.running = self.most = 0
        self.lock = threading.Lock()

    def __call__(self, src, arch, nvcc):
        with self.lock:
            self.calls += 1
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            name = next(iter(compile_mod.source_kernels(src)), "")
            time.sleep(self.delays.get(name, DELAY))
            if "BROKEN" in src:
                raise ToolError(f"nvcc failed for {arch} (exit 1):\nkernel.cu(3): error: identifier BROKEN is undefined")
            cubin, log = fake_build(src)
            return CompileResult(arch, cubin, compile_mod.report_from_cubin(cubin, log), log, False)
        finally:
            with self.lock:
                self.running -= 1


@pytest.fixture
def sleepy(monkeypatch, tmp_path):
    return use_fake_nvcc(monkeypatch, tmp_path, SleepyNvcc())


def jobs(n: int, arch: str = "sm_89") -> list[CompileJob]:
    return [CompileJob(source(i), arch, f"spec{i}") for i in range(n)]


def kernel_of(result: CompileResult) -> str:
    return result.functions[0].name


# -- the pool ---------------------------------------------------------------------------------------

def test_n_jobs_on_j_workers_take_about_n_over_j_of_the_serial_time(sleepy):
    n, j = 8, 4
    start = time.monotonic()
    batch = compile_many(jobs(n), workers=j, progress=False)
    took = time.monotonic() - start
    serial = n * DELAY
    assert sleepy.calls == n and sleepy.most == j
    assert n / j * DELAY <= took < serial / 2, f"{took:.2f} s for {n} jobs on {j} workers (serial {serial:.1f} s)"
    assert batch.workers == j and batch.cached == 0 and not batch.errors


def test_results_keep_the_order_of_the_jobs(monkeypatch, tmp_path):
    # The first jobs take longest, so they finish last.
    fake = use_fake_nvcc(monkeypatch, tmp_path, SleepyNvcc({f"attngen_t{i}_none": 0.05 * (6 - i) for i in range(6)}))
    batch = compile_many(jobs(6), workers=3, progress=False)
    assert [kernel_of(r) for r in batch.results] == [f"attngen_t{i}_none" for i in range(6)]
    assert fake.calls == 6


def test_an_error_in_one_job_is_reported_with_its_spec_and_the_others_compile(sleepy):
    work = jobs(4)
    work[2] = CompileJob(source(2).replace("int n;", "int n; BROKEN;"), "sm_89", "specs/broken.yaml")
    batch = compile_many(work, workers=2, progress=False)
    assert [j.label for j, _ in batch.errors] == ["specs/broken.yaml"]
    assert all(isinstance(r, CompileResult) for i, r in enumerate(batch.results) if i != 2)
    assert "1 failed" in batch.summary()
    with pytest.raises(ToolError) as exc:
        batch.raise_errors()
    first = str(exc.value).splitlines()[0]
    assert first.startswith("specs/broken.yaml: nvcc failed for sm_89") and "BROKEN" in str(exc.value)


def test_every_failure_is_counted_in_the_one_error(sleepy):
    work = [CompileJob(source(i) + "BROKEN", "sm_89", f"specs/b{i}.yaml") for i in range(3)]
    batch = compile_many(work, workers=3, progress=False)
    with pytest.raises(ToolError, match=r"^specs/b0.yaml: .*\(2 more failed: specs/b1.yaml, specs/b2.yaml\)"):
        batch.raise_errors()


def test_cache_hits_never_start_a_process(sleepy, monkeypatch):
    compile_many(jobs(3), workers=2, progress=False)
    calls = sleepy.calls

    def no_pool(*a, **kw):
        raise AssertionError("a cache hit reached the pool")
    monkeypatch.setattr("concurrent.futures.ThreadPoolExecutor", no_pool)
    monkeypatch.setattr("subprocess.Popen", no_pool)
    batch = compile_many(jobs(3), workers=2, progress=False)
    assert sleepy.calls == calls
    assert batch.cached == 3 and all(r.cached for r in batch.results)
    assert batch.summary().startswith("compiled 3 sources (3 cached) in ") and "process" not in batch.summary()


def test_a_source_given_twice_compiles_once(sleepy):
    work = jobs(2) + jobs(1)
    batch = compile_many(work, workers=4, progress=False)
    assert sleepy.calls == 2 and kernel_of(batch.results[2]) == kernel_of(batch.results[0])


def test_the_summary_counts_sources_cached_and_processes(sleepy):
    compile_many(jobs(1), workers=1, progress=False)
    summary = compile_many(jobs(3), workers=2, progress=False).summary()
    assert summary.startswith("compiled 3 sources (1 cached) in ") and summary.endswith(" s on 2 processes")


# -- how many at once, and the bar ------------------------------------------------------------------

def test_jobs_default_to_the_usable_cpus_and_the_env_overrides(monkeypatch):
    monkeypatch.delenv(compile_mod.JOBS_ENV, raising=False)
    assert 1 <= compile_mod.default_jobs() <= compile_mod.DEFAULT_JOBS_CAP
    monkeypatch.setenv(compile_mod.JOBS_ENV, "3")
    assert compile_mod.default_jobs() == 3


@pytest.mark.parametrize("value", ["0", "-1", "two", "999"])
def test_a_bad_jobs_env_is_one_error(monkeypatch, value):
    from attngen.errors import AttngenError
    monkeypatch.setenv(compile_mod.JOBS_ENV, value)
    with pytest.raises(AttngenError, match=f"^{compile_mod.JOBS_ENV} must be a whole number from 1 to 256"):
        compile_mod.default_jobs()


def test_the_bar_shows_counts_when_asked_and_nothing_off_a_terminal(sleepy, capsys, monkeypatch):
    monkeypatch.delenv(compile_mod.PROGRESS_ENV, raising=False)
    compile_many(jobs(2), workers=2)                     # stderr is captured: not a terminal
    assert capsys.readouterr().err == ""
    compile_many(jobs(4)[2:], workers=2, progress=True)
    err = capsys.readouterr().err
    assert "compiling" in err and "2/2" in err
    monkeypatch.setenv(compile_mod.PROGRESS_ENV, "1")
    assert compile_mod.show_progress() and not compile_mod.show_progress(False)


def test_the_cli_help_names_the_default_cap():
    from attngen.cli.options import JOBS_HELP
    assert f"at most {compile_mod.DEFAULT_JOBS_CAP}]" in JOBS_HELP and compile_mod.JOBS_ENV in JOBS_HELP


# -- callers: a bundle's parts are jobs of one batch, compiled before any load ----------------------

def test_verify_compiles_every_part_of_every_spec_before_the_first_load(sleepy, monkeypatch, capsys):
    from attngen import runtime
    from attngen.eval import verify

    class FakeCuda:
        @staticmethod
        def current_device():
            return 0

    class FakeTorch:
        cuda = FakeCuda

    loads = []

    class StubKernel:
        @classmethod
        def from_sources(cls, plan, sources, **kw):
            loads.append((plan.spec.name, len(sources), sleepy.calls))
            return plan.spec.name

    monkeypatch.setattr(runtime, "gpu_modules", lambda: (FakeTorch, None))
    monkeypatch.setattr(runtime, "device_arch", lambda torch, index=None: "sm_90")
    monkeypatch.setattr(runtime, "kernel_class", lambda plan: StubKernel)
    paths = [SPECS / "h100_bwd_d128.yaml", SPECS / "phase4.yaml"]
    assert verify.load_kernels(paths) == ["h100_bwd_d128", "phase4"]
    parts = sum(n for _name, n, _calls in loads)
    assert parts > 2 and all(calls == parts for _name, _n, calls in loads)   # every compile before the first load
    assert sleepy.most > 1                                                    # the bundle's parts at once
    assert capsys.readouterr().err.startswith(f"compiled {parts} sources (0 cached) in ")


# -- attngen warm -----------------------------------------------------------------------------------

def test_warm_without_a_gpu_or_arch_refuses_in_one_line(monkeypatch):
    def no_gpu():
        raise NoGpuError("no CUDA GPU: torch sees none")
    monkeypatch.setattr("attngen.runtime.gpu_modules", no_gpu)
    line = assert_clean(*invoke(["warm"]))
    assert "--arch sm_90" in line and "no CUDA GPU" in line


def test_warm_serves_the_dispatch_tables_specs_for_the_arch(sleepy):
    from attngen.ops.table import load_table
    served = {e.spec for e in load_table(SPECS / "dispatch" / "table.yaml") if e.arch == "sm_89"}
    code, out, err, exc, _ = invoke(["warm", "--arch", "sm_89", "--json", "--jobs", "3"])
    assert code == 0, err
    parts = json.loads(out)["parts"]
    assert {p["part"].split(" (")[0] for p in parts} == served and all(p["arch"] == "sm_89" for p in parts)
    assert err.strip().startswith(f"compiled {len(parts)} sources (0 cached) in ") and sleepy.most == 3


def test_warm_of_an_arch_the_table_does_not_serve_refuses_in_one_line(sleepy):
    line = assert_clean(*invoke(["warm", "--arch", "sm_75"]))
    assert "serves nothing on sm_75" in line and "sm_90" in line


def test_warm_of_a_spec_that_cannot_run_on_the_arch_refuses_in_one_line(sleepy):
    line = assert_clean(*invoke(["warm", "--arch", "sm_89", SPECS / "lab" / "h100_wgmma_d128.yaml"]))
    assert "h100_wgmma_d128.yaml" in line and "sm_90a-only" in line


def test_warm_reports_a_failed_compile_in_one_error(monkeypatch, tmp_path):
    def broken(src, arch, nvcc):
        raise ToolError(f"nvcc failed for {arch} (exit 1):\nkernel.cu(3): error: boom")
    use_fake_nvcc(monkeypatch, tmp_path, broken)
    code, out, err, *_ = invoke(["warm", "--arch", "sm_89", SPECS / "phase4.yaml"])
    assert code == 3 and "Traceback" not in err
    assert error_lines(err)[1].startswith("attngen: phase4: nvcc failed for sm_89"), err


@pytest.mark.nvcc
def test_warm_compiles_two_small_specs_with_nvcc(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path / "cache"))
    specs = [SPECS / "phase4.yaml", SPECS / "l4_mma_d64.yaml"]
    code, out, err, *_ = invoke(["warm", "--arch", "sm_90a", *specs, "--json"])
    assert code == 0, err
    parts = json.loads(out)["parts"]
    assert [p["part"] for p in parts] == ["phase4", "l4_mma_d64"]
    assert all(p["arch"] == "sm_90" and not p["cached"] and p["registers"] > 0 for p in parts)
    assert err.strip().startswith("compiled 2 sources (0 cached) in ")
    code, out, err, *_ = invoke(["warm", "--arch", "sm_90", *specs])
    assert code == 0 and err.strip().startswith("compiled 2 sources (2 cached) in "), err
