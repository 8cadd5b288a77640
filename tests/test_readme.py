"""Facts the README states that the code could move away from: each is computed here and compared
with the text, so the README cannot drift silently."""
from __future__ import annotations

import re
from pathlib import Path

from attngen.plan import make_plan
from attngen.spec import load_spec

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text()


def plan_of(name: str):
    return make_plan(load_spec(ROOT / "specs" / f"{name}.yaml"))


def test_params_sizes():
    forward, hopper, hopper_tma = (plan_of(n).abi.size for n in
                                   ("l4_mma_d64", "h100_wgmma_d64", "h100_wgmma_d128_n128c2ps2r24x240ppet"))
    assert plan_of("h100_wgmma_d128_n128c2ps2r24x240ppet").fragments.epilogue == "tma"
    said = re.search(r"\((\d+) bytes for a padded forward spec .*?: (\d+) bytes; (\d+) with a fourth", ARCHITECTURE,
                     flags=re.S)
    assert said, "docs/architecture.md's Kernel ABI section no longer states the Params sizes"
    assert tuple(map(int, said.groups())) == (forward, hopper, hopper_tma)


def test_the_first_example_is_the_library_call():
    first = README.index("```python")
    assert "attngen.attention(" in README[first:README.index("```", first + 9)]


def test_quick_start_comes_first():
    sections = re.findall(r"^## (.+)$", README, flags=re.M)
    assert sections[0].startswith("Quick start")


def test_commands_and_options_the_readme_names_exist():
    """Every `attngen COMMAND` the README names is a command of the CLI."""
    from attngen.cli import main
    named = set(re.findall(r"`attngen ([a-z]+)\b", README))
    assert named and named <= set(main.commands), named - set(main.commands)


def test_spec_names_follow_the_scheme():
    """<target>_<kind>_d<head_dim>[_<variant>][_bf16], as the README's "Which spec for my GPU" says;
    the target and head dim in the name are the spec's."""
    for path in sorted((ROOT / "specs").glob("*.yaml")):
        spec = load_spec(path)
        if spec.name in ("phase4", "phase5_wmma"):
            continue
        m = re.fullmatch(r"(l4|h100|h200)_(mma|wgmma|decode|bwd)_d(\d+)(_[a-z0-9]+)*?(_bf16)?", spec.name)
        assert m, spec.name
        assert (m.group(1), int(m.group(3)), bool(m.group(5))) == (spec.target, spec.head_dim, spec.dtype == "bf16")
