"""`attngen doctor`: what this machine has and lacks for compiling and running kernels."""
from __future__ import annotations

import json
import sys

import click


@click.command()
@click.option("--json", "as_json", is_flag=True, help="print the findings as JSON")
def doctor(as_json):
    """Check what this machine has for compiling and running kernels, before installing the gpu
    extra: nvcc and the toolkit it belongs to (a wrapper nvcc on PATH hides the headers pycuda's
    build needs), the CUDA headers, a C++ compiler, the Python headers, the CUDA driver, torch.
    Prints the install command that fits this machine. Exits 1 when something is missing (a
    machine without a GPU lacks the driver and torch: it compiles, it does not run).
    """
    from ..doctor import findings, install_hint
    found = findings()
    if as_json:
        click.echo(json.dumps({"findings": [{**f.__dict__, "label": f.label} for f in found],
                               "install": install_hint()}, indent=2))
    else:
        for f in found:
            click.echo(f"{f.label:<7} {f.what}: {f.detail}  [{f.needed_for}]")
        click.echo(f"\ninstall the gpu extra with:\n  {install_hint()}")
    if not all(f.ok or f.note for f in found):
        sys.exit(1)

