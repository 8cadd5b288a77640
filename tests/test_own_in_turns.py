"""epilogue_tile: own_in_turns: O's own tile holds one warpgroup's 64 rows, which the two consumer warpgroups take in
turn on named barriers, so a persistent block hands Q back before its epilogue where a whole own tile does not fit (d192,
d256). A spec without the key renders none of it; the members are verified and timed in
docs/hopper-h200/own_in_turns/README.md."""
from __future__ import annotations

from pathlib import Path

from attngen.render import render_bundle

ROOT = Path(__file__).resolve().parents[1]


def source(name: str) -> str:
    return render_bundle(ROOT / "specs" / f"{name}.yaml")[1][0]


def test_own_in_turns_members_stage_one_warpgroups_rows_and_pass_the_tile():
    """epilogue_tile: own_in_turns: a warpgroup's rows of O go to row 0 of the 64-row tile (panels of 64 rows), the
    TMA store reads them from there, and the two warpgroups pass the tile on their named barriers; a spec without the
    key renders none of it."""
    text = source("h100_wgmma_d256_persistent_n64_pm_ot")
    assert "stage_output(sO, o, inv, row0 - c.m0 - wg_row0, lane)" in text
    assert "(chunk / kPanelChunks) * (kRowsPerWarpgroup * kPanelRowBytes)" in text
    store = text[text.index("void tma_store_rows("):]
    assert "sO + panel * kRowsPerWarpgroup * kPanelRowBytes, kPanelCols * panel," in store[:store.index("bulk_commit_group();")]
    loop = text[text.index("int o_turns = 0;"):]
    assert loop.index("take_o_tile(warpgroup, o_turns);") < loop.index("pass_o_tile(warpgroup);") < \
        loop.index("last_o_turn(warpgroup, o_turns);")
    for name in ("h100_wgmma_d256_persistent_n64_pm", "h100_wgmma_d128_persistent_q2"):
        plain = source(name)
        assert "o_turns" not in plain and "kOTurnBarrier" not in plain and "kBlockM * kPanelRowBytes) + row" in plain
