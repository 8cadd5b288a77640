"""A process's first call does little host work in attngen: the steps before the GPU (the dispatch
table, the pick, the spec's launch record, the committed source, the compile and launch modules)
import no renderer, no spec parser, no planner and no kind, and finish well within a loose time
bound.

Each check runs in a fresh interpreter: what one process has imported says nothing about the next."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from attngen.kinds import REGISTERED, all_kinds, kind_for_data

ROOT = Path(__file__).resolve().parent.parent

# The host path of attngen.attention's first call, as ops.dispatch and runtime.calls.load_served take
# it, up to the cubin cache and the GPU (neither is here): it prints the seconds it took, the modules
# it left loaded and the type of the plan the kernel would hold.
HOST_PATH = """
import json, sys, time
start = time.perf_counter()
import attngen
from attngen.ops.dispatch import DISPATCH
from attngen.ops.table import select
entry = select(DISPATCH.entries, *{call!r}, paged=False)
from attngen.runtime.kernel import launch_bundle
plan, sources, label = launch_bundle(str(DISPATCH.specs_dir / f"{{entry.spec}}.yaml"))
from attngen.runtime.calls import kernel_class
kernel_class(plan)
import attngen.compile, attngen.cubin
seconds = time.perf_counter() - start
print(json.dumps({{"seconds": seconds, "modules": sorted(sys.modules), "spec": entry.spec,
                  "plan": type(plan).__name__}}))
"""

# (call, arch, dtype, head_dim, mask, seqlen) of first calls served by different kinds.
CALLS = {
    "hopper_forward": ("forward", "sm_90", "fp16", 128, "causal", 4096),
    "ada_forward": ("forward", "sm_89", "fp16", 64, "causal", 1024),
    "decode": ("decode", "sm_90", "bf16", 128, "none", 4096),
    "backward": ("backward", "sm_89", "fp16", 64, "causal", 1024),
    "varlen": ("varlen", "sm_90", "bf16", 128, "causal", 4096),
}

# What the first call never imports: the renderer, and, with the spec's launch record, the spec
# parser and the planner (pydantic alone took 40-60 ms of a first call on the H200 host).
NEVER_LOADED = {"jinja2", "attngen.render", "attngen.explain", "pydantic", "yaml", "attngen.spec", "attngen.plan",
                "attngen.core.spec_keys", "attngen.core.specio", "attngen.core.spec_cells", "attngen.core.expressions",
                "attngen.core.expression_variant", "attngen.core.forward_plan", "attngen.core.layout"}

# attngen modules the host path may load: 34 or 35 with launch records when this was written (43 for a
# Hopper forward that planned its spec, 58 while every kind was imported with the registry).
MODULE_LIMIT = 38
SECONDS_LIMIT = 2.0          # about 0.1 s on a loaded 2-core machine; the bound only catches gross regressions


def first_call(call: tuple) -> dict:
    out = subprocess.run([sys.executable, "-c", HOST_PATH.format(call=call)], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def warm_table():
    """The dispatch table's memo in the user cache, as after any earlier process: a cold cache parses
    the table's YAML once (the wheel's prepared table spares an installed attngen even that)."""
    subprocess.run([sys.executable, "-c", "from attngen.ops.dispatch import DISPATCH; DISPATCH.entries"], cwd=ROOT,
                   check=True)


@pytest.fixture(scope="module", params=sorted(CALLS))
def host_path(request, warm_table) -> dict:
    return first_call(CALLS[request.param])


def loaded_kinds(modules) -> set[str]:
    return {m.split(".")[2] for m in modules if m.startswith("attngen.kinds.")}


def test_the_first_call_reads_a_launch_record(host_path):
    assert host_path["plan"] == "LaunchPlan", f"{host_path['spec']}: no current launch record (run `attngen build`)"


def test_the_first_call_loads_no_kind(host_path):
    assert loaded_kinds(host_path["modules"]) == set()


def test_the_first_call_loads_no_renderer_parser_or_planner(host_path):
    loaded = NEVER_LOADED & set(host_path["modules"])
    assert not loaded, f"{host_path['spec']} loads {sorted(loaded)}"


def test_the_first_call_loads_few_attngen_modules(host_path):
    ours = [m for m in host_path["modules"] if m == "attngen" or m.startswith("attngen.")]
    assert len(ours) < MODULE_LIMIT, ours


def test_the_first_call_host_path_is_quick(host_path):
    assert host_path["seconds"] < SECONDS_LIMIT


# -- the registry loads a kind when a spec selects it --------------------------------------------

def test_the_registry_imports_no_kind():
    code = "import attngen.kinds, sys; print(' '.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert loaded_kinds(out.stdout.split()) == set()


def test_every_registered_kind_declares_its_registered_selector():
    assert [(k.name, k.selector) for k in all_kinds()] == list(REGISTERED)


def test_the_registry_lists_every_kind_package():
    packages = {p.name for p in (ROOT / "attngen" / "kinds").iterdir() if (p / "__init__.py").is_file()}
    assert {name for name, _ in REGISTERED} == packages


@pytest.mark.parametrize("name,selector", REGISTERED, ids=[name for name, _ in REGISTERED])
def test_a_selector_picks_its_kind(name, selector):
    key, value = selector
    assert kind_for_data({key: value}).name == name
