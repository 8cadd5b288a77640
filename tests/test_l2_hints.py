"""schedule.l2_hints: the wgmma forward's TMA copies carry L2 eviction priorities (Q's loads and O's stores
evict_first, K's and V's loads evict_last). A spec without the key renders no cache policy at all, so its code is
what it was before the key existed; the members that set it are verified and timed in
docs/hopper-h200/middle_pairs/README.md."""
from __future__ import annotations

from pathlib import Path

from attngen.render import render_bundle

ROOT = Path(__file__).resolve().parents[1]


def source(name: str) -> str:
    return render_bundle(ROOT / "specs" / f"{name}.yaml")[1][0]


def test_the_members_hint_every_copy_of_q_k_v_and_o():
    text = source("h100_wgmma_d128_persistent_q2_pm")
    assert "createpolicy.fractional.L2::evict_first.b64" in text and "createpolicy.fractional.L2::evict_last.b64" in text
    load_q = text[text.index("void load_q("):text.index("void load_kv(")]
    assert "tma_load_4d_hinted(" in load_q and "l2_evict_first()" in load_q and "tma_load_4d(" not in load_q
    load_kv = text[text.index("void load_kv("):text.index("void load_block(")]
    assert "l2_evict_last()" in load_kv and "tma_load_4d(" not in load_kv
    store = text[text.index("void tma_store_rows("):]
    store = store[:store.index("bulk_commit_group();")]
    assert "tma_store_4d_hinted(" in store and "l2_evict_first()" in store


def test_a_spec_without_the_key_has_no_cache_policy():
    for name in ("h100_wgmma_d128_persistent_q2", "h100_wgmma_d256", "h100_wgmma_d64_persistent_q2_mc4"):
        text = source(name)
        assert "cache_hint" not in text and "createpolicy" not in text, name

