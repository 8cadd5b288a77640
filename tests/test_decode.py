"""The decode kind without a GPU: kind selection, the plan of its two-part bundle, the Params it
adds, and the split heuristic."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from attngen.core.launch_rules import num_splits, row_blocks, split_rule_text
from attngen.errors import SpecError
from attngen.explain import explain
from attngen.kinds import kind_for_data, kind_of
from attngen.plan import make_plan
from attngen.spec import load_spec, parse_spec
from spec_sample import spec_text

ROOT = Path(__file__).resolve().parent.parent
D128 = ROOT / "specs" / "h200_decode_d128.yaml"


def test_decode_key_picks_the_kind_before_mma():
    data = yaml.safe_load(D128.read_text())
    assert kind_for_data(data).name == "decode_mma"
    assert kind_for_data({**data, "mma": "mma_m16n8k16"}).name == "decode_mma"   # the rarer key decides
    assert kind_for_data({k: v for k, v in data.items() if k != "decode"} | {"mma": "mma_m16n8k16"}).name == "fwd_mma"


def test_plan_is_a_two_part_bundle():
    p = make_plan(load_spec(D128))
    assert kind_of(p.spec).calls == "decode"
    split, combine = p.parts
    # a serving step's decode rows (paged, mask none): functions of their own after the plain ones
    assert [fn for _, fn in split.functions] == ["attngen_h200_decode_d128_split_none",
                                                 "attngen_h200_decode_d128_split_causal",
                                                 "attngen_h200_decode_d128_split_none_rows"]
    assert combine.functions == (("combine", "attngen_h200_decode_d128_combine"),
                                 ("combine_rows", "attngen_h200_decode_d128_combine_rows"))
    assert p.step_rows and {"query_rows", "query_total"} <= set(combine.reads)
    assert [p.body(key) for key, _ in split.functions] == ["attention", "attention", "attention_rows"]
    assert [p.mask_cpp[key] for key, _ in split.functions] == ["Mask::None", "Mask::Causal", "Mask::None"]
    assert (combine.static_smem, combine.threads) == (0, 128) and split.static_smem is None
    # each waits for the kernel ahead of it itself (griddepcontrol.wait), so it is launched before that ends:
    # the combine behind its split kernel, the split kernel behind whatever the stream ran before
    assert combine.awaits_predecessor and split.awaits_predecessor
    names = [f.name for f in p.abi.fields]
    assert names[-14:] == ["cache_seqlens", "o_accum", "lse_accum", "num_splits", "tiles_per_split", "row_blocks",
                           "block_table", "table_stride", "split_counters", "num_pages", "page_size", "page_shift",
                           "query_rows", "query_total"]
    assert "paged KV: any page size from 1 to 512 keys" in explain(p)
    f = p.fragments
    # each of 4 warps scores 32 of a 128-key tile for all 16 group rows
    assert (f.m_tiles, f.keys_per_warp, f.n_tiles, f.d_tiles, f.accumulators) == (1, 32, 4, 16, 80)
    assert f.merge_bytes == 4 * 16 * 136 * 4 <= p.stages * p.kv_stage_stride
    text = explain(p)
    assert "merge:" in text and "splits: at most 128" in text


def test_programmatic_launches_from_sm_90():
    from attngen.runtime.driver import LaunchAttribute, LaunchConfig, programmatic_launches
    import ctypes
    assert [programmatic_launches(a) for a in ("sm_80", "sm_89", "sm_90", "sm_90a", "sm_100a", "sm_120")] == [
        False, False, True, True, True, True]
    # the driver's CUlaunchConfig and CUlaunchAttribute layouts (cuda.h): stream at 32, 72-byte attributes
    assert (ctypes.sizeof(LaunchConfig), LaunchConfig.stream.offset, LaunchConfig.num_attrs.offset) == (56, 32, 48)
    assert (ctypes.sizeof(LaunchAttribute), LaunchAttribute.value.offset) == (72, 8)


def test_q_fragments_are_held_where_they_fit():
    """d128: Q's fragments stay in registers beside S and O; d256: O alone takes 128 accumulators, so
    the plan reads Q from its tile at every k-step (explain says why) and the rule counts S and O only."""
    held = make_plan(load_spec(D128))
    assert held.fragments.q_regs == 32 and held.q_in_registers
    read = make_plan(load_spec(ROOT / "specs" / "h200_decode_d256.yaml"))
    assert (read.fragments.q_regs, read.fragments.accumulators, read.q_in_registers) == (0, 136, False)
    assert "Q read from its tile at every k-step" in explain(read)
    assert read.spec.register_need()[0] == 136
    # 32 rows of d256 hold 272 accumulators: refused, with the fix
    text = spec_text(ROOT / "specs" / "h200_decode_d256.yaml").replace("block_m: 16", "block_m: 32")
    with pytest.raises(SpecError) as info:
        make_plan(parse_spec(text, file="x.yaml"), file="x.yaml")
    assert info.value.key == "tile.block_m" and "hold S and O for 32 rows" in info.value.message


def test_merge_buffer_must_fit_over_the_ring():
    text = spec_text(ROOT / "specs" / "h200_decode_d64.yaml").replace("block_n: 128", "block_n: 64")
    text = text.replace("stages: 3", "stages: 2").replace("block_m: 16", "block_m: 32")
    # 4 warps x 32 rows x 72 floats x 4 B = 36864 B over a 2 stages x (K + V) x 64 x 64 x 2 B = 32768 B ring
    with pytest.raises(SpecError) as info:
        make_plan(parse_spec(text, file="x.yaml"), file="x.yaml")
    assert info.value.key == "smem.stages"


def test_row_blocks_pack_query_heads_and_tokens():
    p = make_plan(load_spec(D128))
    assert row_blocks(p, 32, 8, 1) == 1      # 4 query heads per KV head
    assert row_blocks(p, 32, 8, 4) == 1      # x 4 new tokens = 16 rows
    assert row_blocks(p, 64, 8, 4) == 2      # 32 rows
    assert row_blocks(p, 8, 1, 16) == 8      # MQA: 8 heads x 16 tokens


@pytest.mark.parametrize("blocks, n_tiles, expect", [
    (512, 64, 1),          # already more blocks than 0.8 x the slots: no split
    (8, 256, 16),          # B=1, 8 KV heads on 132 SMs: 128 blocks (0.97 of a wave) beats 14 (0.85)
    (8, 3, 3),             # never more splits than tiles
    (64, 64, 2),           # 128 blocks
])
def test_num_splits(blocks, n_tiles, expect):
    assert num_splits(blocks, n_tiles, 132, 1, 128) == expect


@pytest.mark.parametrize("blocks, in_flight, expect", [
    (64, 128 << 10, 1),    # d128 at batch 8: 62 KiB per SM in flight unsplit, enough to stream at full speed
    (64, 64 << 10, 2),     # d64 at batch 8: 31 KiB per SM; two slices
    (32, 128 << 10, 4),    # d128 at batch 4
])
def test_num_splits_stops_splitting_with_enough_bytes_in_flight(blocks, in_flight, expect):
    assert num_splits(blocks, 32, 132, 1, 128, in_flight) == expect


def test_only_the_contiguous_kernel_combine_build_counts_bytes_in_flight():
    contiguous = make_plan(load_spec(ROOT / "specs/h200_decode_d128_contiguous.yaml"))
    assert contiguous.unsplit_in_flight == 2 * 2 * 128 * 128 * 2     # 2 stages ahead, K and V tiles
    for name in ("h200_decode_d128", "h200_decode_d128_fused"):        # paged, fused: waves only
        assert make_plan(load_spec(ROOT / f"specs/{name}.yaml")).unsplit_in_flight == 0


@pytest.mark.parametrize("blocks, n_tiles, expect", [
    (8, 16, 8),            # B=1 at 2k keys: 16 slices of one tile would be the best wave; 8 of two
    (8, 12, 6),            # 6 slices of two tiles rather than 12 of one
    (8, 8, 8),             # 8 tiles: two-tile slices would leave 4; 8 slices of one tile
    (8, 3, 3),             # short caches keep one-tile slices
    (8, 256, 16),          # long caches: the wave decides as before
    (8, 20, 10),           # the wave rule already cuts two-tile slices: unchanged
])
def test_one_tile_slices_become_min_slice_tiles_where_eight_remain(blocks, n_tiles, expect):
    assert num_splits(blocks, n_tiles, 132, 1, 128, min_slice_tiles=2) == expect


def test_merging_plans_split_by_slice_cost_and_kernel_plans_by_waves_below_128_tiles():
    from attngen.runtime.calls.decode import num_splits_for
    kernel_combine = make_plan(load_spec(ROOT / "specs/h200_decode_d128.yaml"))
    merging = make_plan(load_spec(ROOT / "specs/h200_decode_d128_contiguous.yaml"))
    assert (kernel_combine.combine, merging.combine) == ("kernel", "auto")
    assert num_splits_for(kernel_combine, 8, 33, 132) == 11     # wave rule: 33 one-tile slices -> 3 tiles
    assert num_splits_for(merging, 8, 33, 132) == 11
    assert num_splits_for(kernel_combine, 1, 32, 132) == 16     # 4k keys: 16 slices of 2 tiles (11.3 us; 11: 12.2)
    assert num_splits_for(merging, 1, 128, 132) == 22           # one block would read 128 partials
    # from the family's slice_cost_from_tiles (128) its combine-kernel cells take the slice cost too (H200, d128
    # bf16 B1 8/1); d96 and MLA, slower so, keep the wave rule, and so do the e4m3 cells
    assert kernel_combine.slice_cost_min_tiles == 128 and merging.slice_cost_min_tiles == 0
    assert num_splits_for(kernel_combine, 1, 128, 132) == 22    # 16k keys: 15.9 us; the wave rule's 64: 16.5
    assert num_splits_for(kernel_combine, 1, 256, 132) == 32    # 32k keys: 18.9 us; the wave rule's 128: 24.5
    d96 = make_plan(load_spec(ROOT / "specs/h200_decode_d96_bf16.yaml"))
    e4m3 = make_plan(load_spec(ROOT / "specs/h200_decode_d128_kv_e4m3.yaml"))
    assert d96.slice_cost_min_tiles == 0 and e4m3.slice_cost_min_tiles == 0
    assert num_splits_for(d96, 1, 128, 132) == 64               # 16k keys: 16.3 us; the slice cost's 22: 19.7
    # the boundary: 127 tiles keep the wave rule, and the rule's text says where the slice cost starts
    assert num_splits_for(kernel_combine, 1, 127, 132) == num_splits(1, 127, 132, 1, 128, min_slice_tiles=2) != 22
    assert "where the cache has 128 tiles or more; below, the fewest" in split_rule_text("kernel", 0, 1, 128)
    assert "slice cost" not in split_rule_text("kernel", 0, 1, 0)


def test_e4m3_combine_kernel_cells_count_two_blocks_per_sm_from_32_blocks_16_and_128_tiles_or_8_and_256():
    from attngen.core.launch_rules import split_blocks_per_sm
    from attngen.runtime.calls.decode import num_splits_for
    paged = make_plan(load_spec(ROOT / "specs/h200_decode_d128_kv_e4m3.yaml"))
    assert (paged.combine, paged.co_resident_blocks) == ("kernel", 2)
    assert [split_blocks_per_sm(2, b, t, True) for b, t in ((16, 128), (16, 64), (15, 255), (8, 256), (8, 255),
                                                            (4, 1024), (32, 64), (64, 64), (31, 127), (32, 63))
            ] == [2, 1, 1, 2, 1, 1, 2, 2, 1, 1]
    assert num_splits_for(paged, 64, 64, 132) == 4      # B8 32/8 at 8k keys, two per SM counted; one per SM: 2
    assert num_splits_for(paged, 16, 256, 132) == 16    # B2 32/8 at 32k keys: 45.0 us; one per SM counted, 8: 52.1
    assert num_splits_for(paged, 8, 1024, 132) == 31    # B1 32/8 at 128k keys: 79.9 us in 31; 16: 94.6
    assert num_splits_for(paged, 8, 128, 132) == 16     # at 16k keys one per SM: 21.3 us; 22 slices 22.8
    assert num_splits_for(paged, 1, 1024, 132) == 128   # one KV head keeps the wave rule: 31.7 us; 64: 34.6


@pytest.mark.parametrize("blocks, n_tiles, expect", [
    # each the fastest or within 7 % of the fastest count timed on the H200 (bf16, d64 and d128)
    (8, 8, 8),             # B1 8 KV heads, 1k keys: one-tile slices (9.9 us; 4 slices 11.1)
    (8, 24, 8),            # 3k keys: 8 slices of 3 tiles (12.9 us; the wave rule's 12 of 2: 13.7)
    (8, 33, 11),           # 4224 keys: 11 of 3 (14.5 us; the wave rule's 33 in two waves: 22.4)
    (16, 33, 7),           # B2: 7 of 5 (17.3 us; 33: 30.5)
    (1, 64, 16),           # one KV head, 8k keys: 16 (15.8 us; the wave rule's 64: 22.6)
    (1, 128, 22),          # 16k keys: 22 (19.4 us; 128: 36.5)
    (8, 256, 16),          # 32k keys: one wave of 128 blocks, as the wave rule
    (512, 64, 1),          # more blocks than 0.8 x the slots: no split
])
def test_slice_cost_split_counts(blocks, n_tiles, expect):
    assert num_splits(blocks, n_tiles, 132, 1, 128, least_slice_cost=True) == expect


@pytest.mark.parametrize("blocks, n_tiles, expect", [
    (1, 12, 12),           # MLA B1 16/1, 768 keys: 12 one-tile slices fill 12 of 132 SMs (11.1 us; 6: 12.0)
    (1, 16, 16),           # one KV head at 2k keys (d128 10.0 us; 8: 10.5)
    (1, 24, 24),           # MLA B1 16/1, 1536 keys (11.9 us; 12: 12.7)
    (1, 32, 16),           # from 32 tiles, two-tile slices: d128 B1 8/1 at 4k keys (11.2 us; 32: 11.7)
    (8, 16, 8),            # 8 KV heads: 16 one-tile slices would fill 128 SMs; 8 of two
])
def test_one_tile_slices_that_fill_little_of_the_gpu_stay_one_tile(blocks, n_tiles, expect):
    assert num_splits(blocks, n_tiles, 132, 1, 128, min_slice_tiles=2) == expect


def test_num_splits_respects_max_splits():
    assert num_splits(1, 1000, 132, 1, 4) == 4
    assert num_splits(1, 1000, 132, 1, 1) == 1


def test_combine_auto_has_a_plain_and_a_merging_split_function_per_mask():
    p = make_plan(load_spec(ROOT / "specs/h200_decode_d128_contiguous.yaml"))
    assert [part.name for part in p.parts] == ["split"]
    assert [key for key, _ in p.parts[0].functions] == ["none", "causal", "none_merging", "causal_merging"]
    assert p.split_key("causal", 1) == "causal" and p.split_key("causal", 3) == "causal_merging"
    assert not p.merges_in_kernel(1) and p.merges_in_kernel(3)
    assert p.body("none_merging") == "attention_merging" and p.mask_cpp["none_merging"] == p.mask_cpp["none"]
    kernel_combine = make_plan(load_spec(D128))
    assert kernel_combine.split_key("causal", 3) == "causal" and not kernel_combine.merges_in_kernel(3)


def test_fused_combine_is_one_part():
    p = make_plan(load_spec(ROOT / "specs" / "h200_decode_d128_fused.yaml"))
    assert [part.name for part in p.parts] == ["split"] and p.fused_combine
    assert "split_counters" in [f.name for f in p.abi.fields]
    assert any("fused combine" in line for line in p.schedule)


def test_page_shift_takes_powers_of_two_up_to_512():
    from attngen.cli.options import MAX_PAGE_SIZE as CLI_MAX_PAGE_SIZE
    from attngen.core.launch_rules import MAX_PAGE_SIZE, page_shift
    from attngen.core.varlen_plan import MAX_PAGE_SIZE as VARLEN_MAX_PAGE_SIZE
    assert MAX_PAGE_SIZE == CLI_MAX_PAGE_SIZE == VARLEN_MAX_PAGE_SIZE == 512   # the CLI keeps its own (no core import)
    assert [page_shift(1 << s) for s in range(10)] == list(range(10))
    for bad in (0, -16, 3, 12, 48, 1000, 1024, 16.0, True, "16"):
        assert page_shift(bad) is None


def test_every_paged_cell_serves_any_page_size():
    """The table keys decode calls on paged (not a page size): every paged entry names a spec with
    paged: true, and `attngen dispatch` takes any power of two and refuses the rest."""
    from click.testing import CliRunner
    from attngen.cli import main
    from attngen.ops.table import load_table, select, table_path
    entries = load_table(table_path(ROOT / "specs"))
    paged = [e for e in entries if e.call == "decode" and e.paged]
    assert paged and all(make_plan(load_spec(ROOT / "specs" / f"{e.spec}.yaml")).paged for e in paged)
    for head_dim in (64, 96, 128, 256):
        assert select(entries, "decode", "sm_90", "fp16", head_dim, "causal", 8192, paged=True).paged
    runner = CliRunner()
    for pg in (1, 4, 64, 512):
        result = runner.invoke(main, ["dispatch", "--call", "decode", "--head-dim", "128", "--page-size", str(pg)])
        assert result.exit_code == 0 and "-> h200_decode_d128" in result.output, result.output
    result = runner.invoke(main, ["dispatch", "--call", "decode", "--head-dim", "128", "--page-size", "12"])
    assert result.exit_code != 0 and "power of two" in result.output


def test_contiguous_cells_carry_no_page_code():
    """A contiguous-only cell (paged: false) renders no table, no page fields and no `rows` region; a
    paged one reads the page size and its shift from Params, never as a constant."""
    contiguous = (ROOT / "generated" / "h200_decode_d128_contiguous_split.cu").read_text()
    paged = (ROOT / "generated" / "h200_decode_d128_split.cu").read_text()
    for word in ("block_table", "page_shift", "kSmem_rows", "gather_kv", "num_pages"):
        assert word not in contiguous and word in paged
    assert "p.page_shift" in paged and "p.page_size" in paged and "kPageSize" not in paged


def test_e4m3_cells_count_two_blocks_per_sm_on_large_grids_and_caches():
    from attngen.core.launch_rules import split_blocks_per_sm
    from attngen.runtime.calls.decode import num_splits_for
    e4m3 = make_plan(load_spec(ROOT / "specs/h200_decode_d128_kv_e4m3_contiguous.yaml"))
    fp16 = make_plan(load_spec(ROOT / "specs/h200_decode_d128_contiguous.yaml"))
    assert (e4m3.co_resident_blocks, fp16.co_resident_blocks) == (2, 1)
    paged = make_plan(load_spec(ROOT / "specs/h200_decode_d128_kv_e4m3.yaml"))
    assert (paged.spec.smem.stages, paged.co_resident_blocks) == (2, 2)   # 80.5 KiB: two fit (3 stages: one)
    assert split_blocks_per_sm(2, 64, 256) == 2      # B8 x 8 KV heads, 32k keys
    assert split_blocks_per_sm(2, 16, 256) == 1      # a small grid
    assert split_blocks_per_sm(2, 64, 32) == 1       # a short cache
    assert num_splits_for(e4m3, 64, 256, 132) == 4   # H200: 146 us against 168 in 2 slices
    assert num_splits_for(fp16, 64, 256, 132) == 1   # one block per SM streams a 16-bit cache unsplit
    # B16 x 8 KV heads: the in-flight rule (one block per SM) would leave it unsplit; two per SM: 2 slices
    assert num_splits_for(e4m3, 128, 256, 132) == 2
    assert [split_blocks_per_sm(2, b, t) for b, t in ((31, 64), (32, 64), (32, 63))] == [1, 2, 1]


def test_no_split_where_a_call_has_one_tile_or_one_split_allowed():
    for merges in (False, True):
        assert num_splits(8, 1, 132, 1, 128, least_slice_cost=merges) == 1
        assert num_splits(8, 64, 132, 1, 1, least_slice_cost=merges) == 1


def interleaved_walk(first_tile: int, end: int, splits: int, split: int) -> list[int]:
    """The tiles split `split` reads with split_tiles: interleaved, as the split kernel walks them (first, count
    from interleaved_count, tile i = first + i x num_splits)."""
    first = first_tile + split
    count = (end - first + splits - 1) // splits if first < end else 0
    return [first + i * splits for i in range(count)]


@pytest.mark.parametrize("n_tiles,splits,left", [(1, 1, 0), (7, 3, 0), (16, 16, 0), (5, 8, 0), (100, 7, 13),
                                                 (256, 16, 0), (3, 5, 2)])
def test_interleaved_splits_read_every_tile_once(n_tiles, splits, left):
    walks = [interleaved_walk(left, n_tiles, splits, s) for s in range(splits)]
    tiles = sorted(t for w in walks for t in w)
    assert tiles == list(range(left, n_tiles))
    assert max(map(len, walks)) - min(map(len, walks)) <= 1   # as even as contiguous slices


def test_split_tiles_interleaved_renders_every_num_splits_th_tile():
    """split_tiles: interleaved walks tiles s, s + num_splits, ... and leaves tiles_per_split out of Params; the
    default (slices) renders as before, one tile after another from s x tiles_per_split."""
    from attngen.render import render_bundle
    data = yaml.safe_load(D128.read_text())
    data.pop("cells"), data.pop("dtypes")
    plan, sources, _ = render_bundle(parse_spec(yaml.safe_dump({**data, "dtype": "fp16", "split_tiles": "interleaved"})))
    split = sources[0]
    assert plan.interleaved_splits and "tiles_per_split" not in [f.name for f in plan.abi.fields]
    for text in ("const int count = interleaved_count(first, n_tiles, p.num_splits);",
                 "load_kv(smem, smem_addr, p, c, first + (i + kStages - 1) * p.num_splits,",
                 "const int key0 = (first + (i) * p.num_splits) * kBlockN + key_w0;",
                 "tile_entries(p, c, first + (i + kStages) * p.num_splits, tid)"):
        assert text in split, text
    assert "tiles_per_split" not in split
    assert "split s takes tiles s, s + num_splits" in explain(plan)
    slices = (ROOT / "generated" / "h200_decode_d128_split.cu").read_text()
    assert "interleaved_count" not in slices and "first + i + kStages - 1" in slices
    assert "c.split * p.tiles_per_split" in slices


@pytest.mark.nvcc
def test_a_paged_merging_cell_compiles_its_rows_functions():
    """No shipped paged cell merges in its split kernel with combine: auto or two rows a warp, so none compiles
    `none_merging_rows` or the two-row merge's rows path: a paged d128 bf16 cell with combine: auto and merge_rows: 2
    (written here), rendered and compiled for sm_90: every function of its plan, none spilling."""
    from attngen.compile import compile_source
    from attngen.render import render_bundle
    data = {k: v for k, v in yaml.safe_load(D128.read_text()).items() if k not in ("cells", "dtypes")}
    data |= {"name": "t_decode_d128_paged_pairs", "dtype": "bf16", "combine": "auto", "merge_rows": 2}
    plan, sources, _ = render_bundle(parse_spec(yaml.safe_dump(data), "t_decode_d128_paged_pairs.yaml"))
    assert plan.step_rows and [key for key, _ in plan.parts[0].functions] == [
        "none", "causal", "none_merging", "causal_merging", "none_rows", "none_merging_rows"]
    assert "combine_rows<2, kStepRows>(p, pair, 2, rows, tid % 32);" in sources[0]
    functions = compile_source(sources[0], "sm_90").functions
    assert sorted(f.name for f in functions) == sorted(name for _, name in plan.parts[0].functions)
    assert not any(f.spills for f in functions), [(f.name, f.spill_stores) for f in functions]
