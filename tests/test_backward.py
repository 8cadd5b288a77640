"""The backward kinds without a GPU: kind selection, the plan of their three-part bundles, the Params
the gradients add, their rules, the register-order layout of the wgmma kind's dQ accumulator (the
main kernel's adds and the convert kernel's reads must be inverses), and (with nvcc) a one-warpgroup
tile compiling without spills. Every committed backward spec's compile (no spills, shared memory as
planned) is tests/test_compile.py's, one spec of each kind by default and all under -m exhaustive."""
from __future__ import annotations

from pathlib import Path


import pytest
import yaml

from attngen.core.backward_plan import ACCUM_FRAGMENT_ROWS
from attngen.core.launch_rules import accum_rows, lanes_per_row, row_grid, rows_per_row_block
from attngen.errors import SpecError
from attngen.explain import explain
from attngen.kinds import kind_for_data, kind_of
from attngen.plan import make_plan
from attngen.spec import load_spec, parse_spec
from spec_sample import SPEC_PATHS, spec_text

ROOT = Path(__file__).resolve().parent.parent
D128 = ROOT / "specs" / "h100_bwd_d128.yaml"
L4 = ROOT / "specs" / "l4_bwd_d64.yaml"
WGMMA_D64 = ROOT / "specs" / "h100_bwd_d64_wgmma.yaml"
WGMMA_D128 = ROOT / "specs" / "h100_bwd_d128_wgmma.yaml"
WGMMA_D128_WINDOW = ROOT / "specs" / "h100_bwd_d128_wgmma_window.yaml"   # the mask with the most registers
WGMMA_D32 = ROOT / "specs" / "h100_bwd_d32_wgmma.yaml"
WGMMA_D96 = ROOT / "specs" / "h100_bwd_d96_wgmma.yaml"                 # 32-byte panels: 48 dQ columns per warpgroup
WGMMA_D256 = ROOT / "specs" / "h100_bwd_d256_wgmma.yaml"               # 2 warpgroups share 64 keys
WGMMA_D40 = ROOT / "specs" / "h100_bwd_d40_wgmma.yaml"                 # tiles padded to 48 columns
WGMMA_D192_V128 = ROOT / "specs" / "h100_bwd_d192_v128_wgmma.yaml"     # V of its own head dim (DeepSeek MLA)
WGMMA_D128_V64 = ROOT / "specs" / "h100_bwd_d128_v64_wgmma.yaml"


def test_backward_key_picks_the_kind():
    data = yaml.safe_load(spec_text(D128))
    assert kind_for_data(data).name == "bwd_mma"
    assert kind_for_data({k: v for k, v in data.items() if k != "backward"} | {"mma": "mma_m16n8k16"}).name == "fwd_mma"


def test_plan_is_a_three_part_bundle():
    p = make_plan(load_spec(D128))
    assert kind_of(p.spec).calls == "backward"
    main, pre, conv = p.parts
    assert [fn for _, fn in main.functions] == ["attngen_h100_bwd_d128_none", "attngen_h100_bwd_d128_causal",
                                                "attngen_h100_bwd_d128_none_deterministic",
                                                "attngen_h100_bwd_d128_causal_deterministic"]
    assert [p.takes_turns(k) for k, _ in main.functions] == [False, False, True, True]
    assert {p.key_mask(k) for k, _ in main.functions} == {"none", "causal"}
    assert pre.functions == (("preprocess", "attngen_h100_bwd_d128_preprocess"),)
    assert conv.functions == (("convert", "attngen_h100_bwd_d128_convert"),)
    assert (pre.threads, pre.static_smem, conv.threads, conv.static_smem) == (128, 0, 128, 0)
    assert p.entry_functions == {"none": "attngen_h100_bwd_d128_none", "causal": "attngen_h100_bwd_d128_causal",
                                 "none_deterministic": "attngen_h100_bwd_d128_none_deterministic",
                                 "causal_deterministic": "attngen_h100_bwd_d128_causal_deterministic"}
    names = [f.name for f in p.abi.fields]
    for field in ("dout", "dq", "dk", "dv", "dq_accum", "delta", "scale", "causal_offset", "dq_turns"):
        assert field in names
    assert "causal_from_end" not in names      # no varlen functions
    assert set(pre.reads) <= set(names) and set(conv.reads) <= set(names)
    f = p.fragments
    # 8 warps x 16 keys, query blocks of 128 in 4 chunks of 32; each warp adds 16 rows x all of dQ; dK and
    # dV 2 x 64 registers, S^T and dP^T 2 x 16
    assert (f.chunk_tiles, f.chunks, f.d_tiles, f.dq_m_tiles, f.dq_d_pairs, f.ds_pitch, f.accumulators) == (
        4, 4, 16, 1, 8, 272, 160)
    text = explain(p)
    assert "dQ: fp32 atomic adds" in text and "dS^T" in text


def test_dq_warp_grid_and_query_stages():
    from attngen.kinds.bwd_mma import dq_warp_grid
    assert dq_warp_grid(64, 8) == (4, 2) and dq_warp_grid(128, 8) == (8, 1) and dq_warp_grid(64, 4) == (4, 1)
    p = make_plan(load_spec(ROOT / "specs" / "lab" / "h100_bwd_d64.yaml"))
    regions = {r.name: r for r in p.regions}
    assert p.fragments.query_stages == 2
    assert p.fragments.query_stage_bytes == regions["q1"].offset - regions["q"].offset == \
        regions["do1"].offset - regions["do"].offset > 0


def test_warp_keys_32_splits_each_query_block_between_two_groups():
    p = make_plan(load_spec(ROOT / "specs" / "lab" / "h100_bwd_d64_k32.yaml"))
    f, regions = p.fragments, {r.name: r for r in p.regions}
    assert (f.warp_key_tiles, f.query_groups, f.chunks, f.chunk_tiles) == (2, 2, 2, 4)   # 64 queries a group
    # the groups sum dK and dV through every Q and dO stage: from Q to K
    assert f.group_scratch_bytes == 4 * 16384 and regions["k0"].offset - regions["q"].offset == 4 * 16384
    assert make_plan(load_spec(ROOT / "specs" / "lab" / "h100_bwd_d64.yaml")).fragments.group_scratch_bytes == 0
    text = explain(p)
    assert "2 groups of 4 warps of 32 keys" in text and "2 chunks of its group's 64 queries" in text
    assert any("the groups sum dK and dV" in line for line in p.schedule)
    # 64-query chunks would hold 256 fp32 accumulators (every function spilled); warps in pairs
    assert refused_key(ROOT / "specs" / "lab" / "h100_bwd_d64_k32.yaml", {"query_chunk": 64}) == "query_chunk"
    assert refused_key(ROOT / "specs" / "lab" / "h100_bwd_d64_k32.yaml",
                       {"tile": {"block_m": 64, "block_n": 48}, "warps": {"compute": 3}}) == "warps.compute"


def test_warp_split_columns_halves_dk_and_dv_and_adds_a_p_tile():
    p = make_plan(load_spec(ROOT / "specs" / "lab" / "h100_bwd_d128_k32.yaml"))
    f, regions = p.fragments, {r.name: r for r in p.regions}
    assert (f.warp_key_tiles, f.query_groups, f.column_groups, f.warp_d_tiles, f.d_tiles) == (2, 1, 2, 8, 16)
    # dK and dV 2 x 64 registers, S^T and dP^T 2 x 32
    assert f.accumulators == 192 and f.group_scratch_bytes == 0
    # the dQ step still covers every column: 8 warps of 16 rows x 8 column pairs
    assert 16 * f.dq_m_tiles * f.dq_row_warps == 128 and 16 * f.dq_d_pairs * (8 // f.dq_row_warps) == 128
    assert regions["pt"].bytes == regions["ds"].bytes and "pt" not in {r.name for r in make_plan(
        load_spec(ROOT / "specs" / "h100_bwd_d128.yaml")).regions}
    assert refused_key(ROOT / "specs" / "lab" / "h100_bwd_d64.yaml", {"warp_split": "columns"}) == "warp_split"


def test_l4_spec_fits_the_default_budget():
    p = make_plan(load_spec(L4))
    assert not p.smem_dynamic and p.smem_bytes <= 48 * 1024


def test_row_kernels_cover_every_row():
    assert rows_per_row_block(64) == 16 and rows_per_row_block(128) == 8
    assert row_grid(128, 2, 3, 17) == (3, 3, 2)
    # a row's lanes are a power of two (they sum by XOR shuffles): head_dim 96's 12 vectors take 16 lanes
    assert [lanes_per_row(d) for d in (32, 40, 64, 80, 96, 128, 192, 256)] == [4, 8, 8, 16, 16, 16, 32, 32]
    assert rows_per_row_block(96) == 8 and rows_per_row_block(32) == 32 and rows_per_row_block(256) == 4


def test_row_kernels_idle_the_lanes_past_a_row():
    """head_dim 96: 16 lanes per row, the last 4 read and write nothing; the power-of-two head dims
    render no idle lanes."""
    from attngen.render import render_spec_file
    r = render_spec_file(WGMMA_D96)
    pre, conv = (part.source for part in r.parts[1:])
    assert r.plan.fragments.row_lanes == 16
    assert "constexpr int kLanesPerRow = 16;" in pre and "if (row < p.seqlen_q && lane_reads) {" in pre
    assert "if (row >= p.seqlen_q || lane_in_row >= kRowVectors) return;" in conv
    plain = render_spec_file(WGMMA_D128)
    assert all("kRowVectors" not in part.source for part in plain.parts)


@pytest.mark.parametrize("change, key", [
    ({"tile": {"block_m": 64, "block_n": 32}}, "tile.block_n"),           # 8 warps own 128 keys
    ({"tile": {"block_m": 96, "block_n": 128}}, "tile.block_m"),          # dQ accumulator blocks of 64 rows
    ({"tile": {"block_m": 64, "block_n": 96}, "warps": {"compute": 6}}, "warps.compute"),   # 4 row fragments, 6 warps
    ({"tile": {"block_m": 64, "block_n": 256}, "warps": {"compute": 16}}, "warps.compute"),   # too few registers
    ({"head_dim_v": 64}, "head_dim_v"),
    ({"tile": {"block_m": 48, "block_n": 128}}, "tile.block_m"),          # not whole chunks of 32 queries
    ({"head_dim": 96}, "head_dim"),
    ({"masks": ["expr"], "variant": {"mask": "kv_idx <= q_idx"}, "varlen": True}, "variant"),   # padded only
    ({"varlen": True, "masks": ["none", "window"]}, "varlen"),            # the varlen call takes none / causal
    ({"smem": {"stages": 2, "async_copy": True, "opt_in": True}}, "smem.stages"),
    ({"warps": {"producer": 1, "consumer": 4}}, "warps"),
    ({"warp_keys": 32}, "warp_keys"),                                     # dK and dV of 32 keys at d128: 256 registers
])
def test_rules_refuse_what_is_not_generated(change, key):
    assert refused_key(D128, change) == key


def refused_key(spec: Path, change: dict) -> str:
    """The key of the SpecError that planning `spec` with `change` raises."""
    data = yaml.safe_load(spec_text(spec)) | change
    with pytest.raises(SpecError) as info:
        make_plan(parse_spec(yaml.safe_dump(data), file="b.yaml"), file="b.yaml")
    return info.value.key


@pytest.mark.nvcc
@pytest.mark.exhaustive
def test_one_warpgroup_kernels_compile(tmp_path):
    """The rules take one warpgroup (64 keys per block) and the sweep proposes it: its kernels build,
    deterministic staging included (its dQ share is the whole stage)."""
    from attngen.compile import compile_source
    from attngen.render import render_spec_file
    data = yaml.safe_load(spec_text(WGMMA_D64)) | {"name": "t_bwd_d64_one_warpgroup", "warps": {"compute": 4}}
    data["tile"] = {"block_m": 64, "block_n": 64}
    path = tmp_path / "t_bwd_d64_one_warpgroup.yaml"
    path.write_text(yaml.safe_dump(data))
    r = render_spec_file(path)
    assert r.plan.fragments.warpgroups == 1
    for name, source in r.files:
        res = compile_source(source, r.plan.compile_arch(r.plan.target.arch))
        assert res.functions and not any(f.spills for f in res.functions), (name, res.functions)


def test_varlen_spec_adds_varlen_functions_with_their_deterministic_twins():
    p = make_plan(load_spec(ROOT / "specs" / "lab" / "h100_bwd_d64_varlen.yaml"))
    keys = [k for k, _ in p.parts[0].functions]
    assert keys == ["none", "causal", "none_varlen", "causal_varlen", "none_deterministic", "causal_deterministic",
                    "none_varlen_deterministic", "causal_varlen_deterministic"]
    assert p.varlen and [p.key_mask(k) for k in keys] == ["none", "causal"] * 4
    assert [p.body(k) for k in keys] == ["attention_backward"] * 2 + ["attention_backward_varlen"] * 2 + \
        ["attention_backward"] * 2 + ["attention_backward_varlen"] * 2
    assert [p.takes_turns(k) for k in keys] == [False] * 4 + [True] * 4
    names = {f.name for f in p.abi.fields}
    assert {"cu_seqlens_q", "cu_seqlens_k", "seq_order", "total_q", "total_k", "errors"} <= names
    plain = make_plan(load_spec(ROOT / "specs" / "lab" / "h100_bwd_d64.yaml"))
    assert not plain.varlen and "cu_seqlens_q" not in {f.name for f in plain.abi.fields}


# -- the wgmma kind (backward: wgmma_dq_red) -------------------------------------------

def test_wgmma_backward_picks_its_kind():
    data = yaml.safe_load(spec_text(WGMMA_D128))
    assert kind_for_data(data).name == "bwd_wgmma"
    assert kind_for_data(data | {"backward": "dq_atomic", "mma": "mma_m16n8k16"}).name == "bwd_mma"


@pytest.mark.parametrize("path, block_m, dq_cols, panel_cols", [(WGMMA_D64, 128, 64, 32), (WGMMA_D128, 64, 64, 64),
                                                               (WGMMA_D32, 128, 32, 32), (WGMMA_D96, 64, 48, 16)])
def test_wgmma_plan_numbers(path, block_m, dq_cols, panel_cols):
    p = make_plan(load_spec(path))
    main, pre, conv = p.parts
    split = ["none_group_split", "causal_group_split"] if path in (WGMMA_D64, WGMMA_D128) else []
    assert [k for k, _ in main.functions] == ["none", "causal", "none_deterministic", "causal_deterministic", *split]
    assert (pre.template, conv.template) == ("lib/backward_preprocess.cu.j2", "lib/backward_convert.cu.j2")
    f = p.fragments
    d = p.head_dim
    assert p.block_m == block_m and f.dq_by_rows == (block_m == 128)
    assert (f.warpgroups, f.s_regs, f.d_regs, f.dq_cols, f.dq_regs) == (2, block_m // 2, d // 2, dq_cols, dq_cols // 2)
    assert (f.k_steps_d, f.k_steps_m, f.k_steps_n, f.panel_cols) == (d // 16, block_m // 16, 8, panel_cols)
    assert (f.column_groups, f.dkv_cols) == (1, d)
    assert (f.accum_row_block, f.accum_fragment_cols) == (block_m, dq_cols)
    regions = {r.name: r for r in p.regions}
    for name in ("q", "do", "q1", "do1", "k0", "v0", "ds"):
        assert regions[name].offset % 1024 == 0, name    # the swizzle pattern is on absolute addresses
    assert f.query_stage_bytes == regions["q1"].offset - regions["q"].offset == \
        regions["do1"].offset - regions["do"].offset
    assert "dq" not in regions   # dQ is added from registers; deterministic mode stages it in the step's Q / dO
    assert f.dq_regs * 4 * 128 <= f.query_stage_bytes // 2
    assert p.smem_bytes <= 227 * 1024 and p.arch_suffix == "a"
    text = explain(p)
    if d == 64:
        assert "red.global.add.v2.f32 per thread" in text and "register-pair order" in text
    else:
        assert "red.global.add.f32 per thread" in text and "register order" in text


def test_varlen_only_emits_the_varlen_functions_alone():
    """varlen: only (a cell the table serves for varlen calls alone): the main part's functions are the
    varlen ones and their deterministic twins, no padded function; varlen: true keeps both. A
    group-split function serves padded calls, so varlen: only refuses group_split by name."""
    only = make_plan(load_spec(ROOT / "specs" / "h100_bwd_d64_wgmma_varlen.yaml"))
    assert only.spec.varlen == "only" and not only.spec.padded
    assert [k for k, _ in only.parts[0].functions] == ["none_varlen", "causal_varlen", "none_varlen_deterministic",
                                                        "causal_varlen_deterministic"]
    both = make_plan(parse_spec(spec_text(ROOT / "specs" / "h100_bwd_d64_wgmma_varlen.yaml").replace(
        "varlen: only", "varlen: true")))
    assert [k for k, _ in both.parts[0].functions][:4] == ["none", "causal", "none_varlen", "causal_varlen"]
    with pytest.raises(SpecError, match="group-split functions serve padded GQA/MQA calls"):
        parse_spec(spec_text(ROOT / "specs" / "h100_bwd_d64_wgmma_varlen.yaml") + "group_split: true\n")


def test_wgmma_group_split_functions():
    """group_split (the d64 and d128 families but their varlen member): a group-split main function per mask
    (not deterministic, never varlen) and the convert part's kv_convert, which reads dk's and dv's
    fields; a spec without it has neither. The split count aims for GROUP_SPLIT_KEY_ROWS_PER_SM key rows
    per SM, where the balance it buys outweighs the sums' traffic."""
    from attngen.core.launch_rules import (GROUP_SPLIT_KEY_ROWS_PER_SM, GROUP_SPLIT_MIN_WAVES, GROUP_SPLIT_WHOLE_WAVES,
                                           group_split_pays, group_splits, kv_accum_floats)
    p = make_plan(load_spec(WGMMA_D128))
    main, _, conv = p.parts
    keys = [k for k, _ in main.functions if k.endswith("_group_split")]
    assert keys == ["none_group_split", "causal_group_split"] and p.group_split and p.fragments.group_split
    assert [p.key_mask(k) for k in keys] == ["none", "causal"] and not any(p.takes_turns(k) for k in keys)
    assert [p.body(k) for k in keys] == ["attention_backward_group_split"] * 2
    assert p.mask_cpp["causal_group_split"] == p.mask_cpp["causal"]
    assert [k for k, _ in conv.functions] == ["convert", "convert_pairs", "kv_convert"]   # full: register order
    assert [p.dq_convert(k) for k in ("none", "causal", "none_group_split", "causal_deterministic")] == \
        ["convert", "convert_pairs", "convert", "convert_pairs"]
    assert {"dk", "dv", "dk_row_stride", "dv_row_stride", "kv_heads", "seqlen_k", "batch"} <= set(conv.reads)
    window = make_plan(load_spec(WGMMA_D128_WINDOW))
    assert [k for k, _ in window.parts[0].functions if k.endswith("_group_split")] == ["window_group_split"]
    for other, converts in ((WGMMA_D96, ["convert"]), (ROOT / "specs" / "h100_bwd_d64_wgmma_varlen.yaml", ["convert_pairs"])):
        q = make_plan(load_spec(other))
        assert not q.group_split and [k for k, _ in q.parts[2].functions] == converts
        assert "dk" not in q.parts[2].reads
    with pytest.raises(SpecError, match="group_split"):
        parse_spec(spec_text(WGMMA_D128_V64) + "group_split: true\n")
    # 132 SMs, the shapes of docs/measurements/gqa_backward.py and their best measured split on the
    # H200 (docs/backward-h200/group_split_rule/: gqa_v2.json, and for the d256 group-4 cells
    # gqa_before_after.json, for Gemma's and Llama's shapes gqa_gemma.json and gqa_zoo_shapes.json;
    # "~": within 1.5 % of the best)
    tiles = {64: (128, 128), 128: (64, 128), 256: (64, 64)}   # the group-split specs' block_m, block_n

    def pick(batch, heads, kv_heads, seqlen, head_dim, causal=True):
        block_m, block_n = tiles[head_dim]
        return group_splits(heads // kv_heads, kv_heads, batch, seqlen, seqlen, 132, block_m=block_m,
                            block_n=block_n, head_dim=head_dim, uneven=causal)
    assert GROUP_SPLIT_KEY_ROWS_PER_SM * 132 // 128 == 1056 and GROUP_SPLIT_WHOLE_WAVES * 132 == 792
    assert GROUP_SPLIT_MIN_WAVES * 132 == 528
    assert pick(4, 32, 8, 4096, 128) == 1                     # 1024 blocks unsplit: best 2 ~ 1
    assert pick(2, 32, 4, 2048, 128) == 8 and pick(2, 32, 4, 2048, 128, False) == 1   # best 4 ~ 8; 1
    assert pick(2, 64, 4, 2048, 128) == 8                     # best 16 ~ 8
    assert pick(8, 16, 4, 2048, 128) == 2 and pick(8, 16, 2, 2048, 128) == 4   # best 2; 8 ~ 4
    assert pick(32, 16, 2, 512, 128) == 4                     # best 4
    assert pick(32, 16, 4, 512, 128) == 1                     # best 1: a split of 2 was 18 % slower
    assert pick(2, 64, 1, 2048, 64) == 32 and pick(2, 64, 1, 2048, 64, False) == 32   # best 32; 8 (32: 2 %)
    assert pick(2, 71, 1, 2048, 64) == 71
    assert pick(2, 16, 8, 1024, 128) == 1 and pick(2, 16, 8, 1024, 256) == 1   # best 1: 128 blocks to 256, 256 to 512
    assert pick(2, 8, 2, 190, 128) == 4 and pick(1, 16, 1, 190, 128) == 16   # a few blocks: within one wave
    assert pick(2, 32, 2, 1024, 128) == 16 and pick(2, 16, 2, 1024, 64) == 8   # 32 blocks: best 16; 4 ~ 8
    assert pick(32, 16, 2, 512, 256) == 4 and pick(8, 16, 2, 2048, 256) == 4   # best 4, 4
    assert pick(1, 16, 2, 16384, 256) == 4                    # best 4 ~ 2
    assert pick(8, 16, 4, 2048, 256) == 1 and pick(2, 16, 4, 8192, 256) == 1   # 1024 blocks: 2 was 2.2, 1.7 % slower
    assert pick(2, 16, 16, 2048, 128) == 1 and pick(4, 64, 8, 8192, 128) == 1   # MHA; a grid of 2048 blocks
    assert pick(0, 16, 4, 512, 128) == 1 and pick(2, 16, 4, 0, 128) == 1      # no blocks
    # the guard alone: the cut of a 32-step walk in two (8 steps) against 4 x 64 MiB over 132 SMs
    assert not group_split_pays(2, 32, 64 << 20, 132) and group_split_pays(4, 64, 64 << 20, 132)
    assert kv_accum_floats(2, 4, 100, 128) == 2 * 2 * 4 * 100 * 128


def test_wgmma_warpgroups_sharing_64_keys_split_dk_and_dv_by_columns():
    """head_dim 256: blocks of 64 keys; warpgroup w computes S^T and dP^T of the block's queries
    [32w, 32w + 32) only (no product computed twice) and stores its P^T and dS^T into the step's tiles;
    each holds dK and dV of 128 columns (all 256 would take 256 registers), made from both tiles (wgmma
    SS, A K-major); dQ is split by columns as at d128. Planning is the same at d128 (a rule choice, not
    a head-dim case)."""
    from attngen.render import render_spec_file
    r = render_spec_file(WGMMA_D256)
    p, f = r.plan, r.plan.fragments
    assert (p.block_m, p.block_n, f.warpgroups, f.column_groups, f.dkv_cols) == (64, 64, 2, 2, 128)
    assert (f.d_regs, f.s_cols, f.s_regs, f.dq_cols, f.dq_regs, f.k_steps_n) == (64, 32, 16, 128, 64, 4)
    assert p.smem_bytes <= 227 * 1024 and {"p", "p1", "ds", "ds1"} <= {g.name for g in p.regions}
    main = r.parts[0].source
    assert "const int key0 = kKeysPerWarpgroup * (warpgroup / kColGroups);" in main
    assert "mn_major_desc<kBlockM>(sY, col0, kc)" in main and "const int col0 = kDkvCols * column_group();" in main
    assert "k_major_desc<kBlockM>(sY, kSQueries * column_group(), kk)" in main and "wgmma_ss_m64n32(" in main
    assert "wgmma_ss_m64n128_kmn(acc, k_major_desc<kBlockN>(sA, 0, kc)" in main and "wgmma_rs_m64n" not in main
    assert "store_tile(sP, pa, " in main and "store_tile(sDS, da, " in main
    assert "kSQueries * column_group() + acc_col(v, lane)" in main
    assert "chunk = chunk0 + c % kWarpChunks" in main
    d128 = render_spec_file(WGMMA_D128).parts[0].source
    assert "kDkvCols" not in d128 and "kSmem_p" not in d128 and "wgmma_rs_m64n128(" in d128
    shared = yaml.safe_load(spec_text(WGMMA_D128)) | {"tile": {"block_m": 64, "block_n": 64}}
    g = make_plan(parse_spec(yaml.safe_dump(shared), file="b.yaml"), file="b.yaml").fragments
    assert (g.column_groups, g.dkv_cols, g.d_regs) == (2, 64, 32)


def test_wgmma_head_dim_40_pads_the_tiles_to_48_columns():
    """head_dim 40: Q, K, V and dO tiles of 48 columns (3 k16 steps, 32-byte panels), zeros past column
    40 (cp.async's for K and V; TMA's for Q and dO); dQ of all 48 columns per warpgroup (query blocks
    of 128), of which the first 40 are added: the accumulator is head_dim wide, as the runtime makes it."""
    from attngen.render import render_spec_file
    r = render_spec_file(WGMMA_D40)
    p, f = r.plan, r.plan.fragments
    assert (p.head_dim, f.tile_dim, f.k_steps_d, f.dkv_cols, f.dq_cols, f.dq_by_rows) == (40, 48, 3, 48, 48, True)
    assert (f.accum_fragment_cols, f.panel_cols, f.row_lanes) == (40, 16, 8)
    assert {r.name: r.cols * r.rows // p.block_m for r in p.regions}["q"] == 48
    main = r.parts[0].source
    assert "constexpr int kTileDim = 48;" in main and "constexpr int kChunksPerRow = 5;" in main
    assert "copy_panels_async<kBlockN, kChunksPerRow, kTileDim / 8>(smem_addr + kSmem_k0" in main
    assert "const bool valid = row0 + row < rows_valid && chunk < kRowChunks;" in main
    assert "kTileDim" not in render_spec_file(WGMMA_D64).parts[0].source
    # dQ split by columns would leave a warpgroup 24 columns; the padded tile must be whole panels
    assert refused_key(WGMMA_D40, {"tile": {"block_m": 64, "block_n": 128}}) == "head_dim"
    assert refused_key(WGMMA_D40, {"smem": {"swizzle": {"xor_bits": 2, "row_shift": 1}, "async_copy": True,
                                            "opt_in": True}}) == "head_dim"
    one = yaml.safe_load(spec_text(WGMMA_D40)) | {"warps": {"compute": 4}, "tile": {"block_m": 64, "block_n": 64}}
    assert make_plan(parse_spec(yaml.safe_dump(one), file="b.yaml"), file="b.yaml").fragments.dq_cols == 48


@pytest.mark.parametrize("path, dkv, dkv_v, groups", [(WGMMA_D192_V128, 96, 64, 2), (WGMMA_D128_V64, 128, 64, 1)])
def test_wgmma_head_dim_v_gives_v_its_own_columns(path, dkv, dkv_v, groups):
    """head_dim_v: V, dO and dV have their own columns (S^T over head_dim, dP^T over head_dim_v, dK of
    head_dim columns, dV of head_dim_v); deterministic dQ waits in a region of its own, the step's Q and
    dO tiles holding less than the warpgroups' dQ; the preprocess reads O and dO by their columns."""
    from attngen.render import render_spec_file
    r = render_spec_file(path)
    p, f = r.plan, r.plan.fragments
    dv = p.spec.head_dim_v
    assert p.head_dim_v == dv and p.v_dim == dv and f.head_dim_v == dv and f.tile_dim == 0
    assert (f.column_groups, f.dkv_cols, f.dkv_cols_v, f.d_regs, f.d_regs_v) == (groups, dkv, dkv_v, dkv // 2, dkv_v // 2)
    assert (f.k_steps_d, f.k_steps_dv, f.dq_staging) == (p.head_dim // 16, dv // 16, True)
    regions = {r.name: r for r in p.regions}
    assert regions["do"].bytes * p.head_dim == regions["q"].bytes * dv and regions["v0"].bytes * p.head_dim == \
        regions["k0"].bytes * dv
    assert regions["dqs"].bytes == f.warpgroups * 64 * f.dq_cols * 4 and p.smem_bytes <= 227 * 1024
    main, pre, _ = (part.source for part in r.parts)
    dv_wgmma = f"wgmma_ss_m64n{dkv_v}_kmn(" if groups > 1 else f"wgmma_rs_m64n{dkv_v}("   # shared keys: P^T's tile
    assert "issue_keys_by_queries<kKStepsDV>(dp, sV, key0, sDO);" in main and dv_wgmma in main
    assert "mbarrier_arrive_expect_tx(bar, kQueryTileBytes + kDoTileBytes);" in main
    assert "add_dq<kMask, kDeterministic>(dq, per_step(smem_addr + kSmem_dqs)" in main
    assert "copy_panels_async<kBlockN, kChunksPerRowV, kChunksPerRowV>(smem_addr + kSmem_v0" in main
    assert f"constexpr int kVectorsV = {dv} / 8;" in pre and "lane_in_row < kVectorsV" in pre
    assert "kHeadDimV" not in render_spec_file(WGMMA_D128).parts[0].source


@pytest.mark.parametrize("change, key", [
    ({"head_dim_v": 256}, "head_dim_v"),                                 # wider than head_dim
    ({"head_dim_v": 72}, "head_dim_v"),                                  # k16 steps of dP^T
    ({"head_dim_v": 128, "varlen": True}, "head_dim_v"),                 # padded calls only
    ({"head_dim_v": 160}, "smem.swizzle"),                               # 80 dV columns per warpgroup
])
def test_wgmma_head_dim_v_rules(change, key):
    assert refused_key(WGMMA_D192_V128, change) == key


def test_accumulator_rows_round_up_to_query_blocks():
    p = make_plan(load_spec(WGMMA_D128))
    assert accum_rows(p, 1) == 64 and accum_rows(p, 64) == 64 and accum_rows(p, 65) == 128
    assert row_grid(128, 2, 3, accum_rows(p, 65)) == (16, 3, 2)
    p = make_plan(load_spec(WGMMA_D64))   # query blocks of 128
    assert accum_rows(p, 1) == 128 and accum_rows(p, 128) == 128 and accum_rows(p, 129) == 256


def staged_index(v: int, tid: int, pairs: bool = True) -> int:
    """Where the main kernel adds register v of warpgroup thread tid, from its share's start (add_dq):
    register-pair order (bwd_wgmma: pair v / 2 of each thread, 8 bytes), or register order (bwd_mma)."""
    return (v // 2 * 128 + tid) * 2 + (v & 1) if pairs else v * 128 + tid


def accumulator_position(v: int, tid: int) -> tuple[int, int]:
    """(row, column) of register v of warpgroup thread tid in an m64 wgmma accumulator."""
    warp, lane = tid // 32, tid % 32
    return 16 * warp + lane // 4 + 8 * ((v >> 1) & 1), 8 * (v >> 2) + 2 * (lane % 4) + (v & 1)


def convert_reads(r: int, c: int, fragment_cols: int, pairs: bool = True) -> list[int]:
    """The offsets the convert kernel reads for columns c..c+7 of row r of a block, as in
    lib/backward_convert.cu.j2, in column order: register-pair order's two float4 loads of 32
    contiguous bytes, or register order's two (even columns, then odd)."""
    v = 4 * (c % fragment_cols // 8) + 2 * (r % 16 // 8)
    t = r // 16 * 32 + r % 8 * 4
    base = c // fragment_cols * 64 * fragment_cols
    if pairs:
        return [base + v * 128 + 2 * t + i for i in range(8)]
    even = [base + v * 128 + t + i for i in range(4)]
    odd = [base + (v + 1) * 128 + t + i for i in range(4)]
    return [x for pair in zip(even, odd) for x in pair]


@pytest.mark.parametrize("d, warpgroups, by_rows", [(64, 2, False), (128, 2, False), (128, 1, False), (64, 2, True),
                                                     (32, 2, True), (96, 2, False), (256, 2, False), (40, 2, True),
                                                     (80, 2, True), (160, 2, False), (192, 2, False)])
@pytest.mark.parametrize("pairs", [True, False], ids=["register-pair order", "register order"])
def test_convert_reads_what_the_main_kernel_added(d, warpgroups, by_rows, pairs):
    """Warpgroup w adds its dQ (add_dq) at w x its share's size in the query block's accumulator:
    columns [w cols, (w + 1) cols) of 64 rows, or (by rows) rows [64 w, 64 w + 64) at every column.
    The convert reads each 64-row block from (row - row % 64) x d."""
    cols = d if by_rows else d // warpgroups
    rows = 64 * warpgroups if by_rows else 64
    where = {}
    for w in range(warpgroups):
        for tid in range(128):
            for v in range(cols // 2):
                row, col = accumulator_position(v, tid)
                at = (64 * w + row, col) if by_rows else (row, w * cols + col)
                where[at] = w * 64 * cols + staged_index(v, tid, pairs)
    assert len(where) == rows * d and sorted(where.values()) == list(range(rows * d))   # a bijection
    for r in range(rows):
        for c in range(0, d, 8):
            reads = [r // 64 * 64 * d + x for x in convert_reads(r % 64, c, cols, pairs)]
            assert reads == [where[(r, c + j)] for j in range(8)], (r, c)


def test_convert_template_matches_the_model():
    """The formulas the convert template renders are the ones test_convert_reads_what_the_main_kernel_staged checks."""
    text = (ROOT / "templates" / "lib" / "backward_convert.cu.j2").read_text()
    assert "const int v = 4 * (c % kFragmentCols / 8) + 2 * (r % 16 / 8), t = r / 16 * 32 + r % 8 * 4;" in text
    assert "const int r = {{ at }} % kFragmentRows, c = lane_in_row * 8;" in text
    assert "kFragmentRows = {{ plan.fragments.accum_fragment_rows }};" in text and ACCUM_FRAGMENT_ROWS == 64
    assert "+ {{ at }} - r)" in text and "+ c / kFragmentCols * kFragmentRows * kFragmentCols;" in text
    assert "store_scaled_8(dq_row, block + v * 128 + 2 * t, p.scale);" in text
    # ... the 8 floats in column order: c, c + 1 from a.x, a.y; ...; c + 6, c + 7 from b.z, b.w (convert_reads)
    assert ("const float4 a = reinterpret_cast<const float4*>(src)[0], b = reinterpret_cast<const float4*>(src)[1];"
            in text)
    assert ("y[0] = from_float2(a.x * x, a.y * x);\n    y[1] = from_float2(a.z * x, a.w * x);\n"
            "    y[2] = from_float2(b.x * x, b.y * x);\n    y[3] = from_float2(b.z * x, b.w * x);"
            in text.split("void store_scaled_8(")[1])
    from attngen.render import render_spec_file

    def convert_of(path):
        return next(part.source for part in render_spec_file(path).parts if part.name == "convert")
    # head_dim 64 (dq_pair_masks: every mask): register-pair order; staged_index: pair v / 2 of thread t at
    # (v / 2 x 128 + t) x 2, i.e. v x 128 + 2 t for even v
    assert "block + v * 128 + 2 * t" in convert_of(WGMMA_D64) and "block + (v + 1) * 128 + t" not in convert_of(WGMMA_D64)
    pairs = render_spec_file(WGMMA_D64).parts[0].source
    assert "float* dst = st.dq_accum + warpgroup * (kDqRows * kDqCols) + 2 * wg_tid;" in pairs
    assert "for (int v = 0; v < kDqRegs; v += 2) red_add_pair(dst + v * kWarpgroupThreads, dq[v], dq[v + 1]);" in pairs
    assert '"r"(staging + 4 * (v * kWarpgroupThreads + 2 * wg_tid)), "f"(dq[v]), "f"(dq[v + 1])' in pairs
    assert "red_add(" not in pairs
    # head_dim 128: register-pair order but for the full mask (convert, convert_pairs; kDqPairs in the main part)
    assert "void convert(" in convert_of(WGMMA_D128) and "void convert_pairs(" in convert_of(WGMMA_D128)
    assert "block + (v + 1) * 128 + t" in convert_of(WGMMA_D128) and "2 * t" in convert_of(WGMMA_D128)
    mixed = render_spec_file(WGMMA_D128).parts[0].source
    assert "constexpr bool kDqPairs = kMask == Mask::Causal;" in mixed
    assert "if constexpr (kDqPairs<kMask>) {" in mixed and "red_add(dst + v * kWarpgroupThreads, dq[v]);" in mixed
    # the other head dims: register order, one float per add
    assert "block + (v + 1) * 128 + t" in convert_of(WGMMA_D96) and "2 * t" not in convert_of(WGMMA_D96)
    main = render_spec_file(WGMMA_D96).parts[0].source
    assert "float* dst = st.dq_accum + warpgroup * (kDqRows * kDqCols) + wg_tid;" in main
    assert "red_add(dst + v * kWarpgroupThreads, dq[v]);" in main and "red_add_pair(dst" not in main
    assert "kDqPairs" not in main
    # deterministic mode: the same order staged in the stage's tiles, warpgroup w's share from w x its size
    for source in (pairs, main):
        assert "const uint32_t staging = stage_base + warpgroup * kBytes;" in source
        assert "bulk_reduce_add(st.dq_accum + warpgroup * (kBytes / 4), staging, kBytes);" in source
    assert '"r"(staging + 4 * (v * kWarpgroupThreads + wg_tid)), "f"(dq[v])' in main
    # head_dim 40 (tiles of 48 columns): a warpgroup adds the registers of its first 40 columns only, so
    # the accumulator's blocks are 64 x 40 (test_convert_reads_what_the_main_kernel_added, fragment_cols 40)
    padded = render_spec_file(WGMMA_D40).parts[0].source
    assert "float* dst = st.dq_accum + warpgroup * (kDqRows * kDqAccumCols) + wg_tid;" in padded
    assert "for (int v = 0; v < kDqAccumRegs; ++v) red_add(dst + v * kWarpgroupThreads, dq[v]);" in padded
    assert "constexpr int kBytes = kDqRows * kDqAccumCols * 4;" in padded


def test_dq_pair_masks_by_head_dim():
    """dq_pair_masks: measured at 64, 128 and 256; 64 gained with every mask, 128 with all but none."""
    from attngen.kinds.bwd_wgmma import dq_pair_masks
    assert [dq_pair_masks(load_spec(p)) for p in (WGMMA_D32, WGMMA_D64, WGMMA_D96, WGMMA_D128, WGMMA_D128_WINDOW)] == \
        [(), ("none", "causal"), (), ("causal",), ("window",)]


@pytest.mark.parametrize("change, key", [
    ({"tile": {"block_m": 128, "block_n": 128}}, "tile.block_m"),     # d128: dK, dV, S^T, dP^T take 296 registers
    ({"tile": {"block_m": 256, "block_n": 128}}, "tile.block_m"),     # 64 or 64 x warpgroups
    ({"tile": {"block_m": 64, "block_n": 192}}, "tile.block_n"),         # 2 warpgroups own 128 keys or share 64
    ({"warps": {"compute": 12}, "tile": {"block_m": 64, "block_n": 192}}, "warps.compute"),
    ({"head_dim": 72}, "head_dim"),                                      # k16 steps
    ({"head_dim": 96}, "smem.swizzle"),                                  # not whole 64-column panels
    ({"head_dim": 256}, "tile.block_m"),                                 # 64 keys per warpgroup: 256 + 64 + margin
    ({"head_dim": 256, "tile": {"block_m": 128, "block_n": 64}}, "smem"),   # shared keys, 128 queries: 2 stages of
                                                                         # Q and dO tiles past the budget
    ({"head_dim": 96, "smem": {"swizzle": {"xor_bits": 2, "row_shift": 1}, "async_copy": True, "opt_in": True}},
     "smem.swizzle"),                                                    # 48 dQ columns per warpgroup
    ({"head_dim": 64}, "smem.swizzle"),                                  # 32 dQ columns per warpgroup
    ({"masks": ["expr"], "variant": {"mask": "kv_idx <= q_idx"}, "varlen": True}, "variant"),   # padded only
    ({"target": "l4", "smem": {"swizzle": {"xor_bits": 3}, "async_copy": True, "opt_in": True}}, "target"),
    ({"smem": {"swizzle": {"xor_bits": 3}, "async_copy": True}}, "smem.opt_in"),
    ({"warps": {"producer": 4, "consumer": 8}}, "warps"),
])
def test_wgmma_rules_refuse_what_is_not_generated(change, key):
    assert refused_key(WGMMA_D128, change) == key


def test_wgmma_varlen_takes_the_variants():
    """The wgmma backward's varlen functions take a window and score modifiers (each sequence narrows the
    mask's and the modifiers' fields, as the forward's do); the mma.sync backward's still refuse them."""
    for change in ({"varlen": True, "scores": ["softcap"]}, {"varlen": True, "masks": ["none", "causal", "window"]},
                   {"varlen": True, "scores": ["alibi"]}):
        data = yaml.safe_load(spec_text(WGMMA_D128)) | change
        plan = make_plan(parse_spec(yaml.safe_dump(data), file="b.yaml"), file="b.yaml")
        assert plan.varlen


def test_wgmma_query_blocks_of_128_refuse_varlen():
    """Query blocks of 128 (dQ by rows) are generated for padded calls: the varlen functions spill."""
    assert refused_key(WGMMA_D64, {"varlen": True}) == "tile.block_m"
    data = yaml.safe_load(spec_text(WGMMA_D64)) | {"varlen": True, "tile": {"block_m": 64, "block_n": 128}}
    assert make_plan(parse_spec(yaml.safe_dump(data), file="b.yaml"), file="b.yaml").varlen


@pytest.mark.parametrize("path", [p for p in SPEC_PATHS if p.name.startswith("h100_bwd_") and "_expr_" in p.name],
                         ids=lambda p: p.stem)
def test_expression_backward_renders_the_derivative_and_the_walk(path):
    """A score expression's backward multiplies dS by the expression's derivative (rendered from
    core/expressions.py derivative); a mask expression's classifies each (query block, key block)
    pair, masks partial ones key by key and narrows the walk (not in deterministic mode)."""
    from attngen.core.expressions import derivative, to_cuda
    from attngen.render import render_spec_file
    r = render_spec_file(path)
    main = r.parts[0].source
    x = r.plan.expression
    assert r.plan.kind.calls == "backward" and x is not None
    if x.score is not None:
        assert r.plan.expression_cuda.score_slope in main and "slope *= expr_score_slope(" in main
        assert r.plan.expression_cuda.score_slope == to_cuda(derivative(x.score), lambda n: n if n in (
            "q_idx", "kv_idx", "score") else f"e.{n}", lambda n, by: f"e.{n}")
    if x.mask is not None:
        assert r.plan.masks == ("expr",)
        assert "if constexpr (kMask == Mask::Expr && !kDeterministic) {" in main and "expr_rows_seeing(" in main
        assert "masked = masked || mods.masks_tile(n0);" in main and "mods.hides(" in main
    else:
        assert "expr_rows_seeing" not in main


@pytest.mark.parametrize("rows, warpgroups", [(80, 2), (48, 2), (80, 1)])
def test_transposed_convert_reads_what_the_main_kernel_added(rows, warpgroups):
    """dQ^T (query blocks of `rows`, no m64 wgmma's M): warpgroup w's register v of thread t is dQ at query
    = the accumulator's column, head-dim column 64 w + its row, added in register-pair order at
    w x 64 rows + (v / 2 x 128 + t) x 2 + (v & 1). The convert (lib/backward_convert.cu.j2, dq_transposed)
    reads columns 8 h .. 8 h + 7 x queries 8 n .. 8 n + 7 as 64 contiguous floats, [column % 8][query % 8],
    at (2 n + h % 2) x 256 + (h / 2) x 64 of the warpgroup's share (h: the 8-column run within it)."""
    d = 64 * warpgroups
    where = {}
    for w in range(warpgroups):
        for tid in range(128):
            for v in range(rows // 2):
                m, n = accumulator_position(v, tid)
                where[(n, 64 * w + m)] = w * 64 * rows + staged_index(v, tid, True)
    assert len(where) == rows * d and sorted(where.values()) == list(range(rows * d))   # a bijection
    for n in range(0, rows, 8):
        for h in range(d // 8):
            w, hw = h // 8, h % 8
            base = w * 64 * rows + (2 * (n // 8) + hw % 2) * 256 + hw // 2 * 64
            for col_in_run in range(8):
                for j in range(8):
                    assert where[(n + j, 8 * h + col_in_run)] == base + col_in_run * 8 + j


def test_transposed_cell_renders_dq_transposed():
    """h100_bwd_d128_wgmma_m80: dQ^T by wgmma (K^T MN-major, the dS^T tile in 32-byte panels), pairs for its
    mask, the convert's runs; the plan says why 80 rows and the launch record's convert is convert_pairs."""
    from attngen.core.launch_plan import LaunchPlan
    from attngen.render import render_spec_file
    rendered = render_spec_file(ROOT / "specs" / "h100_bwd_d128_wgmma_m80_bf16.yaml")
    f = rendered.plan.fragments
    assert f.dq_transposed and (f.dq_cols, f.dq_regs, f.s_cols, f.accum_fragment_rows) == (80, 40, 80, 80)
    assert (f.ds_panel_row_bytes, f.ds_descriptor_mode, f.pair_masks) == (32, 3, ("none",))
    main = next(p.source for p in rendered.parts if p.name == "main")
    assert "wgmma_ss_m64n80_mn(acc, mn_major_desc<kBlockN>(sK, col0, kk)," in main
    assert "ds_offset(row, 2 * kc + i / 2)" in main and "issue_dq(dq, sDS, sK, kDqRows * warpgroup);" in main
    convert = next(p.source for p in rendered.parts if p.name == "convert")
    assert "(2 * n + hw % 2) * 256 + hw / 2 * 64 + c * 8" in convert and "__shfl_xor_sync(0xffffffffu, mine, s)" in convert
    assert "__shared__ __align__" not in convert
    import json
    record = LaunchPlan.from_record(json.loads((ROOT / "generated" / "h100_bwd_d128_wgmma_m80_bf16.launch.json").read_text()))
    assert record.dq_convert("none") == "convert_pairs" == rendered.plan.dq_convert("none")


def test_transposed_convert_turns_each_run_round():
    """The convert's exchange (lib/backward_convert.cu.j2, dq_transposed), thread by thread: eight threads, thread
    c holding column c of a run at indices 0..7 (its queries); after the exchanges over bits 4, 2 and 1 thread c
    holds query c's row, column j at index j."""
    text = (ROOT / "templates" / "lib" / "backward_convert.cu.j2").read_text()
    assert ("const float mine = upper ? x[j] : x[j | s];" in text and "if (upper) x[j] = got;" in text
            and "else x[j | s] = got;" in text and "for (int s = 4; s >= 1; s /= 2) {" in text)
    x = [[("column", c, "query", j) for j in range(8)] for c in range(8)]
    for s in (4, 2, 1):
        for j in (j for j in range(8) if not j & s):
            mine = [x[c][j] if c & s else x[c][j | s] for c in range(8)]
            for c in range(8):
                got = mine[c ^ s]              # __shfl_xor_sync(..., mine, s)
                if c & s:
                    x[c][j] = got
                else:
                    x[c][j | s] = got
    assert x == [[("column", j, "query", c) for j in range(8)] for c in range(8)]
