"""`attngen verify`: every case of every spec against an fp32 reference on the GPU, and again
through PyCUDA; the table and the JSON report."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from .options import MAX_SEED, SPECS_DIR_HELP, folder_option, report_file, root_option
from .spec_files import spec_files


@click.command()
@root_option
@click.argument("specs", nargs=-1, type=click.Path(dir_okay=False))
@click.option("--quick", is_flag=True, help="a 6-shape suite instead of the full 14 shapes per variant")
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False), callback=report_file,
              help="also write the full report (every case, errors, tolerances) to this file")
@click.option("--seed", type=click.IntRange(0, MAX_SEED), default=0, show_default=True,
              help="base seed of the random inputs")
@click.option("--failures-only", is_flag=True, help="list only failing cases in the table")
@click.option("--specs-dir", default=None, callback=folder_option, help=SPECS_DIR_HELP)
@click.option("--jobs", "-j", type=click.IntRange(1, 64), default=None,
              help="worker processes sharing the GPU, each running whole specs (default: half the cores, "
                   "at most 8); the report is the same for any number")
@click.option("--profile", "profile_dir", default=None, type=click.Path(file_okay=False),
              help="write a cProfile of each worker process to this folder (worker-N.prof; with --jobs 1, "
                   "serial.prof): where a run's host time goes, read with `python3 -m pstats FILE`")
@click.option("--changed-since", "since", default=None, metavar="REV",
              help="only the specs (of SPECS, or every spec) whose rendered sources differ from those committed "
                   "at git revision REV (HEAD: what the working tree's change touches; main: a branch's): a "
                   "template edit checked on the kernels it changed")
@click.option("--list", "list_only", is_flag=True,
              help="print the spec files the run would take, one a line, and run nothing (no GPU needed): with "
                   "--changed-since, what a change touches")
@click.option("--mps/--no-mps", default=True, show_default=True,
              help="the worker processes share the GPU through a private CUDA MPS daemon this run starts and "
                   "stops (their kernels run side by side instead of taking turns; 127 s -> 79 s over every "
                   "spec on an H200); --no-mps: time-sliced. Without nvidia-cuda-mps-control, time-sliced")
def verify(specs, quick, json_path, seed, failures_only, specs_dir, jobs, profile_dir, since, list_only, mps):
    """Run SPECS (default: every spec) on this GPU and compare every variant with torch.

    \b
    For each mask variant and each shape of the suite (seqlens that are not tile multiples,
    seqlen_q != seqlen_k both ways, GQA/MQA, both layouts, strided qkv): random inputs, an
    output poisoned with NaN, then
      pass when max|out - ref| <= 2 x max|torch low-precision - ref| + 1e-5
    (ref: fp32 attention on the upcast inputs), no NaN or unwritten element, nothing written
    past seqlen_q, and |lse - ref| <= 1e-3 + 1e-3 |ref|. Specs with varlen: true also run
    varlen cases (mixed lengths in one batch, both causal alignments) and decode specs
    their decode cases, under the same rule. Every case is launched a second time through
    PyCUDA and must agree bit for bit (atomics-based outputs: under the same rule). Sources
    compile in parallel while the cases run in --jobs worker processes, each spec as soon as its
    sources are built (--jobs 1: compiled first, run in this process). --changed-since main runs
    only the specs whose sources a branch changed. Exits 1 on any failure, 4 when there is no GPU,
    torch or CUDA driver.
    """
    from ..eval import verify as verification
    paths = spec_files(specs, specs_dir)
    if since is not None:
        from .changed import changed_since
        every = len(paths)
        paths = changed_since(paths, Path(specs_dir).parent, since)
        click.echo(f"{len(paths)} of {every} spec(s) render sources other than {since}'s", err=True)
    if list_only:
        for path in paths:
            click.echo(str(path))
        return
    if not paths:       # only where --changed-since kept none
        click.echo(f"attngen verify: nothing to run: no spec's sources changed since {since}")
        return
    start = time.perf_counter()
    shapes = verification.suite(quick)
    suite_name = "quick" if quick else "full"
    jobs = min(verification.default_jobs() if jobs is None else jobs, len(paths))
    if profile_dir is not None:
        from .. import fsutil
        profile_dir = str(fsutil.ensure_dir(Path(profile_dir).resolve()))
    if jobs > 1:
        from ..eval.verify.mps import shared_gpu
        from ..runtime import gpu_modules
        torch, _ = gpu_modules()        # no GPU: exit 4 here, before any daemon starts
        # CUDA initialised before the daemon is named: this process stays no client of it (a client still
        # attached would hold the daemon's quit until this process exits).
        device_index = torch.cuda.current_device()
        with shared_gpu(mps, device_index) as sharing:
            report = _verify_streaming(verification, paths, shapes, jobs, suite_name, seed, start, profile_dir,
                                       sharing)
    else:
        kernels = verification.load_kernels(paths, on_compile=lambda p, arch: click.echo(
            f"compiling {Path(p).stem} for {arch} ...", err=True))
        click.echo(f"loaded {len(kernels)} spec(s) in {time.perf_counter() - start:.1f} s; verifying in this "
                   "process", err=True)
        from ..eval.verify.parallel import profiled
        with profiled(None if profile_dir is None else str(Path(profile_dir) / "serial.prof")), \
                click.progressbar(length=verification.case_count(kernels, shapes), label="verifying",
                                  file=sys.stderr, show_pos=True) as bar:
            report = verification.verify_kernels(kernels, shapes, suite_name=suite_name, seed=seed,
                                                 on_case=lambda _case: bar.update(1))
    click.echo(format_verify(report, failures_only))
    memo_dispatch_table()
    if json_path:
        write_verify_json(report, json_path)
    if profile_dir is not None:
        click.echo(f"host profiles in {profile_dir} (python3 -m pstats {profile_dir}/"
                   f"{'worker-0' if jobs > 1 else 'serial'}.prof)", err=True)
    by_call = report.time_by_call()
    if by_call:
        click.echo("case time by call" + (f" (summed over the {jobs} workers)" if jobs > 1 else "") + ": " + ", ".join(
            f"{call} {n} cases {seconds:.0f} s" for call, (n, seconds) in by_call.items()), err=True)
    failed = len(report.failed)
    counts = report.pycuda_counts()
    click.echo(f"attngen verify: {len(report.cases) - failed} passed, {failed} failed "
               f"({len(paths)} spec(s), {len(shapes)} shapes per variant, {time.perf_counter() - start:.0f} s); "
               "launched again through PyCUDA: "
               f"{counts['bitwise']} bit for bit, {counts['bitwise but atomics']} within the error rule (atomics), "
               f"{counts['differs']} differ, {counts['not run']} not run", err=bool(failed))
    if not report.ok:
        sys.exit(1)


def memo_dispatch_table() -> None:
    """Parse the dispatch table the entry points read, so that its memo is in the user's cache beside the cubins this
    run compiled: the next process's first attngen call then parses no YAML (H200, right after a cold verify: a first
    forward call 725 ms in the first process, 47-56 ms in the next ones; the table's first parse is most of the
    difference, about 0.8 s on a 2-core host). A table that does not load is left to the call (and to `attngen
    check`), which names the file, entry and line: verify's exit status is the kernels'."""
    from ..errors import SpecError
    from ..ops.dispatch import SPECS_DIR
    from ..ops.table import load_table, table_path
    try:
        load_table(table_path(SPECS_DIR))
    except (SpecError, OSError):
        pass


def _verify_streaming(verification, paths, shapes, jobs: int, suite_name: str, seed: int, start: float,
                      profile_dir: str | None = None, sharing: str = "time-sliced"):
    """Every spec in `jobs` worker processes, each spec handed out as soon as its sources are compiled
    (the compile runs beside the verifying): one bar of the cases, whose total grows as specs load,
    with the compile's count beside it."""
    from tqdm import tqdm
    from ..compile import show_progress
    shown = show_progress(None)
    with tqdm(total=0, desc="verifying", unit="case", file=sys.stderr, dynamic_ncols=True, disable=not shown) as bar:
        compiled = [0, 0]
        cached = [0]
        loaded = [0]

        def status():
            text = f"{loaded[0]}/{len(paths)} specs loaded"
            if compiled[1] and compiled[0] < compiled[1]:
                text += f", compiling {compiled[0]}/{compiled[1]} sources"
            bar.set_postfix_str(text, refresh=True)

        def on_compiled(done: int, total: int, hit: bool):
            compiled[:] = [done, total]
            cached[0] += hit
            if done == total or done % 8 == 0:
                status()

        def on_loaded(_kernel, cases: int):
            loaded[0] += 1
            bar.total += cases
            status()

        report = verification.verify_streaming(paths, shapes, jobs=jobs, suite_name=suite_name, seed=seed,
                                               on_case=lambda _case: bar.update(1), on_loaded=on_loaded,
                                               on_compiled=on_compiled, profile_dir=profile_dir)
    if compiled[1]:
        click.echo(f"{compiled[1]} sources: {compiled[1] - cached[0]} compiled beside the verifying, {cached[0]} from "
                   "the cache", err=True)
    click.echo(f"verified {len(paths)} spec(s) in {jobs} worker processes sharing the GPU {sharing_words(sharing)} in "
               f"{time.perf_counter() - start:.1f} s", err=True)
    if getattr(report, "ran_alone", 0):
        click.echo(f"{report.ran_alone} case(s) ran out of GPU memory beside the other workers and ran again alone "
                   "at the end", err=True)
    return report


def sharing_words(sharing: str) -> str:
    """'through MPS (...)' or 'time-sliced (...)' as the summary line says it."""
    return "through " + sharing if sharing.startswith("MPS") else sharing


def write_verify_json(report, path) -> None:
    """The full verify report (every case, errors, tolerances) as JSON at `path`, written atomically."""
    from .. import fsutil
    fsutil.atomic_write_text(path, json.dumps(report.as_dict(), indent=2) + "\n")


def format_verify(report, failures_only: bool = False) -> str:
    """The verify table, one row per case of any type (each says its shape label and layout); the
    spec, variant, shape and layout columns widen to their longest entry."""
    cases = [c for c in report.cases if not (failures_only and c.passed)]
    sw = max([len("spec")] + [len(c.spec) for c in cases])
    vw = max([len("variant")] + [len(c.variant) for c in cases])
    hw = max([len("shape")] + [len(c.shape.label) for c in cases])
    lw = max([len("layout")] + [len(c.shape.layout) for c in cases])
    lines = [f"{report.device} ({report.arch}), torch {report.torch_version}, {report.suite} suite",
             f"{'spec':<{sw}} {'variant':<{vw}} {'shape':<{hw}} {'layout':<{lw}} {'max err':>9} {'bound':>9} "
             f"{'lse err':>9}  result"]

    def num(x):
        return f"{x:9.2e}" if x is not None else f"{'-':>9}"
    for c in cases:
        lines.append(f"{c.spec:<{sw}} {c.variant:<{vw}} {c.shape.label:<{hw}} {c.shape.layout:<{lw}} {num(c.max_err)} "
                     f"{num(c.bound)} {num(c.lse_err)}  {'pass' if c.passed else 'FAIL: ' + '; '.join(c.problems)}")
    return "\n".join(lines)

