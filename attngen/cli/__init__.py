"""attngen command line: a thin click layer over spec -> plan -> render -> compile -> verify/bench.

Exit codes: 0 success; 1 a check failed (stale generated/, verification failure, spills);
2 bad input (spec error, over budget, bad option); 3 a tool failed or is missing (nvcc), or a
file could not be written;
4 no CUDA GPU / torch / CUDA driver on this machine.

The group is here; each command (or pair: build and check, explain and schema) has its module, and
options.py and spec_files.py hold what they share. A command imports its heavy modules inside its
function, so `attngen --help` loads click and little else.
"""
from __future__ import annotations

import sys
from pathlib import Path

import click

from .. import __version__
from ..errors import AttngenError
from .bench import bench
from .build import build, check
from .compile import compile_cmd
from .dispatch import dispatch
from .doctor import doctor
from .explain import explain, schema
from .spec_files import error_line
from .sweep import sweep
from .verify import verify
from .warm import warm

EXIT_CODES = """\b
Exit codes:
  0  success
  1  a check failed: generated/ stale, verification failed, register spills
  2  bad input: spec error, shared memory over budget, bad option
  3  a tool failed or is missing (nvcc), or a file could not be written
  4  no CUDA GPU, torch or CUDA driver on this machine"""


def fail(exc: AttngenError) -> None:
    click.echo(error_line(exc), err=True)
    sys.exit(exc.exit_code)


class Group(click.Group):
    """The command group: an AttngenError from any command is its one line and its exit code."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except AttngenError as exc:
            fail(exc)


@click.group(cls=Group, epilog=EXIT_CODES, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="attngen")
@click.option("--root", type=click.Path(file_okay=False, exists=True), default=None,
              help="the attngen project whose specs/ and generated/ the commands use by default (default: the "
                   "nearest folder at or above the working directory whose pyproject.toml declares attngen)")
@click.pass_context
def main(ctx, root):
    """attngen: generate specialized FlashAttention-style CUDA kernels from YAML specs.

    \b
    A spec (specs/*.yaml) states tile sizes, warp roles, tensor-core fragment,
    shared-memory swizzle and pipeline depth. attngen plans every derived number
    (shared-memory layout, threads, fragments, budget), renders CUDA source into
    generated/, compiles it with nvcc and verifies it on the GPU against torch.

    \b
    Typical use:
      attngen explain specs/phase4.yaml     # the plan: layout, budget, bank conflicts
      attngen build specs/phase4.yaml       # write generated/phase4.cu
      attngen compile specs/phase4.yaml     # nvcc + ptxas register/spill report
      attngen check                         # is generated/ in sync with specs/?
      attngen verify                        # GPU: every spec against an fp32 reference

    \b
    Run from anywhere inside the project: specs/ and generated/ are the project's (the folder
    whose pyproject.toml declares attngen), not the working directory's, unless given.
    """
    ctx.obj = {"root": Path(root) if root else None}


for command in (build, check, dispatch, explain, compile_cmd, warm, bench, doctor, schema, verify, sweep):
    main.add_command(command)
