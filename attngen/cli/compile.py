"""`attngen compile`: nvcc and ptxas over specs, resources checked against the plan."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from .options import SPECS_DIR_HELP, archs_option, folder_option, root_option
from .spec_files import spec_files


@click.command(name="compile")
@root_option
@click.argument("specs", nargs=-1, type=click.Path(dir_okay=False))
@click.option("--arch", "archs", multiple=True, callback=archs_option,
              help="target arch, repeatable (default: the spec target's)")
@click.option("--allow-spills", is_flag=True, help="do not fail when ptxas reports register spills")
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False), help="also write <name>.<arch>.cubin here")
@click.option("--json", "as_json", is_flag=True, help="print the ptxas report as JSON")
@click.option("--specs-dir", default=None, callback=folder_option, help=SPECS_DIR_HELP)
def compile_cmd(specs, archs, allow_spills, out_dir, as_json, specs_dir):
    """Compile SPECS (default: every spec) with nvcc and report ptxas resources.

    Prints registers, spill stores/loads, stack and static shared memory per kernel function,
    and checks that ptxas's shared memory equals the planner's. A kernel whose plan uses dynamic
    shared memory (over 48 KiB, opt-in) declares none statically: ptxas reports 0 and the plan
    column says `dyn`. Exits 1 on spills (unless --allow-spills), on a shared-memory mismatch, or
    on a ptxas warning that setmaxnreg was ignored or a wgmma serialized (C7508, C7510-C7520);
    3 when nvcc is missing or fails.
    """
    from .. import fsutil
    from ..compile import compile_source
    from ..render import render_spec_file
    report, bad = [], 0
    for path in spec_files(specs, specs_dir):
        r = render_spec_file(path)
        for asked in archs or (r.plan.target.arch,):
            try:
                arch = r.plan.compile_arch(asked)   # sm_90 -> sm_90a for a kind that needs it
            except ValueError as e:
                raise click.UsageError(f"{path}: {e}")
            for part, (name, source) in zip(r.plan.parts, r.files):
                res = compile_source(source, arch, on_compile=lambda a, n=name: click.echo(
                    f"compiling {n} for {a} ...", err=True))
                want_static = (part.static_smem if part.static_smem is not None else
                               0 if r.plan.smem_dynamic else r.plan.smem_bytes)
                for warning in res.wgmma_warnings:
                    click.echo(f"{name} ({arch}): {warning}", err=True)
                    bad += 1
                for f in res.functions:
                    ok_smem = f.smem_bytes == want_static
                    spill = f.spills and not allow_spills
                    bad += spill or not ok_smem
                    report.append({"spec": str(path), "arch": arch, **f.as_dict(),
                                   "plan_smem_bytes": r.plan.smem_bytes if part.static_smem is None else want_static,
                                   "plan_smem_dynamic": r.plan.smem_dynamic and part.static_smem is None,
                                   "smem_matches_plan": ok_smem})
                if out_dir:
                    fsutil.ensure_dir(out_dir)
                    fsutil.atomic_write_bytes(Path(out_dir) / f"{Path(name).stem}.{arch}.cubin", res.cubin)
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(format_compile(report))
    if bad:
        sys.exit(1)


def format_compile(report: list[dict]) -> str:
    """The compile table; columns widen to the longest function name and arch."""
    nw = max([len("function")] + [len(e["name"]) for e in report])
    aw = max([len("arch")] + [len(e["arch"]) for e in report])
    lines = [f"{'function':<{nw}}  {'arch':<{aw}} {'regs':>4} {'spill st/ld':>11} {'stack':>5} "
             f"{'smem':>7} {'plan':>7}"]
    for e in report:
        plan = f"{e['plan_smem_bytes']:>7}" + (" dyn" if e.get("plan_smem_dynamic") else "")
        note = "" if e["smem_matches_plan"] else "  <- ptxas smem differs from the plan"
        if e["spill_stores"] or e["spill_loads"]:
            note += "  <- spills"
        lines.append(f"{e['name']:<{nw}}  {e['arch']:<{aw}} {e['registers']:>4} "
                     f"{e['spill_stores']:>5}/{e['spill_loads']:<5} {e['stack_bytes']:>5} {e['smem_bytes']:>7} "
                     f"{plan}{note}".rstrip())
    if any(e.get("plan_smem_dynamic") for e in report):
        lines.append("smem: static shared memory per ptxas. dyn: the plan's shared memory is dynamic (sized at "
                     "launch), so ptxas reports 0 static bytes for it")
    return "\n".join(lines)

