"""The backward kind without a GPU: kind selection, the plan of its three-part bundle, the Params
the gradients add, its rules, and (with nvcc) its kernels compiling without spills."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from attngen.core.backward_plan import row_grid, rows_per_row_block
from attngen.errors import SpecError
from attngen.explain import explain
from attngen.kinds import kind_for_data, kind_of
from attngen.plan import make_plan
from attngen.spec import load_spec, parse_spec

ROOT = Path(__file__).resolve().parent.parent
D128 = ROOT / "specs" / "h100_bwd_d128.yaml"
L4 = ROOT / "specs" / "l4_bwd_d64.yaml"


def test_backward_key_picks_the_kind():
    data = yaml.safe_load(D128.read_text())
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
    # 8 warps x 16 keys, query blocks of 128 in 4 chunks of 32; each warp adds 16 rows x all of dQ
    assert (f.chunk_tiles, f.chunks, f.d_tiles, f.dq_m_tiles, f.dq_d_pairs, f.ds_pitch, f.accumulators) == (
        4, 4, 16, 1, 8, 272, 144)
    text = explain(p)
    assert "dQ: fp32 atomic adds" in text and "dS^T" in text


def test_dq_warp_grid_and_query_stages():
    from attngen.kinds.bwd_mma import dq_warp_grid
    assert dq_warp_grid(64, 8) == (4, 2) and dq_warp_grid(128, 8) == (8, 1) and dq_warp_grid(64, 4) == (4, 1)
    p = make_plan(load_spec(ROOT / "specs" / "h100_bwd_d64.yaml"))
    regions = {r.name: r for r in p.regions}
    assert p.fragments.query_stages == 2
    assert p.fragments.query_stage_bytes == regions["q1"].offset - regions["q"].offset == \
        regions["do1"].offset - regions["do"].offset > 0


def test_l4_spec_fits_the_default_budget():
    p = make_plan(load_spec(L4))
    assert not p.smem_dynamic and p.smem_bytes <= 48 * 1024


def test_row_kernels_cover_every_row():
    assert rows_per_row_block(64) == 16 and rows_per_row_block(128) == 8
    assert row_grid(128, 2, 3, 17) == (3, 3, 2)


@pytest.mark.parametrize("change, key", [
    ({"tile": {"block_m": 64, "block_n": 32}}, "tile.block_n"),           # 8 warps own 128 keys
    ({"tile": {"block_m": 96, "block_n": 128}}, "warps.compute"),         # 6 row fragments over 8 warps
    ({"tile": {"block_m": 64, "block_n": 256}, "warps": {"compute": 16}}, "warps.compute"),   # too few registers
    ({"head_dim_v": 64}, "head_dim_v"),
    ({"tile": {"block_m": 48, "block_n": 128}}, "tile.block_m"),          # not whole chunks of 32 queries
    ({"head_dim": 96}, "head_dim"),
    ({"masks": ["expr"], "variant": {"mask": "kv_idx <= q_idx"}}, "variant"),
    ({"varlen": True, "masks": ["none", "window"]}, "varlen"),            # the varlen call takes none / causal
    ({"smem": {"stages": 2, "async_copy": True, "opt_in": True}}, "smem.stages"),
    ({"warps": {"producer": 1, "consumer": 4}}, "warps"),
])
def test_rules_refuse_what_is_not_generated(change, key):
    data = yaml.safe_load(D128.read_text()) | change
    with pytest.raises(SpecError) as info:
        make_plan(parse_spec(yaml.safe_dump(data), file="b.yaml"), file="b.yaml")
    assert info.value.key == key, str(info.value)


@pytest.mark.nvcc
@pytest.mark.parametrize("spec", [D128, L4], ids=["h100_d128", "l4_d64"])
def test_kernels_compile_without_spills(spec):
    from attngen.compile import compile_source
    from attngen.render import render_spec_file
    r = render_spec_file(spec)
    for part, (name, source) in zip(r.plan.parts, r.files):
        res = compile_source(source, r.plan.compile_arch(r.plan.target.arch))
        assert res.functions and not any(f.spills for f in res.functions), (name, res.functions)


def test_varlen_spec_adds_varlen_functions_with_their_deterministic_twins():
    p = make_plan(load_spec(ROOT / "specs" / "h100_bwd_d64_varlen.yaml"))
    keys = [k for k, _ in p.parts[0].functions]
    assert keys == ["none", "causal", "none_varlen", "causal_varlen", "none_deterministic", "causal_deterministic",
                    "none_varlen_deterministic", "causal_varlen_deterministic"]
    assert p.varlen and [p.key_mask(k) for k in keys] == ["none", "causal"] * 4
    assert [p.body(k) for k in keys] == ["attention_backward"] * 2 + ["attention_backward_varlen"] * 2 + \
        ["attention_backward"] * 2 + ["attention_backward_varlen"] * 2
    assert [p.takes_turns(k) for k in keys] == [False] * 4 + [True] * 4
    names = {f.name for f in p.abi.fields}
    assert {"cu_seqlens_q", "cu_seqlens_k", "seq_order", "total_q", "total_k", "errors"} <= names
    plain = make_plan(load_spec(ROOT / "specs" / "h100_bwd_d64.yaml"))
    assert not plain.varlen and "cu_seqlens_q" not in {f.name for f in plain.abi.fields}
