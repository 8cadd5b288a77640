"""fwd_mma on e4m3 (its dtype form) without a GPU: its rules, its plan (Params, the V^T tile, bank report), the key
order of its K tile against the fragment layout, and the generated file's contents."""
from __future__ import annotations

from pathlib import Path

import pytest

from attngen.errors import SpecError
from attngen.kinds.fwd_mma.e4m3 import KEY_STEP, key_row, vt_swizzle
from attngen.plan import make_plan
from attngen.spec import load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[1]
D128 = ROOT / "specs" / "l4_mma_d128_fp8.yaml"


def fp8_text(head_dim=128, block_n=64, warps="{compute: 8}", smem="{swizzle: {xor_bits: 3}, stages: 2, async_copy: true}",
             extra=""):
    return (f"schema: 1\nname: t\ntarget: l4\ndtype: e4m3\nhead_dim: {head_dim}\ntile: {{block_m: 128, block_n: {block_n}}}\n"
            f"warps: {warps}\nmma: mma_m16n8k16\nsmem: {smem}\n{extra}")


def test_plan_of_the_d128_spec():
    plan = make_plan(load_spec(D128))
    names = [f.name for f in plan.abi.fields]
    assert names[-3:] == ["q_descale", "k_descale", "v_descale"]
    assert "transposed" in next(f.meaning for f in plan.abi.fields if f.name == "v")
    v0 = plan.region("v0")
    assert (v0.rows, v0.cols, v0.pitch_bytes) == (128, 64, 64)      # head_dim rows of block_n keys
    assert plan.region("q").pitch_bytes == 128                      # e4m3: a byte per element
    assert plan.smem_bytes == 48 * 1024 and plan.ctype == "__nv_bfloat16"
    assert all(p.degree == 1 for p in plan.bank_report), plan.bank_report
    assert plan.fragments.k_steps_qk == 128 // KEY_STEP and plan.fragments.k_steps_pv == 64 // KEY_STEP


@pytest.mark.parametrize("text, key", [
    (fp8_text(head_dim=96), "head_dim"),                           # 6 chunks per row do not divide 256 threads
    (fp8_text(head_dim=80), "head_dim"),                           # not whole k32 steps
    (fp8_text(block_n=48), "tile.block_n"),
    (fp8_text(warps="{producer: 1, consumer: 8}"), "warps"),
    (fp8_text(smem="{swizzle: {pad_bytes: 16}, stages: 2, async_copy: true}"), "smem.swizzle"),
    (fp8_text(smem="{stages: 1, async_copy: true}"), "smem"),
    (fp8_text(extra="varlen: true\n"), "varlen"),
    (fp8_text(extra="masks: [window]\n"), "masks"),
])
def test_rules_refuse_what_the_kind_does_not_generate(text, key):
    with pytest.raises(SpecError) as err:
        parse_spec(text)
    assert err.value.key == key


def test_e4m3_is_a_dtype_of_the_kind():
    """mma: mma_m16n8k16 with dtype e4m3 is fwd_mma's e4m3 form: its own plan and call convention."""
    from attngen.kinds import kind_of
    spec = parse_spec(fp8_text())
    kind, plain = kind_of(spec), kind_of(parse_spec(fp8_text().replace("dtype: e4m3", "dtype: fp16")))
    assert kind.name == plain.name == "fwd_mma" and kind is not plain
    assert (kind.calls, plain.calls) == ("forward_fp8", "forward")
    assert make_plan(spec).fragments.k == KEY_STEP


@pytest.mark.parametrize("old, now", [("mma_m16n8k32_e4m3", "mma_m16n8k16"), ("wgmma_m64nNk32_e4m3", "wgmma_m64nNk16")])
def test_a_folded_kind_says_what_to_write(old, now):
    """A spec naming a kind that became a dtype gets one line: the file, the key's line, what to write."""
    with pytest.raises(SpecError) as err:
        parse_spec(fp8_text().replace("mma_m16n8k16", old), file="old.yaml")
    assert (err.value.file, err.value.line, err.value.key) == ("old.yaml", 8, "mma")
    assert f"write mma: {now} and dtype: e4m3" in err.value.message
    assert "\n" not in str(err.value)


def test_key_order_matches_the_fragments():
    """Column 2t + e of 8-key tile nt (an m16n8 accumulator) holds key tile_key(nt, t, e) (the
    template's), and tiles 4kk .. 4kk + 3 then give lane quad t keys 4t .. 4t + 3 and 16 + 4t ..
    16 + 4t + 3 of k32 step kk: the A fragment of P.V."""
    def tile_key(nt, quad, e):
        return 16 * (nt // 2) + 4 * quad + 2 * (nt % 2) + e
    assert sorted(key_row(k) for k in range(64)) == list(range(64))
    for nt in range(8):
        for quad in range(4):
            for e in range(2):
                assert key_row(tile_key(nt, quad, e)) == 8 * nt + 2 * quad + e
    for kk in range(2):
        for quad in range(4):
            a_lo = [tile_key(4 * kk + j, quad, e) for j in (0, 1) for e in (0, 1)]
            a_hi = [tile_key(4 * kk + 2 + j, quad, e) for j in (0, 1) for e in (0, 1)]
            assert a_lo == [32 * kk + 4 * quad + i for i in range(4)]
            assert a_hi == [32 * kk + 16 + 4 * quad + i for i in range(4)]


@pytest.mark.parametrize("block_n", [32, 64, 128, 256])
def test_vt_swizzle_spreads_an_ldmatrix_phase(block_n):
    sw = vt_swizzle(block_n)
    for chunk in range(block_n // 16):
        banks = {sw.chunk_offset(r, chunk) % 128 for r in range(8)}
        assert len(banks) == 8


def test_generated_file_carries_only_the_e4m3_path():
    text = (ROOT / "generated" / "l4_mma_d128_fp8.cu").read_text()
    code = "\n".join(line for line in text.splitlines() if not line.startswith("//"))   # the header names mma_m16n8k16
    assert "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32" in code
    assert "m16n8k16" not in code and ".trans" not in code
    assert "p_shift" in text and "key_row" in text


def test_the_table_serves_e4m3_calls_with_bf16_specs():
    from attngen.ops.table import Entry, entry_problem, load_table, select, table_path
    entries = load_table(table_path(ROOT / "specs"))
    for arch, family in (("sm_89", "l4_mma_d{}_fp8"), ("sm_90", "h100_wgmma_d{}_fp8")):   # Hopper: the wgmma kind
        for d in (64, 128):
            for mask in ("none", "causal"):
                for seqlen in (2048, 8192):
                    spec = select(entries, "forward_fp8", arch, "e4m3", d, mask, seqlen).spec
                    assert spec.startswith(family.format(d)), spec      # the base or a sweep winner of it
    fp16_out = make_plan(parse_spec(fp8_text(extra="out_dtype: fp16\n")))
    problem = entry_problem(Entry("forward_fp8", "sm_89", "e4m3", 128, "none", "t"), fp16_out)
    assert "writes fp16, forward_fp8 calls return bf16" in problem


def test_dispatch_command_defaults_to_the_call_dtype():
    from click.testing import CliRunner
    from attngen.cli import main
    run = CliRunner().invoke(main, ["dispatch", "--call", "forward_fp8", "--arch", "sm_89", "--head-dim", "64"])
    assert run.exit_code == 0 and "forward_fp8 sm_89 e4m3 head_dim 64 none" in run.output
    assert "l4_mma_d64_fp8" in run.output
