"""`attngen bench`: specs timed beside torch SDPA's backends, each call convention by its own runner."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from .options import (MAX_BATCH, MAX_HEADS, MAX_REPS, MAX_SEQLEN, SPECS_DIR_HELP, folder_option, report_file,
                      root_option, shape_too_large, shapes_option)
from .spec_files import same_file_key, spec_files
from ..core.launch_rules import MAX_PAGE_SIZE


def _parsed(parse, text):
    """parse(text), its ValueError an option's BadParameter (the parser's message is the option's)."""
    try:
        return parse(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _cell_list(parse, value: str, example: str) -> tuple:
    """A comma-separated option of cells, each parse()d; at least one."""
    cells = _parsed(lambda text: tuple(parse(c) for c in text.split(",") if c.strip()), value)
    if not cells:
        raise click.BadParameter(f"name at least one cell {example}")
    return cells


def _plot_file(ctx, param, value):
    """--plot of bench: a file whose suffix names an image format matplotlib writes."""
    if value is None:
        return None
    from ..eval.bench.chart import plot_format
    _parsed(plot_format, value)
    return report_file(ctx, param, value)


def _train_cells(ctx, param, value):
    """--train-cells of bench: comma-separated BxHq/HkvxSxD."""
    if value is None:
        return None
    from ..eval.bench.train import parse_train_cell
    cells = _cell_list(parse_train_cell, value, "BxHq/HkvxSxD (e.g. 4x32/8x2048x128)")
    for c in cells:
        too_large = shape_too_large((c.batch, c.heads, c.seqlen, c.head_dim))
        if too_large:
            raise click.BadParameter(f"{c.label}: {too_large}")
    return cells


def _gpt_model(ctx, param, value):
    """--gpt-model of bench --gpt-step: LAYERSxD_MODELxHEADSxTOKENSxBATCH."""
    if value is None:
        return None
    from ..eval.bench.gpt_step import parse_gpt_shape
    shape = _parsed(parse_gpt_shape, value)
    too_large = shape_too_large((shape.batch, shape.heads, shape.seqlen, shape.d_model // shape.heads))
    if too_large:
        raise click.BadParameter(f"{value.strip()}: {too_large}")
    return shape


def _cells(ctx, param, value):
    """--cells of bench: comma-separated decode cells."""
    if value is None:
        return None
    from ..eval.bench.decode import parse_cell
    return _cell_list(parse_cell, value, "BxHq/HkvxSkxSq (e.g. 8x32/8x8192x1)")


def _lengths(ctx, param, value):
    """--lengths of bench --varlen: comma-separated sequence lengths."""
    if value is None:
        return None
    from ..eval.bench.varlen import parse_lengths
    lengths = _parsed(parse_lengths, value)
    if len(lengths) > MAX_BATCH:
        raise click.BadParameter(f"{len(lengths)} sequences; a varlen batch holds at most {MAX_BATCH}")
    if sum(lengths) > MAX_SEQLEN:
        raise click.BadParameter(f"{sum(lengths)} tokens in all; a varlen batch holds at most {MAX_SEQLEN}")
    return lengths


def _context(ctx, param, value):
    """--context of bench --serving: LO:HI keys a sequence."""
    if value is None:
        return None
    from ..eval.bench.serving import parse_context
    return _parsed(parse_context, value)


def _heads(ctx, param, value):
    """--heads of bench --varlen: H or Hq/Hkv."""
    from ..eval.bench.varlen import parse_heads
    heads = _parsed(parse_heads, value)
    if heads[0] > MAX_HEADS:
        raise click.BadParameter(f"{value!r}: at most {MAX_HEADS} query heads (got {heads[0]})")
    return heads


def _backends(ctx, param, value):
    """--backends of bench: comma-separated names of torch SDPA backends."""
    from ..eval.bench.shared import SDPA_BACKENDS
    names = tuple(b.strip() for b in value.split(",") if b.strip())
    if not names:
        raise click.BadParameter(f"name at least one of {', '.join(SDPA_BACKENDS)}")
    for b in names:
        if b not in SDPA_BACKENDS:
            raise click.BadParameter(f"unknown backend {b!r}; choose from {', '.join(SDPA_BACKENDS)}")
    return names


@click.command()
@root_option
@click.argument("specs", nargs=-1, type=click.Path(dir_okay=False))
@click.option("--shapes", default=None, metavar="BxHxSxD,...", callback=shapes_option,
              help="comma-separated shapes; BxHxSxDxDv where V's head dim Dv differs (default: 1x8x512x64, 4x16x2048x64, 4x16x2048x128, 2x16x8192x64, "
                   "2x16x8192x128; backward specs: 4x16x2048 and 1x16x8192 at the spec's head dim). D (and Dv) "
                   f"must be a given spec's; B at most {MAX_BATCH}, H {MAX_HEADS}, S {MAX_SEQLEN}")
@click.option("--dtype", "dtypes", multiple=True, type=click.Choice(["fp16", "bf16"]),
              help="repeatable; default both")
@click.option("--causal", "causal", type=click.Choice(["both", "yes", "no"]), default="both", show_default=True)
@click.option("--backends", default="flash,cudnn,efficient,default", show_default=True, callback=_backends,
              help="torch SDPA backends to time beside the specs")
@click.option("--reps", type=click.IntRange(1, MAX_REPS), default=30, show_default=True,
              help="timed calls per measurement (median reported)")
@click.option("--json", "json_file", type=click.Path(dir_okay=False), callback=report_file,
              help="write the full report here (specs of several call conventions, e.g. forward and decode: one "
                   "report each, FILE-<convention>.json; --train rewrites it after each timing, marked \"partial\" "
                   "until the grid is done, so a stopped run keeps what it measured)")
@click.option("--plot", "plot_file", type=click.Path(dir_okay=False), callback=_plot_file,
              help="draw TFLOP/s per shape to this PNG (or .svg, .pdf); needs matplotlib")
@click.option("--cells", default=None, metavar="BxHq/HkvxSkxSq,...", callback=_cells,
              help="decode specs: cells to time (default: B 1, 8, 64 x Hq/Hkv 32/8, 32/32, 64/8 x Sk 2k, 8k, 32k "
                   "(128k at B 1) x Sq 1, 4)")
@click.option("--paged", is_flag=True, help="decode specs: read the cache through a shuffled page table")
@click.option("--varlen", is_flag=True,
              help="forward specs with varlen: true: time one varlen batch of mixed lengths (kernel.varlen) "
                   "beside torch's varlen flash path instead of the padded shapes")
@click.option("--lengths", default=None, metavar="L1,L2,...", callback=_lengths,
              help="--varlen: sequence lengths of the batch (default: 16 from 1 to 4096: "
                   f"1,17,64,100,256,333,512,700,1000,1024,1500,2048,2500,3000,3500,4096); at most {MAX_BATCH} "
                   f"sequences and {MAX_SEQLEN} tokens in all")
@click.option("--heads", default="16", show_default=True, metavar="H|Hq/Hkv", callback=_heads,
              help=f"--varlen: query heads, or query/key-value heads (at most {MAX_HEADS} query heads)")
@click.option("--train", is_flag=True,
              help="time training steps (forward + backward through attngen.attention, the dispatch table's "
                   "specs) beside SDPA's cuDNN and flash backends over a grid of cells, instead of SPECS")
@click.option("--train-cells", default=None, metavar="BxHq/HkvxSxD,...", callback=_train_cells,
              help="--train: the cells (default: d64, d128, d256 x 512 to 16k keys, 16k tokens x GQA 1, 4, 8 at "
                   "16 query heads)")
@click.option("--rounds", type=click.IntRange(1, 1000), default=3, show_default=True,
              help="--train, --gpt-step: rounds the implementations alternate over (each figure is their median; "
                   "--gpt-step: many short rounds, e.g. --rounds 300 --reps 3, bound the paired median tightly)")
@click.option("--gpt-step", is_flag=True,
              help="time a small GPT's whole training step (forward, loss, backward, AdamW) with attngen.attention "
                   "and with SDPA, eager and under torch.compile; with --train, after the grid")
@click.option("--gpt-model", default=None, metavar="LxDxHxSxB", callback=_gpt_model,
              help="--gpt-step: layers x d_model x heads x tokens x batch  [default: 4x512x8x1024x8]")
@click.option("--serving", is_flag=True,
              help="time one serving step (a paged varlen call of prefill chunks and decode tokens through "
                   "attngen.attention_varlen) beside SDPA per sequence, GPU, eager and in a CUDA graph, instead of "
                   "SPECS")
@click.option("--sequences", type=click.IntRange(1, 4096), default=None,
              help="--serving: sequences in the step  [default: 64]")
@click.option("--prefill", type=click.IntRange(0, 4096), default=None,
              help="--serving: sequences prefilling a chunk; the rest decode one token  [default: 8]")
@click.option("--chunk", type=click.IntRange(1, MAX_SEQLEN), default=None,
              help="--serving: new tokens of a prefilling sequence  [default: 512]")
@click.option("--context", default=None, metavar="LO:HI", callback=_context,
              help="--serving: each sequence's keys after the step, drawn from LO to HI  [default: 512:8192]")
@click.option("--page-size", type=click.IntRange(1, MAX_PAGE_SIZE), default=None,
              help="--serving: keys per page of the pool, a power of two  [default: 16]")
@click.option("--head-dim", type=click.IntRange(1, 1024), default=None,
              help="--serving: head dim  [default: 128]")
@click.option("--specs-dir", default=None, callback=folder_option, help=SPECS_DIR_HELP)
def bench(specs, shapes, dtypes, causal, backends, reps, json_file, plot_file, cells, paged, varlen, lengths, heads,
          train, train_cells, rounds, gpt_step, gpt_model, serving, sequences, prefill, chunk, context, page_size,
          head_dim, specs_dir):
    """Time SPECS (default: every spec) beside torch SDPA's backends on the GPU.

    \b
    Each spec runs only on the shapes, dtypes and mask variants it supports, and only after
    its output on those very inputs passed the verifier's error rule. GPU times are medians of
    CUDA-event-timed calls queued behind a GPU sleep (the host hidden) over inputs rotated to
    defeat L2; b2b times are the GPU's with the same calls back to back between two events, as a
    model's or a decode loop's calls run (a kernel launched as a programmatic dependent starts
    before the call ahead ends, which an event between two calls forbids); eager times are
    back-to-back calls as a user makes them, host included (wall clock / calls), for the specs
    and SDPA alike. TFLOP/s counts 4*B*H*S*S*D (halved for causal). Ratios are SDPA GPU time /
    spec GPU time (per call): above 1.0 the spec is faster.

    \b
    Decode specs (decode: split_kv) are timed on decode cells instead (--cells): one step of
    Sq new tokens against a full cache of Sk keys, beside SDPA's flash and cuDNN backends (Sq > 1:
    causal for the spec, SDPA unmasked), with GB/s of K+V read and its percentage of the
    device-to-device copy bandwidth measured in the same run. `attngen verify` checks them.

    \b
    Backward specs (backward: dq_atomic or wgmma_dq_red) are timed on --shapes (default 4x16x2048 and
    1x16x8192 at each spec's head dim), in their own dtype: the call kernel(q, k, v, o, lse,
    dout) given attngen's forward o and lse, after checking dq, dk and dv against fp32
    gradients, beside SDPA's flash and cuDNN backward (torch.autograd.grad of its output).
    TFLOP/s counts 2.5 x the forward's FLOPs (--plot draws them). Not with --varlen, window or
    score modifiers.

    \b
    --varlen times ragged prefill: the specs' varlen call on one batch of mixed
    lengths (--lengths, --heads; causal is bottom-right, the same as top-left when each
    sequence has as many queries as keys) beside torch's varlen flash path, after checking
    the output with the verifier's error rule.

    \b
    --train times what a model's training step runs: forward + backward through
    attngen.attention (the dispatch table's specs; no SPECS) beside SDPA's cuDNN and flash
    backends, GQA through each one's own path, over a grid (--train-cells; default d64, d128,
    d256 x 512-16k keys x GQA 1, 4, 8, bf16 unless --dtype), each cell checked against fp32
    first, the implementations alternating over --rounds rounds.

    \b
    --gpt-step times a small GPT's training step as a training loop feels it (host and GPU,
    --reps steps back to back) and its GPU time (each step of the first 5 rounds queued alone
    behind a GPU sleep):
    forward under autocast (one --dtype, default bf16), loss,
    backward and AdamW, with attngen.attention and with SDPA's own choice of backend, eager and
    torch.compile'd, from one initialization, the four alternating over --rounds rounds (the two
    of a mode back to back, each first in turn; "paired" is the median and range of each round's
    SDPA / attngen, and from 6 rounds a 95 % interval for that median: order statistics, which
    assume nothing of the noise's shape; the order within a round matters, so an even --rounds
    balances it); the first step's loss and qkv gradient are checked against SDPA's first.
    --gpt-model shapes it (default 4 layers, d_model 512, 8 heads of 64, 1024 tokens, batch 8).

    \b
    --serving times one serving step as an inference engine runs it: --sequences sequences
    (default 64) whose keys sit in a pool of --page-size pages, --prefill of them (default 8)
    prefilling a --chunk of new tokens and the rest decoding one, all in one paged call of
    attngen.attention_varlen (block_table=, seqused_k=), beside SDPA run per sequence on
    contiguous copies of each sequence's keys (the copies made beforehand, untimed). The output
    is checked against fp32 first; times are GPU, eager and the step replayed from a CUDA graph.
    --heads (default 32/8 here), --head-dim, --context and one --dtype (default bf16) shape it.
    """
    serving_options = {"sequences": sequences, "prefill": prefill, "chunk": chunk, "context": context,
                       "page_size": page_size, "head_dim": head_dim}
    if serving or any(v is not None for v in serving_options.values()):
        _serving_bench(specs, serving, serving_options, heads, dtypes, reps, json_file)
        return
    if gpt_model is not None and not gpt_step:
        raise click.UsageError("--gpt-model goes with --gpt-step")
    if train or train_cells or gpt_step:
        _train_bench(specs, train, train_cells, dtypes, causal, reps, rounds, json_file,
                     gpt_model if gpt_step else None, gpt_step)
        return
    from .. import fsutil
    from ..eval.bench.shared import CAUSAL_CHOICES
    from ..eval.conventions import EVALS, BenchOptions, by_convention, option_problems
    from ..render import render_spec_file
    all_paths = spec_files(specs, specs_dir)
    rendered = [render_spec_file(p) for p in all_paths]
    opts = BenchOptions(shapes=shapes, dtypes=dtypes or ("fp16", "bf16"), causals=CAUSAL_CHOICES[causal],
                        backends=backends, reps=reps, cells=cells, paged=paged, varlen=varlen, lengths=lengths,
                        heads=heads, plot_file=plot_file)
    all_paths, rendered = _unnamed_cells_benched(specs, all_paths, rendered, opts)
    groups = by_convention(all_paths, [r.plan for r in rendered])

    ctx = click.get_current_context()
    given = {name for name in ("shapes", "cells", "paged", "varlen", "lengths", "heads", "plot_file")
             if ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE}   # BenchOptions fields

    problems = option_problems(groups, opts, given)
    if "shapes" in given and not varlen:
        problems += _shapes_no_spec_runs(groups, shapes)
    if problems:   # before any GPU check: a wrong option is the user's to fix, whatever the machine
        raise click.UsageError("; ".join(problems))

    def progress(label, length):
        return click.progressbar(length=length, label=label, file=sys.stderr, show_pos=True)

    if plot_file:   # no matplotlib: say so (exit 3) before compiling for a run that cannot plot
        from ..eval.bench.chart import pyplot
        pyplot()
    _precompile_on_gpu([(r.plan, tuple(p.source for p in r.parts), r.spec_path) for r in rendered])
    for convention, (paths, plans) in groups.items():
        try:
            run = EVALS[convention].bench(paths, plans, opts, progress,
                                          lambda a: click.echo(f"compiling for {a} ...", err=True))
        except ValueError as e:
            raise click.UsageError(str(e))
        if run is None:   # nothing of this convention runs under these options (e.g. decode specs with --varlen)
            continue
        click.echo(run.text)
        for f in run.written:
            click.echo(f"wrote {f}")
        if json_file:   # one report per convention when the specs span several: FILE-<convention>.json
            out = json_file if len(groups) == 1 else str(Path(json_file).with_name(
                f"{Path(json_file).stem}-{convention}{Path(json_file).suffix}"))
            fsutil.atomic_write_text(out, json.dumps(run.report, indent=2) + "\n")
            click.echo(f"wrote {out}")


def _train_command(train, train_cells, dtypes, causal, reps, rounds, gpt_model, gpt_step) -> str:
    """The command line that makes a --train / --gpt-step report again (the report's "command")."""
    words = ["attngen bench"] + (["--train"] if train else []) + (["--gpt-step"] if gpt_step else [])
    if train_cells:
        words.append("--train-cells " + ",".join(c.label for c in train_cells))
    if gpt_model:
        words.append("--gpt-model " + "x".join(map(str, gpt_model)))
    words += [f"--dtype {d}" for d in dtypes or ()]
    return " ".join(words + [f"--causal {causal}", f"--rounds {rounds}", f"--reps {reps}"])


def _train_bench(specs, train, train_cells, dtypes, causal, reps, rounds, json_file, gpt_model, gpt_step):
    """`bench --train` and `--gpt-step`: the training-step grid (eval/bench/train.py) and the small GPT's
    step (eval/bench/gpt_step.py), their tables and one --json report (the grid's, the GPT step's under
    "gpt_step"; the GPT step's alone without --train). Exit 1 when the GPT step's check fails."""
    from .. import fsutil
    from ..eval.bench.shared import CAUSAL_CHOICES
    from ..eval.bench.train import format_train, grid_cells, run_train_bench
    if train_cells and not train:
        raise click.UsageError("--train-cells goes with --train")
    if specs:
        what = "--train" if train else "--gpt-step"
        raise click.UsageError(f"{what} times attngen.attention through the dispatch table: name no SPECS "
                               "(bench SPEC times one spec's own call)")
    if gpt_step and len(dtypes) > 1:
        raise click.UsageError("--gpt-step times one dtype: give --dtype once")
    from ..runtime import gpu_modules
    gpu_modules()   # no GPU, torch or CUDA driver: say so (exit 4) before any progress is drawn
    command = _train_command(train, train_cells, dtypes, causal, reps, rounds, gpt_model, gpt_step)
    report = None
    if train:
        cells = train_cells or grid_cells()
        causals = CAUSAL_CHOICES[causal]
        dtypes = dtypes or ("bf16",)
        with click.progressbar(length=len(cells) * len(causals) * len(dtypes), label="bench train",
                               file=sys.stderr, show_pos=True) as bar:
            def step(row):
                bar.label = f"{row['cell']} {'causal' if row['causal'] else 'full'}"
                bar.update(1)
            def partial(so_far):   # rewritten after each timing: a run stopped part-way keeps its rows
                fsutil.atomic_write_text(json_file, json.dumps({"command": command, **so_far}, indent=2) + "\n")
            report = run_train_bench(cells, dtypes=dtypes, causals=causals, reps=reps, rounds=rounds,
                                     on_step=step, on_partial=partial if json_file else None)
        click.echo(format_train(report))
    gpt = None
    if gpt_step:
        from ..eval.bench.gpt_step import DEFAULT_GPT, format_gpt_step, run_gpt_step
        gpt = run_gpt_step(gpt_model or DEFAULT_GPT, dtype=(dtypes or ("bf16",))[0], steps=reps, rounds=rounds,
                           on_variant=lambda name: click.echo(f"bench gpt-step: {name} ...", err=True))
        click.echo(format_gpt_step(gpt))
        if report is None:
            report = gpt
        else:
            report["gpt_step"] = gpt
    if json_file:
        fsutil.atomic_write_text(json_file, json.dumps({"command": command, **report}, indent=2) + "\n")
        click.echo(f"wrote {json_file}")
    if gpt is not None and gpt["status"] != "ok":
        sys.exit(1)


def _serving_bench(specs, serving, options, heads, dtypes, reps, json_file):
    """`bench --serving`: one serving step (eval/bench/serving.py), its table and --json report."""
    from .. import fsutil
    from ..eval.bench.serving import ServingStep, format_serving, run_serving_bench, step_problems
    given = [f"--{k.replace('_', '-')}" for k, v in options.items() if v is not None]
    if not serving:
        raise click.UsageError(f"{', '.join(given)} {'goes' if len(given) == 1 else 'go'} with --serving")
    if specs:
        raise click.UsageError("--serving times attngen.attention_varlen through the dispatch table: name no SPECS")
    if len(set(dtypes)) > 1:
        raise click.UsageError("--serving times one dtype: give --dtype once")
    ctx = click.get_current_context()
    if ctx.get_parameter_source("heads") is not click.core.ParameterSource.COMMANDLINE:
        heads = (32, 8)
    step = ServingStep(**{k: v for k, v in options.items() if v is not None}, heads=heads[0], kv_heads=heads[1],
                       dtype=dtypes[0] if dtypes else "bf16")
    problems = step_problems(step, MAX_PAGE_SIZE, MAX_SEQLEN)
    if problems:
        raise click.UsageError("; ".join(problems))
    from ..runtime import gpu_modules
    gpu_modules()   # no GPU, torch or CUDA driver: say so (exit 4) before anything runs
    click.echo(f"bench serving: {step.label} ...", err=True)
    try:
        report = run_serving_bench(step, reps)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    click.echo(format_serving(report))
    if json_file:
        fsutil.atomic_write_text(json_file, json.dumps(report, indent=2) + "\n")
        click.echo(f"wrote {json_file}")


def _unnamed_cells_benched(named, paths, rendered, opts):
    """The cells to time: a file of a family (or no path: every spec) stands for cells that `bench`
    cannot time under these options (a window or softcap cell, whose calls take variant arguments;
    one without a varlen call under --varlen); those it leaves out, saying which on stderr. A cell
    named by its own path is kept, so its problem is reported; so is every cell when none is left."""
    from ..core.spec_cells import spec_paths
    from ..eval.conventions import by_convention, option_problems
    asked = set()                       # the cells named one by one (a family file names several)
    for n in named:
        cells = spec_paths((n,))
        if len(cells) == 1:
            asked.add(same_file_key(cells[0]))
    keep, left = [], []
    for path, r in zip(paths, rendered):
        alone = by_convention([path], [r.plan])
        problems = [] if same_file_key(path) in asked else option_problems(alone, opts, set())
        (left if problems else keep).append((path, r, problems))
    if not left or not keep:
        return paths, rendered
    click.echo(f"bench: leaving out {len(left)} cell(s) it cannot time here: "
               f"{', '.join(r.plan.spec.name for _, r, _ in left)} ({left[0][2][0]})", err=True)
    return [p for p, _, _ in keep], [r for _, r, _ in keep]


def _precompile_on_gpu(bundles) -> None:
    """Compile every (plan, sources, label) a GPU run will load, all at once, before its first load
    (which then finds each cubin cached). Without a GPU, nothing: the run's own check says so (exit 4)."""
    from ..compile import precompile, print_summary
    from ..errors import NoGpuError
    from ..runtime import device_arch, gpu_modules
    try:
        torch = gpu_modules()[0]
    except NoGpuError:
        return
    print_summary(precompile(bundles, device_arch(torch, torch.cuda.current_device())))


def _shapes_no_spec_runs(groups: dict, shapes: tuple) -> list[str]:
    """The --shapes whose head dims (D, and Dv where given) no given spec of a shape-taking convention
    has: each spec runs only on its own head dims, so such a shape would time nothing of attngen's."""
    from ..eval.conventions import EVALS
    plans = [p for convention, (_paths, ps) in groups.items() if "shapes" in EVALS[convention].options for p in ps]
    if not plans:   # no spec takes --shapes: option_problems says so
        return []
    dims = {(p.spec.head_dim, p.spec.v_dim) for p in plans}
    unrun = [s for s in shapes if (s[3], s[4] if len(s) == 5 else s[3]) not in dims]
    if not unrun:
        return []
    theirs = ", ".join(f"{d}" if d == dv else f"{d}x{dv}" for d, dv in sorted(dims))
    listed = ", ".join("x".join(map(str, s)) for s in unrun)
    return [f"--shapes {listed}: no given spec has {'that head dim' if len(unrun) == 1 else 'those head dims'} "
            f"(the specs' D or DxDv: {theirs})"]

