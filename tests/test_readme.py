"""Facts the README and the docs/ pages it points to state that the code could move away from: each
is computed here and compared with the text, so they cannot drift silently. And the README's shape:
short, with the card's flow (build, check, verify, diff) on its first screen."""
from __future__ import annotations

import re
from pathlib import Path

from attngen.plan import make_plan
from attngen.spec import load_spec
from spec_sample import SPEC_PATHS

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text()
DOCS = {path.name: path.read_text() for path in sorted((ROOT / "docs").glob("*.md"))}
PERFORMANCE = {f"performance/{path.name}": path.read_text()
               for path in sorted((ROOT / "docs" / "performance").glob("*.md"))}


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


def test_the_cards_flow_comes_first_then_the_quick_start():
    sections = re.findall(r"^## (.+)$", README, flags=re.M)
    assert sections[0].startswith("The card's flow") and sections[1].startswith("Quick start"), sections


def test_the_readme_is_short_with_the_cards_flow_on_its_first_screen():
    lines = README.splitlines()
    assert len(lines) <= 250, f"README.md is {len(lines)} lines: move detail into docs/"
    first_screen = "\n".join(lines[:40])
    assert "attngen build" in first_screen
    flow = README[README.index("attngen build specs/phase4.yaml"):]
    assert flow.index("attngen check") < flow.index("attngen verify") < flow.index("git diff generated/")


def test_the_readme_links_resolve():
    """Every relative link of the README, docs/*.md and docs/performance/*.md names a file that exists."""
    for name, text in [("README.md", README)] + [(f"docs/{n}", t) for n, t in {**DOCS, **PERFORMANCE}.items()]:
        base = (ROOT / name).parent
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
            assert (base / target).exists(), f"{name} links to {target}, which does not exist"


def test_commands_the_readme_and_docs_name_exist():
    """Every `attngen COMMAND` the README and docs/ name is a command of the CLI, and every command
    is named there (docs/cli.md has each one)."""
    from attngen.cli import main
    named = set(re.findall(r"`attngen ([a-z]+)\b", README + "".join(DOCS.values()) + "".join(PERFORMANCE.values())))
    assert named and named <= set(main.commands), named - set(main.commands)
    assert set(main.commands) <= named, set(main.commands) - named
    for command in main.commands:
        assert f"`{command}" in DOCS["cli.md"], f"docs/cli.md does not describe `{command}`"


def test_spec_names_follow_the_scheme():
    """<target>_<kind>_d<head_dim>[_<variant>][_bf16], as docs/specs.md's "Names" says;
    the target and head dim in the name are the spec's."""
    for path in SPEC_PATHS:
        spec = load_spec(path)
        if spec.name in ("phase4", "phase5_wmma"):
            continue
        m = re.fullmatch(r"(l4|h100|h200)_(mma|wgmma|decode|bwd|merge)_d(\d+)(_[a-z0-9]+)*?(_bf16)?", spec.name)
        assert m, spec.name
        assert (m.group(1), int(m.group(3)), bool(m.group(5))) == (spec.target, spec.head_dim, spec.dtype == "bf16")
