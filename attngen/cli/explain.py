"""`attngen explain` prints a spec's plan; `attngen schema` the JSON schema of a spec."""
from __future__ import annotations

import json

import click


def _known_arch(ctx, param, value):
    """--arch of explain: the arch of one of the targets (sm_90a for sm_90 too)."""
    if value is None:
        return None
    from ..targets import TARGETS
    known = sorted({t.arch for t in TARGETS.values()}, key=lambda a: int(a[3:]))
    base = value[:-1] if value.endswith("a") else value
    if base not in known or (base != value and int(base[3:]) < 90):
        raise click.BadParameter(f"{value!r} is not the arch of any target; known: {', '.join(known)}, sm_90a")
    return value


@click.command()
@click.argument("spec", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="print the plan as JSON")
@click.option("--arch", default=None, callback=_known_arch,
              help="also compile for the spec target's arch (e.g. sm_89 for l4) to add the register limit")
def explain(spec, as_json, arch):
    """Print the plan of SPEC: shared-memory layout, budget, threads, fragments, bank conflicts.

    Nothing is compiled unless --arch is given; with --arch, ptxas registers refine the
    resident-blocks estimate. The estimate is for the spec's target, so --arch must be that
    target's arch: registers of another arch say nothing about it (`attngen compile --arch`
    reports them).
    """
    from ..explain import explain as describe, plan_dict
    from ..render import render_spec_file
    r = render_spec_file(spec)
    regs = None
    if arch:
        target = r.plan.target
        if arch.rstrip("a") != target.arch:
            # Point at `compile --arch` only where that compile can run: a kernel with arch-specific
            # instructions (wgmma: sm_90a) compiles for its own arch alone.
            other = (f" (or `attngen compile --arch {arch}` for the registers on {arch})" if not r.plan.arch_suffix
                     else f"; its {target.arch}{r.plan.arch_suffix} instructions do not exist on {arch}")
            raise click.BadParameter(
                f"{arch} is not the arch of the spec's target {target.name} ({target.arch}); the resident-blocks "
                f"estimate is for {target.name}, so use --arch {target.arch}{other}", param_hint="'--arch'")
        from ..compile import compile_source
        from ..errors import ToolError
        functions = [f for _name, source in r.files for f in compile_source(source, r.plan.compile_arch(arch)).functions]
        if not functions:
            raise ToolError(f"ptxas reported no kernel function for {spec} on {arch}; "
                            f"see `attngen compile {spec} --arch {arch}`")
        regs = max(f.registers for f in functions)
    if as_json:
        d = plan_dict(r.plan)
        if regs:
            d["registers"] = regs
            d["registers_arch"] = arch
            d["blocks_per_sm_by_registers"] = r.plan.occupancy.by_registers(regs)
        click.echo(json.dumps(d, indent=2))
    else:
        click.echo(describe(r.plan, regs))


@click.command()
def schema():
    """Print the JSON schema of a spec file (every key, type, range and description)."""
    from ..spec import json_schema
    click.echo(json.dumps(json_schema(), indent=2))

