"""fwd_wgmma on e4m3 (its dtype form) without a GPU: its rules, its plan (V^T tiles and maps, k32
steps, Params), the lane exchange that turns S accumulators into P's A registers (simulated against
the fragment layouts), and that the fp16 wgmma kernels do not carry its code."""
from __future__ import annotations

from pathlib import Path

import pytest

from attngen.errors import SpecError
from attngen.plan import make_plan
from attngen.spec import load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[1]
D128 = ROOT / "specs" / "h100_wgmma_d128_fp8.yaml"
D64 = ROOT / "specs" / "h100_wgmma_d64_fp8.yaml"


def text(block_n=128, extra="", head_dim=128, swizzle="{xor_bits: 3}"):
    return (f"schema: 1\nname: t\ntarget: h100\ndtype: e4m3\nhead_dim: {head_dim}\n"
            f"tile: {{block_m: 128, block_n: {block_n}}}\nwarps: {{producer: 4, consumer: 8}}\n"
            f"mma: wgmma_m64nNk16\nsmem: {{swizzle: {swizzle}, stages: 2, async_copy: true, opt_in: true}}\n"
            f"registers: {{producer: 24, consumer: 240}}\nschedule: {{overlap: true}}\n{extra}")


def test_plan_of_the_d128_spec():
    plan = make_plan(load_spec(D128))
    f = plan.fragments
    assert (f.k, f.mma_type, f.k_steps_qk, f.k_steps_pv) == (32, "e4m3", 4, 6)
    assert plan.ctype == "__nv_bfloat16" and f.p_log2_offset == 8
    # Q and K: one 128-byte panel of 128 e4m3 columns; V^T: 128 rows (head dim) of 192 keys in panels
    # of 64 keys (the widest swizzled row that tiles 192 bytes)
    assert (f.panel_cols, f.panels) == (128, 1)
    assert (f.vt.keys, f.vt.panels, f.vt.panel_bytes, f.vt.steps_per_panel) == (64, 3, 128 * 64, 2)
    v0 = plan.region("v0")
    assert v0.bytes == 128 * 192 and v0.pitch_bytes == 64
    assert f.v_tile_bytes == f.k_tile_bytes == 192 * 128
    v_map = next(m for m in plan.tensor_maps if m.tensor == "v")
    assert (v_map.box_rows, v_map.box_cols, v_map.swizzle, v_map.transposed) == (128, 64, "64B", True)
    names = [fl.name for fl in plan.abi.fields]
    assert {"q_descale", "k_descale", "v_descale", "tma_q", "tma_k", "tma_v"} <= set(names)
    assert not {"q", "k", "v", "q_row_stride", "v_row_stride"} & set(names)   # carried by the maps


def test_d64_takes_64_byte_panels():
    f = make_plan(load_spec(D64)).fragments
    assert (f.panel_row_bytes, f.panel_cols, f.k_steps_qk, f.vt.keys) == (64, 64, 2, 128)


@pytest.mark.parametrize("spec_text, key", [
    (text(block_n=80), "tile.block_n"),                    # not whole k32 steps
    (text(head_dim=80), "head_dim"),
    (text(extra="epilogue: tma\n"), "epilogue"),           # O leaves from the registers
    (text(extra="varlen: true\n"), "varlen"),
    (text(extra="masks: [window]\n"), "masks"),
    (text(extra="head_dim_v: 64\n"), "head_dim_v"),
    (text(swizzle="{xor_bits: 2, row_shift: 2}"), "smem.swizzle"),
])
def test_rules_refuse_what_the_kind_does_not_generate(spec_text, key):
    with pytest.raises(SpecError) as err:
        parse_spec(spec_text)
    assert err.value.key == key


def test_lane_exchange_gives_the_a_registers():
    """Simulate p_fragments' two shuffles on a quad for 16 keys of rows g and g + 8: lane t must end
    with keys 4t .. 4t + 3 of row g (register 0) and of row g + 8 (register 1), the A layout of an
    8-bit wgmma; the accumulators give lane t keys 2t, 2t + 1 (tile 0) and 8 + 2t, 9 + 2t (tile 1)."""
    def acc(t, tile, row, e):          # what accumulator (tile, row half, e) of lane t holds: (row, key)
        return (row, 8 * tile + 2 * t + e)

    def pack(t, tile):                 # pack4_e4m3(a0, a1, a2, a3): bytes row g e0 e1, row g+8 e0 e1
        return [acc(t, tile, 0, 0), acc(t, tile, 0, 1), acc(t, tile, 1, 0), acc(t, tile, 1, 1)]

    def byte_perm(x, y, selector):     # __byte_perm: bytes of x are 0..3, of y 4..7; nibble i picks byte i
        both = x + y
        return [both[(selector >> (4 * i)) & 7] for i in range(4)]

    # the template's per-lane choices
    offer1 = [0x7654 if t % 2 else 0x3210 for t in range(4)]
    offer2 = [0x3210 if t % 2 else 0x7654 for t in range(4)]
    row_g = [0x5410 if t < 2 else 0x1054 for t in range(4)]
    row_g8 = [0x7632 if t < 2 else 0x3276 for t in range(4)]
    offers1 = [byte_perm(pack(t, 0), pack(t, 1), offer1[t]) for t in range(4)]
    offers2 = [byte_perm(pack(t, 0), pack(t, 1), offer2[t]) for t in range(4)]
    for t in range(4):
        first = 2 * t if t < 2 else 2 * t - 3         # the template's source lanes
        second = 2 * t + 1 if t < 2 else 2 * t - 4
        got1, got2 = offers1[first], offers2[second]
        assert byte_perm(got1, got2, row_g[t]) == [(0, 4 * t + i) for i in range(4)]
        assert byte_perm(got1, got2, row_g8[t]) == [(1, 4 * t + i) for i in range(4)]


def test_template_lines_match_the_simulation():
    source = (ROOT / "generated" / "h100_wgmma_d128_fp8_n192c2ps3r24x240opbq2.cu").read_text()   # k_rows: in_order
    for line in ("(t < 2 ? 2 * t : 2 * t - 3)", "(t < 2 ? 2 * t + 1 : 2 * t - 4)", "t % 2 ? 0x7654u : 0x3210u",
                 "t % 2 ? 0x3210u : 0x7654u", "t < 2 ? 0x5410u : 0x1054u", "t < 2 ? 0x7632u : 0x3276u",
                 "const float a0 = value(a), a1 = value(a + 1), a2 = value(a + 2), a3 = value(a + 3);",
                 "pack4_e4m3(a0, a1, a2, a3)", "pack4_e4m3(b0, b1, b2, b3)", "const int b = a + 4;",
                 "wgmma.mma_async.sync.aligned.m64n192k32.f32.e4m3.e4m3", "p_shift"):
        assert line in source, line


@pytest.mark.parametrize("block_n", [64, 128, 192, 256])
def test_even_odd_k_rows_give_each_lane_its_a_registers_and_the_mask_its_keys(block_n):
    """k_rows: even_odd. Two copies that take every second key put the tile's even keys in K rows 0 .. N/2 - 1 and
    its odd keys after them; S column c then is key 2c or 2(c - N/2) + 1. Simulated for every lane and register:
    p_fragments' four values of each A register are keys 4t .. 4t + 3 of their 16 (row g, then row g + 8), and
    key_of_column gives every accumulator's key (the template's lines are checked below)."""
    n = block_n
    row_of_smem = [2 * r for r in range(n // 2)] + [2 * r + 1 for r in range(n // 2)]   # the key each K row holds
    s_regs = n // 2

    def acc(t, v):                     # accumulator v of lane t: (row half, key) through the K rows' order
        return ((v >> 1) & 1, row_of_smem[8 * (v >> 2) + 2 * t + (v & 1)])

    def key_of_column(j, e):           # the template's function
        return 16 * j + 2 * e if j < s_regs // 8 else 16 * (j - s_regs // 8) + 2 * e + 1

    for t in range(4):
        for v in range(s_regs):
            assert acc(t, v)[1] == 4 * t + key_of_column(v >> 2, v & 1)
        for kc in range(n // 32):
            for half in range(2):
                even = 4 * (2 * kc + half)
                odd = even + s_regs // 2
                regs = ([even + 0, odd + 0, even + 1, odd + 1], [even + 2, odd + 2, even + 3, odd + 3])
                for row, vs in enumerate(regs):
                    assert [acc(t, v) for v in vs] == [(row, 32 * kc + 16 * half + 4 * t + i) for i in range(4)]


def test_even_odd_k_rows_in_the_spec_the_map_and_the_kernel():
    from attngen.render import render_for
    spec = ROOT / "specs" / "h100_wgmma_d128_fp8.yaml"
    plan, source, _ = render_for(spec)
    assert plan.fragments.k_even_odd
    k_map = next(m for m in plan.tensor_maps if m.tensor == "k")
    assert (k_map.box_rows, k_map.row_stride) == (192, 2) and "one row in 2: 96 rows a copy" in k_map.describe()
    for line in ("return j < kSRegs / 8 ? 16 * j + 2 * e : 16 * (j - kSRegs / 8) + 2 * e + 1;",
                 "const int key0 = n0 + 4 * (lane % 4);", "const int key = key0 + key_of_column(j, e);",
                 "const int odd = even + kSRegs / 2;",
                 "const float g0 = value(even), g1 = value(odd), g2 = value(even + 1), g3 = value(odd + 1);",
                 "const float h0 = value(even + 2), h1 = value(odd + 2), h2 = value(even + 3), h3 = value(odd + 3);",
                 "pack4_e4m3(g0, g1, g2, g3)", "pack4_e4m3(h0, h1, h2, h3)",
                 "odd * (kBlockN / 2) * kPanelRowBytes", "at.k_row + t * kBlockN + odd"):
        assert line in source, line
    assert "__shfl_sync(0xffffffffu, __byte_perm(pair_a" not in source
    plain = make_plan(load_spec(ROOT / "specs" / "h100_wgmma_d128_fp8_n192c2ps3r24x240opbq2.yaml"))
    assert not plain.fragments.k_even_odd and next(m for m in plain.tensor_maps if m.tensor == "k").row_stride == 1


def test_fp16_wgmma_kernels_carry_none_of_it():
    source = (ROOT / "generated" / "h100_wgmma_d128_n128c2ps2r24x240pp.cu").read_text()
    for word in ("e4m3", "descale", "kVtPanel", "cuda_fp8.h", "p_shift"):
        assert word not in source, word
