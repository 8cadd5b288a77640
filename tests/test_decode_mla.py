"""The latent-cache decode kind (decode_mla) without a GPU: its plan's numbers, its Params (no V pointer: V is
read from K's tiles), its launch record (v_in_k and the combine's column slices survive the round trip), the
table's entries keyed on V's head dim, and the generated code's shape."""
from __future__ import annotations

import json
from pathlib import Path

from attngen.core.launch_plan import LaunchPlan
from attngen.ops.table import load_table, select, table_path
from attngen.plan import make_plan
from attngen.spec import load_spec

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "h200_decode_d576_mla.yaml"


def plan():
    return make_plan(load_spec(SPEC))


def test_the_plan_splits_s_by_keys_and_o_by_columns():
    p = plan()
    f = p.fragments
    assert (p.head_dim, p.v_dim, p.block_m, p.block_n, p.threads) == (576, 512, 16, 64, 128)
    assert (f.keys_per_warp, f.s_tiles, f.score_chains, f.cols_per_warp, f.o_tiles) == (16, 2, 3, 128, 16)
    assert (f.copy_rows, f.copy_passes, f.copy_chunks) == (16, 4, 9)
    assert p.v_in_k and p.combine_slices == 4 and p.paged and p.combine == "kernel"
    # Q, two cache stages, P, row maxima and sums: one block per SM
    assert [r.name for r in p.regions] == ["q", "kv0", "kv1", "p", "row_max", "row_sum"]
    assert p.smem_bytes == 168448 and p.kv_stage_stride == 73728


def test_params_carry_no_v_and_no_mask_offset():
    names = {f.name for f in plan().abi.fields}
    assert {"q", "k", "o", "lse", "cache_seqlens", "o_accum", "lse_accum", "block_table", "page_shift"} <= names
    assert not names & {"v", "v_batch_stride", "v_head_stride", "v_row_stride", "causal_offset", "split_counters",
                        "k_new"}


def test_the_launch_record_keeps_v_in_k_and_the_combine_slices():
    record = json.loads((ROOT / "generated" / "h200_decode_d576_mla.launch.json").read_text())
    assert record["kv_cache"]["v_in_k"] is True and record["kv_cache"]["combine_slices"] == 4
    launch = LaunchPlan.from_record(record)
    assert launch.v_in_k and launch.combine_slices == 4 and launch.v_dim == 512
    # every other decode record stays as it was: neither key where it does not hold
    other = json.loads((ROOT / "generated" / "h200_decode_d128.launch.json").read_text())
    assert "v_in_k" not in other["kv_cache"] and "combine_slices" not in other["kv_cache"]
    assert not LaunchPlan.from_record(other).v_in_k


def test_the_record_keeps_the_wide_combine_and_calls_of_many_splits_launch_it():
    """The combine part has a lean and a wide function; the call takes the wide one (half the columns per warp,
    so twice the grid's y) from WIDE_COMBINE_MIN_SPLITS splits, and a decode cell without one never does."""
    import types
    from attngen.core.launch_rules import WIDE_COMBINE_MIN_SPLITS
    from attngen.runtime.calls.decode import DecodeKernel
    record = json.loads((ROOT / "generated" / "h200_decode_d576_mla.launch.json").read_text())
    assert record["kv_cache"]["combine_wide_slices"] == 8
    assert [f[0] for f in record["parts"][1]["functions"]] == ["combine", "combine_wide"]

    def launch(name, splits, rows):
        k = object.__new__(DecodeKernel)
        k.plan = LaunchPlan.from_record(json.loads((ROOT / "generated" / f"{name}.launch.json").read_text()))
        k.functions = {fn: types.SimpleNamespace(name=fn, threads=part["threads"])
                       for part in json.loads((ROOT / "generated" / f"{name}.launch.json").read_text())["parts"]
                       for _, fn in part["functions"]}
        return k._combine_launch(splits, rows)
    mla = "attngen_h200_decode_d576_mla"
    assert launch("h200_decode_d576_mla", WIDE_COMBINE_MIN_SPLITS - 1, 16) == (f"{mla}_combine", (4, 4, 1))
    assert launch("h200_decode_d576_mla", WIDE_COMBINE_MIN_SPLITS, 16) == (f"{mla}_combine_wide", (4, 8, 1))
    assert launch("h200_decode_d576_mla", 128, 17) == (f"{mla}_combine_wide", (5, 8, 1))
    assert launch("h200_decode_d128", 128, 32) == ("attngen_h200_decode_d128_combine", (8, 1, 1))


def test_the_verify_cases_reach_both_combine_functions():
    """`attngen verify` merges some latent case with each combine function: split counts on both sides of
    WIDE_COMBINE_MIN_SPLITS once the runtime has evened the slices (the count of tiles per slice rounded up)."""
    from attngen.core.launch_rules import WIDE_COMBINE_MIN_SPLITS
    from attngen.eval.verify.decode import latent_cases
    from attngen.runtime.calls.decode import num_splits_for
    p = plan()
    splits = set()
    for c in latent_cases(p.block_n, p.paged):
        n_tiles = -(-c.capacity // p.block_n)
        blocks = c.batch * c.kv_heads * -(-(c.heads // c.kv_heads) * c.seqlen_q // p.block_m)
        s = min(c.num_splits, n_tiles) if c.num_splits else num_splits_for(p, blocks, n_tiles, 132)
        splits.add(-(-n_tiles // -(-n_tiles // s)))
    assert any(1 < s < WIDE_COMBINE_MIN_SPLITS for s in splits) and max(splits) >= WIDE_COMBINE_MIN_SPLITS


def test_the_wide_combine_takes_each_weight_with_one_shuffle():
    source = (ROOT / "generated" / "h200_decode_d576_mla_combine.cu").read_text()
    assert "combine<128, 8>(p);" in source and "combine<64, 32>(p);" in source
    assert "__shfl_sync(0xffffffffu, lse[s / 32], s % 32)" in source
    # the decode_mma cells' combine (a warp per row; its plain function and a serving step's rows function) keeps its
    # loop over every slot
    other = (ROOT / "generated" / "h200_decode_d128_combine.cu").read_text()
    assert "combine<false>(p);" in other and "combine<true>(p);" in other
    assert "if (s / 32 == j) w = __shfl_sync" in other


def test_the_table_keys_the_latent_cells_on_v_head_dim():
    entries = load_table(table_path(ROOT / "specs"))
    for dtype, name in (("fp16", "h200_decode_d576_mla"), ("bf16", "h200_decode_d576_mla_bf16")):
        for mask in ("none", "causal"):
            for paged in (False, True):
                e = select(entries, "decode", "sm_90", dtype, 576, mask, 8192, paged=paged, group_rows=16,
                           head_dim_v=512)
                assert e.spec == name


def test_the_table_sends_many_query_rows_per_latent_cache_to_the_seesaw():
    """Above 64 group rows (two row blocks) and from 1024 query rows (batch x heads x new tokens) the seesaw
    cell serves; fewer rows, or one row block, stay on the shared-tile wgmma cell; 16 rows on mma.sync."""
    entries = load_table(table_path(ROOT / "specs"))
    for dtype, suffix in (("fp16", ""), ("bf16", "_bf16")):
        for mask in ("none", "causal"):
            for paged in (False, True):
                def pick(group_rows, rows):
                    return select(entries, "decode", "sm_90", dtype, 576, mask, 4096, paged=paged,
                                  group_rows=group_rows, head_dim_v=512, rows=rows).spec
                assert pick(128, 1024) == pick(256, 4096) == f"h200_decode_d576_mla_seesaw{suffix}"
                assert pick(128, 512) == pick(64, 4096) == pick(32, 4096) == f"h200_decode_d576_mla_wgmma{suffix}"
                assert pick(16, 4096) == f"h200_decode_d576_mla{suffix}"


def test_the_seesaw_hands_p_over_in_the_rotary_panel():
    """The seesaw cell: each warpgroup scores whole 64-key tiles (m64n64), P.V from its own registers (RS) and
    from the other's P in the tile's ninth panel (SS); named barriers pair the warpgroups, no block barrier in
    the loop."""
    p = make_plan(load_spec(ROOT / "specs" / "h200_decode_d576_mla_seesaw_bf16.yaml"))
    f = p.fragments
    assert (f.seesaw, f.s_keys, f.s_regs, f.o_cols, f.o_regs, f.p_panel) == (True, 64, 32, 256, 128, 8)
    assert (f.copy_rows, f.copy_passes, f.copy_chunks) == (16, 4, 9)
    assert [r.name for r in p.regions if r.name.startswith(("p", "row"))] == ["row_max", "row_sum"]
    source = (ROOT / "generated" / "h200_decode_d576_mla_seesaw_bf16_split.cu").read_text()
    # the loop's body is one pair lambda: the pairs with both tiles in the loop, a split's lone last tile after it
    body = source.index("auto pair = [&](int a, auto has_b_tag)")
    loop = source[body:source.index("cp_async_wait<0>();\n    allow_dependents")]
    assert "__syncthreads" not in loop and loop.count("bar_sync(") == 6 and loop.count("bar_arrive(") == 6
    assert "for (; a + 1 < t_end; a += 2) pair(a, TileB<true>{});" in loop
    assert "if (a < t_end) pair(a, TileB<false>{});" in loop
    assert "wgmma_rs_m64n256(o, a[kc], v_desc(sKV, wg, kc))" in source
    assert "wgmma_ss_m64n256_kmn(o, p_desc(sKV, kc), v_desc(sKV, wg, kc), 1)" in source


def test_the_split_kernel_reads_v_from_the_cache_tile():
    source = (ROOT / "generated" / "h200_decode_d576_mla_split.cu").read_text()
    assert "ldmatrix_x4_trans(b, sKV + tile_offset(" in source      # P.V's B fragments from the K tile
    assert "p.v" not in source.replace("p.visible", "")
    assert "report_input_error(p, kBadPage)" in source and "report_input_error(p, kBadSeqlen)" in source


def test_a_block_of_two_row_groups_shares_each_tile():
    """block_m 32 over 8 warps: two 16-row groups of 4 warps each, sharing the cache tiles; each warp keeps
    a 16-row warp's share (the same registers' worth of O and S), and the P tile holds both groups' rows."""
    p = make_plan(load_spec(ROOT / "specs" / "h200_decode_d576_mla_m32.yaml"))
    f = p.fragments
    assert (p.block_m, p.block_n, p.threads) == (32, 64, 256)
    assert (f.row_groups, f.key_warps, f.keys_per_warp, f.cols_per_warp, f.o_tiles) == (2, 4, 16, 128, 16)
    assert (f.copy_rows, f.copy_passes, f.copy_chunks) == (32, 2, 9)
    assert p.region("p").rows == 32 and p.region("q").rows == 32
    text = (ROOT / "generated" / "h200_decode_d576_mla_m32_split.cu").read_text()
    assert "constexpr int kRowGroups = 2;" in text and "constexpr int kKeyWarps = 4;" in text
    one = (ROOT / "generated" / "h200_decode_d576_mla_split.cu").read_text()
    assert "constexpr int kRowGroups = 1;" in one and "constexpr int kKeyWarps = 4;" in one


def test_row_groups_need_their_share_of_warps():
    import pytest
    from attngen.errors import SpecError
    from attngen.spec import parse_spec
    text = (ROOT / "specs" / "h200_decode_d576_mla.yaml").read_text().split("\ncells:")[0] + "\n"
    for tile, warps, key in (("{block_m: 32, block_n: 64}", "{compute: 6}", "warps"),
                             ("{block_m: 48, block_n: 64}", "{compute: 8}", "block_m"),
                             ("{block_m: 32, block_n: 96}", "{compute: 8}", "block_n")):
        bad = text.replace("tile: {block_m: 16, block_n: 64}", f"tile: {tile}").replace(
            "warps: {compute: 4}", f"warps: {warps}").replace("dtypes: [fp16, bf16]", "dtype: fp16")
        with pytest.raises(SpecError, match=key):
            make_plan(parse_spec(bad))


def test_the_wgmma_form_reads_panels_over_two_warpgroups():
    """mma: wgmma_m64nNk16: 64 group rows over two warpgroups, each scoring half a tile's keys (m64n32) and
    holding half of O's columns (m64n256, V MN-major from the cache tile); Q, the ring's tiles and P in
    1024-byte-aligned 128-byte-swizzled panels; compiled for sm_90a."""
    p = make_plan(load_spec(ROOT / "specs" / "h200_decode_d576_mla_wgmma.yaml"))
    f = p.fragments
    assert (p.block_m, p.block_n, p.threads, p.arch_suffix) == (64, 64, 256, "a")
    assert (f.s_keys, f.s_regs, f.o_cols, f.o_regs, f.k_steps_qk, f.k_steps_pv) == (32, 16, 256, 128, 36, 4)
    assert (f.copy_rows, f.copy_passes, f.copy_chunks) == (32, 2, 9)
    for name, rows in (("q", 64 * 9), ("kv0", 64 * 9), ("kv1", 64 * 9), ("p", 64)):
        r = p.region(name)
        assert r.offset % 1024 == 0 and r.rows == rows and r.pitch_bytes == 128, name
    assert p.smem_bytes <= 232448
    text = (ROOT / "generated" / "h200_decode_d576_mla_wgmma_split.cu").read_text()
    assert "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16" in text
    assert "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16" in text
    assert "cp_async_16(stage + kv_offset(" in text and "cp_async_16(sQ + q_offset(" in text
    assert "ldmatrix" not in text and "p.v" not in text.replace("p.visible", "")
    # refill: during_scores: the ring's copy is issued behind S's wgmmas, before their wait
    loop = text[text.index("for (int t = t_begin; t < t_end; ++t)"):]
    assert loop.index("wgmma_ss_m64n32(s,") < loop.index("refill_ring(base") < loop.index("wgmma_wait<0>()")
    from attngen.explain import explain
    explained = explain(p)
    assert "wgmma per tile per warpgroup: 36 (Q.K^T, m64n32k16) + 4 (P.V, m64n256k16)" in explained


def test_the_wgmma_form_needs_an_sm90a_target_and_its_shape():
    import pytest
    from attngen.errors import SpecError
    from attngen.spec import parse_spec
    text = (ROOT / "specs" / "h200_decode_d576_mla.yaml").read_text().split("\ncells:")[0] + "\n"
    text = text.replace("dtypes: [fp16, bf16]", "dtype: fp16").replace(
        "tile: {block_m: 16, block_n: 64}", "tile: {block_m: 64, block_n: 64}\nmma: wgmma_m64nNk16").replace(
        "warps: {compute: 4}", "warps: {compute: 8}")
    assert make_plan(parse_spec(text)).block_m == 64
    for old, new, key in (("target: h200", "target: l4", "target"),
                          ("block_m: 64, block_n: 64", "block_m: 32, block_n: 64", "block_m"),
                          ("block_m: 64, block_n: 64", "block_m: 64, block_n: 96", "block_n")):
        with pytest.raises(SpecError, match=key):
            make_plan(parse_spec(text.replace(old, new)))
