"""Hostile specs against the rules (#63): each is a committed spec with one key changed that the
planner used to accept although the kernel spills, fails in ptxas or can never launch. Each must be
refused at plan time in one line naming the file, the YAML line, the key and the fix; and a value a
refusal suggests must compile without spills, for every kind that takes min_blocks_per_sm."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from spec_sample import sampled, spec_text

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "specs"
DELETE = object()
# file:line: key: message; the fix follows the message (after "; " or ": use ...")
REFUSAL = re.compile(r"^(?P<file>\S+\.yaml):(?P<line>\d+): (?P<key>[A-Za-z_][\w.]*): (?P<message>.+)$")


def hostile(tmp_path: Path, base: str, name: str, **changes) -> Path:
    """A committed spec with changes (a dotted key reaches into a mapping; DELETE removes a key),
    written to tmp_path as block-style YAML so that every key has its own line."""
    data = yaml.safe_load(spec_text(SPECS / base))
    data["name"] = name
    for dotted, value in changes.items():
        *path, last = dotted.split("__")
        node = data
        for part in path:
            node = node.setdefault(part, {})
        if value is DELETE:
            node.pop(last, None)
        else:
            node[last] = value
    out = tmp_path / f"{name}.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def attngen(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attngen", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)


def refusal(path: Path, key: str) -> str:
    """The one-line SpecError `attngen explain` gives for path, checked: exit 2, no traceback, the
    file, the line of `key` in it, the key; returns the message."""
    result = attngen("explain", str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    m = REFUSAL.match(lines[0])
    assert m, lines[0]
    assert (Path(m["file"]).name, m["key"]) == (path.name, key), lines[0]
    name = key.split(".")[-1]
    text = path.read_text()
    if re.search(rf"^\s*{name}:", text, re.M):      # a key the spec lacks is reported at the top
        assert re.match(rf"\s*{name}:", text.splitlines()[int(m["line"]) - 1]), lines[0]
    return m["message"]


# -- the wrong acceptances, refused ------------------------------------------------------------------

# (base spec, changes, key, what the message must say: the fix). Measured before (ptxas, nvcc 13.0):
WRONG_ACCEPTANCES = {
    # 3 consumer warpgroups, ping-pong, registers 32/160 at d128: 336 B spilled, wgmma serialized
    "c3_pingpong_registers": ("lab/h100_wgmma_d128_pp.yaml", dict(
        tile__block_m=192, warps__consumer=12, smem__stages=2, registers={"producer": 32, "consumer": 160}),
        "registers.consumer", "use tile.block_n <= 64"),
    # head_dim_v 256 with registers 24/240: 144 B spilled
    "wgmma_head_dim_v_256": ("h100_wgmma_d192_v128.yaml", dict(head_dim=128, head_dim_v=256),
                             "registers.consumer", "use tile.block_n <= 96"),
    # min_blocks_per_sm 2 on 256 threads caps at 128 registers: 368 B spilled
    "mma_min_blocks": ("h100_mma_d128.yaml", dict(min_blocks_per_sm=2), "min_blocks_per_sm",
                       "leave min_blocks_per_sm unset"),
    # 3 blocks cap at 168: 32 B spilled
    "decode_min_blocks": ("h200_decode_d128.yaml", dict(min_blocks_per_sm=3), "min_blocks_per_sm",
                          "use min_blocks_per_sm <= 2"),
    # 2 blocks of 256 threads cap at 128: 48 B spilled
    "fp8_min_blocks": ("l4_mma_d128_fp8.yaml", dict(min_blocks_per_sm=2), "min_blocks_per_sm",
                       "leave min_blocks_per_sm unset"),
    # wmma had no estimate: 9 blocks cap at 112, 32 B spilled
    "wmma_min_blocks": ("phase5_wmma.yaml", dict(min_blocks_per_sm=9), "min_blocks_per_sm",
                        "use min_blocks_per_sm <= 8"),
    # ptxas: "mma with FP8 floating point type requires .target sm_89 or higher"
    "fp8_on_a100": ("l4_mma_d128_fp8.yaml", dict(target="a100"), "target", "use target l4"),
    # accepted by explain and build; refused only by the runtime's loader
    "params_over_4096": ("lab/h100_mma_d128_expr_window.yaml",
                         dict(variant__params={"left": "int", **{f"p{i}": "float" for i in range(1000)}}),
                         "variant.params", "pass fewer params"),
    # keys a backward or decode kind never reads, accepted without a word
    "bwd_mma_rescale": ("h100_bwd_d128.yaml", dict(softmax={"rescale": "on_max_change"}), "softmax.rescale",
                        "remove softmax.rescale"),
    "bwd_wgmma_rescale": ("h100_bwd_d128_wgmma.yaml", dict(softmax={"rescale": "on_max_change"}),
                          "softmax.rescale", "remove softmax.rescale"),
    "bwd_wgmma_min_blocks": ("h100_bwd_d128_wgmma.yaml", dict(min_blocks_per_sm=2), "min_blocks_per_sm",
                             "remove min_blocks_per_sm"),
    "decode_rescale": ("h200_decode_d128.yaml", dict(softmax={"rescale": "on_max_change"}), "softmax.rescale",
                       "set softmax.rescale: always"),
}


@pytest.mark.parametrize("case", sorted(WRONG_ACCEPTANCES))
def test_wrong_acceptance_is_refused_in_one_line(tmp_path, case):
    base, changes, key, fix = WRONG_ACCEPTANCES[case]
    message = refusal(hostile(tmp_path, base, f"hx_{case}", **changes), key)
    assert fix in message, message


def test_register_rule_holds_with_registers_set_and_unset(tmp_path):
    """The consumer's need is compared whether setmaxnreg moves registers or not: unset, against
    the entry cap; set, against registers.consumer (the rule used to compare only when unset)."""
    three = dict(tile__block_m=192, warps__consumer=12, smem__stages=2)
    unset = refusal(hostile(tmp_path, "lab/h100_wgmma_d128_pp.yaml", "hx_unset", registers=DELETE, **three),
                    "registers")
    assert "needs about 192" in unset and "gets 128 at entry" in unset
    assert "use tile.block_n <= 64 and registers: {producer: 24, consumer: 160}" in unset
    short = refusal(hostile(tmp_path, "lab/h100_wgmma_d128_pp.yaml", "hx_set",
                            registers={"producer": 32, "consumer": 160}, **three), "registers.consumer")
    assert "needs about 192" in short


def test_a_pool_with_room_suggests_more_consumer_registers(tmp_path):
    """Two consumer warpgroups: the pool (3 x 168) has room, so the fix raises registers.consumer."""
    message = refusal(hostile(tmp_path, "lab/h100_wgmma_d128.yaml", "hx_pool", registers={"producer": 24, "consumer": 168}),
                      "registers.consumer")
    assert "set registers: {producer: 24, consumer: 192}" in message


@pytest.mark.exhaustive
def test_every_committed_spec_still_plans():
    result = attngen("check")
    assert result.returncode == 0, result.stdout + result.stderr


# -- a suggested value compiles without spills ------------------------------------------------------

# Per kind: a committed spec and a min_blocks_per_sm above what fits, so that the refusal suggests
# a count (the plan's residency refusal suggests one too). wgmma forward: the registers rule's fix.
SUGGESTIONS = {
    "fwd_scalar": ("phase4.yaml", dict(min_blocks_per_sm=12)),
    "fwd_wmma": ("phase5_wmma.yaml", dict(min_blocks_per_sm=24)),
    "fwd_mma": ("l4_mma_d64.yaml", dict(min_blocks_per_sm=12)),
    "fwd_mma_wide": ("lab/h100_mma_d128_m64n64w4s3x3q.yaml", dict(min_blocks_per_sm=8)),
    "fwd_mma_e4m3": ("l4_mma_d64_fp8.yaml", dict(min_blocks_per_sm=6)),
    "fwd_wgmma": ("lab/h100_wgmma_d64_n128c1hs2o.yaml", dict(min_blocks_per_sm=16)),
    "fwd_wgmma_registers": ("lab/h100_wgmma_d128_pp.yaml", dict(
        tile__block_m=192, warps__consumer=12, smem__stages=2, registers={"producer": 32, "consumer": 160})),
    "fwd_wgmma_pool": ("lab/h100_wgmma_d128.yaml", dict(registers={"producer": 24, "consumer": 168})),
    "fwd_wgmma_e4m3": ("h100_wgmma_d64_fp8_n128c2ps2pb.yaml", dict(min_blocks_per_sm=5)),
    "decode_mma": ("h200_decode_d64.yaml", dict(min_blocks_per_sm=16)),
    "bwd_mma": ("l4_bwd_d64.yaml", dict(min_blocks_per_sm=12)),
    "bwd_wgmma": ("h100_bwd_d64_wgmma.yaml", dict(min_blocks_per_sm=2)),
}

FIXES = (
    (re.compile(r"use min_blocks_per_sm <= (\d+)"), lambda m: dict(min_blocks_per_sm=int(m[1]))),
    (re.compile(r"(leave min_blocks_per_sm unset|remove min_blocks_per_sm)"), lambda m: dict(min_blocks_per_sm=DELETE)),
    (re.compile(r"use tile\.block_n <= (\d+)"), lambda m: dict(tile__block_n=int(m[1]))),
    (re.compile(r"set registers: \{producer: (\d+), consumer: (\d+)\}"),
     lambda m: dict(registers={"producer": int(m[1]), "consumer": int(m[2])})),
)


def suggestion(text: str) -> dict:
    for pattern, change in FIXES:
        m = pattern.search(text)
        if m:
            return change(m)
    raise AssertionError(f"no suggested value in {text!r}")


@pytest.mark.nvcc
@pytest.mark.parametrize("kind", sampled(sorted(SUGGESTIONS), "fwd_mma".__eq__, sorted(SUGGESTIONS)))   # one by default
def test_a_suggested_value_compiles_without_spills(tmp_path, kind):
    base, changes = SUGGESTIONS[kind]
    refused = attngen("explain", str(hostile(tmp_path, base, f"hx_{kind}", **changes)))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    fixed = hostile(tmp_path, base, f"hx_{kind}_fixed", **{**changes, **suggestion(refused.stderr)})
    result = attngen("compile", "--json", str(fixed))
    # compile exits 1 on spills and on a serialized wgmma (C7510-C7520), whose report is the log's
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report and all(f["spill_stores"] == 0 and f["spill_loads"] == 0 for f in report), report
