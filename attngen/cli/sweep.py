"""`attngen sweep`: the fastest correct variant of a spec per shape on this GPU."""
from __future__ import annotations

import json
import re
import sys

import click

from .options import (JOBS_HELP, MAX_BATCH, MAX_BUDGET, MAX_GENERATIONS, MAX_HEADS, MAX_JOBS, MAX_REPS,
                      MAX_SEED, MAX_SEQLEN, MAX_TOP_K, gpu_arch, output_folder, report_file, shapes_option)


def _sweep_shapes(ctx, param, value):
    """--shapes of sweep: checked as bench's are (the sweep parses them against its base spec), kept as written."""
    shapes_option(ctx, param, value)
    return value


@click.command()
@click.argument("base_spec", type=click.Path(dir_okay=False))
@click.option("--shapes", default=None, metavar="BxHxSxD,...", callback=_sweep_shapes,
              help="comma-separated shapes to measure; D must be the base's head_dim, the dtype is the base's "
                   f"(not needed with --compile-only); B at most {MAX_BATCH}, H {MAX_HEADS}, S {MAX_SEQLEN}")
@click.option("--causal", type=click.Choice(["both", "yes", "no"]), default="both", show_default=True)
@click.option("--budget", type=click.IntRange(1, MAX_BUDGET), default=None,
              help="at most N candidates go on to compile (a seeded sample when more survive pruning)")
@click.option("--search", type=click.Choice(["grid", "evolve"]), default="grid", show_default=True,
              help="grid: every surviving candidate; evolve: keep the top-k and mutate them")
@click.option("--seed", type=click.IntRange(0, MAX_SEED), default=0, show_default=True,
              help="seed of the sampling, the evolution and the inputs")
@click.option("--generations", type=click.IntRange(0, MAX_GENERATIONS), default=4, show_default=True,
              help="evolve: generations")
@click.option("--top-k", type=click.IntRange(1, MAX_TOP_K), default=4, show_default=True,
              help="evolve: parents kept per generation (the first population is twice this)")
@click.option("--arch", default=None, help="compile for this arch, e.g. sm_90 (default: the GPU's)")
@click.option("--compile-only", is_flag=True,
              help="stop after compiling: fill the cubin cache (on a CPU machine, with --arch) for a later GPU run")
@click.option("--jobs", type=click.IntRange(1, MAX_JOBS), default=None,
              help=JOBS_HELP)
@click.option("--json", "json_file", type=click.Path(dir_okay=False), callback=report_file,
              help="write the full report here")
@click.option("--write-best", "best_dir", type=click.Path(file_okay=False), callback=output_folder,
              help="write each case's winning spec to DIR/<name>.yaml, ready for `attngen build`")
@click.option("--reps", type=click.IntRange(1, MAX_REPS), default=30, show_default=True,
              help="timed calls per measurement (median reported)")
def sweep(base_spec, shapes, causal, budget, search, seed, generations, top_k, arch, compile_only, jobs, json_file,
          best_dir, reps):
    """Search variants of BASE_SPEC for the fastest correct kernel per shape on this GPU.

    \b
    The space is declared by the base spec's kind, around the base's own values. scalar,
    wmma and mma.sync specs: tile.block_m, tile.block_n, warps (and producer/consumer
    splits when the base has warp roles), smem.stages, smem.swizzle (the base's or none)
    and smem.q_in_registers. wgmma specs: tile.block_n, consumer warpgroups with or
    without a producer warpgroup (block_m follows), smem.stages, registers, schedule,
    epilogue, and blocks (one per query block, or persistent with 1 or 2 Q tiles).
    Backward specs: tile.block_m, tile.block_n with the warps that own its keys (16 per warp),
    and for mma.sync query_stages and query_chunk; their backward call is timed (given
    attngen's forward o and lse) beside flash's backward, TFLOP/s counting 2.5x the forward's
    FLOPs, and their gradients are checked. A candidate is dropped before compiling when it
    breaks a spec rule, exceeds the shared-memory budget or renders the same code as another;
    after compiling when nvcc fails or ptxas reports spills; on the GPU when it fails the
    verifier's quick suite or the output check on the sweep's inputs. Survivors are timed
    like `attngen bench`, beside torch's flash backend (vs flash = flash time / time).
    Results are cached per spec, GPU and shape in the sweep/ folder of the cubin cache
    ($ATTNGEN_CACHE_DIR, default ~/.cache/attngen): an interrupted sweep resumes. Exits 1 when a case has no verified
    candidate (or, with --compile-only, when none compiles cleanly).
    """
    from .. import fsutil
    from ..eval import sweep as S
    from ..kinds import kind_of
    from ..spec import load_spec
    base = load_spec(base_spec)
    kind = kind_of(base)
    if kind.space is None:
        raise click.UsageError(f"{base_spec}: sweep searches the variants a kind declares, and {kind.name} specs "
                               f"declare none; write variants as specs and time them with `attngen bench`")
    if not getattr(base, "padded", True):
        raise click.UsageError(f"{base_spec}: sweep times padded calls, and this spec serves varlen calls only "
                               f"(varlen: only); sweep a copy with varlen: true, or its family's padded base")
    if arch is not None and not re.fullmatch(r"sm_\d+a?", arch):
        raise click.BadParameter(f"must look like sm_89 or sm_90a (got {arch!r})", param_hint="--arch")
    if not shapes and not compile_only:
        raise click.UsageError("--shapes is required (unless --compile-only)")
    if best_dir and compile_only:
        raise click.UsageError("--write-best needs measurements: drop --compile-only")
    try:
        cases = S.parse_cases(shapes, base, causal) if shapes else []
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--shapes/--causal") from None
    measurer = None
    if compile_only:
        arch = arch or gpu_arch("--compile-only needs --arch (e.g. --arch sm_90) when there is no GPU to take it "
                                "from")
    else:
        measurer = S.GpuMeasurer(reps=reps, seed=seed)   # no GPU, torch or CUDA driver: exit 4 before any work
        if arch is not None and arch != measurer.arch:
            raise click.BadParameter(f"{arch} is not this GPU's arch ({measurer.arch}); a measuring sweep compiles "
                                     "for the GPU it runs on", param_hint="--arch")
        arch = measurer.arch
    from ..compile import default_jobs
    options = S.SweepOptions(cases, search=search, budget=budget, seed=seed, generations=generations, top_k=top_k,
                             jobs=jobs or default_jobs())
    space = S.default_space(base)
    click.echo(f"sweep: {space.size} candidates in the space of {base.name}; pruning ...", err=True)
    survivors = S.prune(base, space, **S.prune_options(options))
    steps = S.planned_steps(len(survivors[0]), options, measuring=measurer is not None)
    # Off a terminal click prints every new label as a line: there, relabel every 10% only.
    every = 1 if sys.stderr.isatty() else max(1, steps // 10)
    with click.progressbar(length=steps, label="sweep", file=sys.stderr, show_pos=True) as bar:
        def changed(p, n):
            if (bar.pos + n) // every != bar.pos // every:
                bar.label = (f"pruned {p.pruned}, compiled {p.compiled}, failed {p.failed}, timed {p.timed}"
                             + (f", cached {p.cached}" if p.cached else "") + f"; best {p.best_text()}")
            bar.update(n)
        report = S.run_sweep(base, space, options, arch=arch, measurer=measurer, survivors=survivors,
                             progress=S.Progress(on_change=changed))
    click.echo(S.format_report(report))
    command = _sweep_command(base_spec, shapes, causal, budget, search, seed, generations, top_k, reps)
    if json_file:
        fsutil.atomic_write_text(json_file, json.dumps({"command": command, **S.report_dict(report)}, indent=2) + "\n")
        click.echo(f"wrote {json_file}")
    if best_dir:
        for path in S.write_best(report, best_dir, command):
            click.echo(f"wrote {path}")
    counts = report.counts()
    if compile_only and not counts.get(S.COMPILED):
        sys.exit(1)
    if not compile_only and any(not report.ranking(c) for c in cases):
        sys.exit(1)


def _sweep_command(base_spec, shapes, causal, budget, search, seed, generations, top_k, reps) -> str:
    """The sweep's command line as the written specs and the JSON quote it."""
    parts = ["attngen", "sweep", str(base_spec), "--shapes", shapes or "", "--causal", causal, "--search", search,
             "--seed", str(seed)]
    if budget is not None:
        parts += ["--budget", str(budget)]
    if search == "evolve":
        parts += ["--generations", str(generations), "--top-k", str(top_k)]
    return " ".join(parts + ["--reps", str(reps)])

