"""`attngen warm`: the cubin cache filled with what a GPU will load."""
from __future__ import annotations

import json
from pathlib import Path

import click

from ..errors import AttngenError
from .options import JOBS_HELP, MAX_JOBS, archs_option, gpu_arch
from .spec_files import spec_files


@click.command()
@click.argument("specs", nargs=-1, type=click.Path(dir_okay=False))
@click.option("--arch", "archs", multiple=True, callback=archs_option,
              help="the GPU's arch, repeatable: sm_90 (or sm_90a) for H100/H200, sm_89 for L4  [default: this "
                   "machine's GPU]")
@click.option("--jobs", type=click.IntRange(1, MAX_JOBS), default=None, help=JOBS_HELP)
@click.option("--specs-dir", default=None,
              help="the specs whose dispatch/table.yaml says what to warm [default: the ones attngen.attention "
                   "serves: specs/ of this checkout, or those installed with attngen]")
@click.option("--progress/--no-progress", default=None,
              help="draw the progress bar on stderr  [default: when stderr is a terminal, or $ATTNGEN_PROGRESS=1]")
@click.option("--native/--no-native", default=True,
              help="also build the native training step (a C++ autograd node for eager training calls, "
                   "attngen/runtime/native), where torch and a C++ compiler are installed  [default: on]")
@click.option("--json", "as_json", is_flag=True, help="print every compiled part (arch, cached, registers) as JSON")
def warm(specs, archs, jobs, specs_dir, progress, native, as_json):
    """Fill the cubin cache with what a GPU will load, so first calls compile nothing.

    \b
    With no SPECS: every spec the dispatch table (specs/dispatch/table.yaml) serves on the
    arch, all that attngen.attention, attention_varlen, attention_with_kvcache and
    attention_fp8 may load there. With SPECS: those specs.
      attngen warm                              # for this machine's GPU
      attngen warm --arch sm_90 --arch sm_89    # for H100/H200 and L4 machines, from any machine
      attngen warm specs/phase4.yaml --arch sm_89

    \b
    nvcc is needed, a GPU is not: without one, name the arch. Each spec compiles for the
    target its kernels are loaded as (sm_90a for wgmma kernels on sm_90), every part of every
    spec at once, --jobs at a time, with one progress bar and a summary line. The cache is
    $ATTNGEN_CACHE_DIR (default ~/.cache/attngen); what it holds already is not compiled again.
    Exits 2 when a spec is bad or cannot run on the arch, 3 when nvcc is missing or fails.

    \b
    Where torch is installed it also builds the native training step (about 15-40 s once per
    torch install; a training process that finds none builds it in the background and takes
    the Python autograd node meanwhile). A failed build is reported and does not change the
    exit status: training then keeps the Python node.
    """
    from ..compile import bundle_jobs, compile_many, print_summary
    from ..runtime import bundle_of
    jobs_list = []
    for arch in archs or (gpu_arch("no GPU to take the arch from; name it: --arch sm_90 (H100/H200) or "
                                   "--arch sm_89 (L4)"),):
        table_arch = arch[:-1] if arch.endswith("a") else arch    # the table and the runtime key on sm_90
        for path in spec_files(specs, "") if specs else _served_specs(specs_dir, table_arch):
            plan, sources, label = bundle_of(str(path))
            try:
                jobs_list += bundle_jobs(plan, sources, table_arch, Path(path).stem)
            except ValueError as exc:
                raise click.UsageError(f"{path}: {exc}") from None
    batch = compile_many(jobs_list, workers=jobs, progress=progress)
    failed = any(isinstance(r, AttngenError) for r in batch.results)
    built = (_native_step() if native else "skipped (--no-native)") if not failed else "skipped (a compile failed)"
    if as_json:
        click.echo(json.dumps({"summary": batch.summary(), "native_step": built,
                               "parts": [_warmed(j, r) for j, r in zip(batch.jobs, batch.results)]}, indent=2))
    print_summary(batch)
    if not failed:
        click.echo(f"native training step: {built}", err=True)
    batch.raise_errors()


def _native_step() -> str:
    """Build the native training step (attngen/runtime/native); what became of it, in a few words."""
    try:
        import torch
    except ImportError:
        return "skipped (torch is not installed)"
    except Exception as exc:   # noqa: BLE001  (a torch that fails to import: say so, keep the exit status)
        return f"skipped (torch does not import: {exc})"
    from ..runtime import native
    if not native.enabled():
        return f"skipped ({native.ENV}=0)"
    try:
        return str(native.build(torch))
    except Exception as exc:   # noqa: BLE001  (a build that fails never changes warm's exit status)
        return f"not built: {exc}"


def _served_specs(specs_dir, table_arch: str) -> list[Path]:
    """The spec files the dispatch table names for `table_arch`, each once, in table order."""
    from ..ops.dispatch import SPECS_DIR
    from ..ops.table import load_table, table_path
    where = Path(specs_dir or SPECS_DIR)
    entries = load_table(table_path(where))
    names = list(dict.fromkeys(e.spec for e in entries if e.arch == table_arch))
    if not names:
        served = ", ".join(sorted({e.arch for e in entries})) or "no arch"
        raise click.UsageError(f"the dispatch table serves nothing on {table_arch} (it serves {served}); name the "
                               f"specs to warm")
    return [where / f"{name}.yaml" for name in names]


def _warmed(job, result) -> dict:
    """One part of `attngen warm --json`."""
    d = {"part": job.label, "arch": job.arch}
    if isinstance(result, AttngenError):
        return {**d, "error": str(result).partition("\n")[0]}
    return {**d, "cached": result.cached, "registers": max((f.registers for f in result.functions), default=None)}

