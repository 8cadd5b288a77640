"""Planner numbers against layouts computed by hand, the budget refusal, and bank-conflict analysis.

Every region starts on a 128-byte boundary; a tile row is head_dim * 2 bytes plus any pad.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from attngen.core import banks
from attngen.cli import main
from attngen.errors import BudgetError, SpecError
from attngen.explain import explain
from attngen.plan import make_plan
from attngen.spec import load_spec, parse_spec
from attngen.targets import TARGETS
from spec_sample import SPEC_PATHS

ROOT = Path(__file__).resolve().parents[1]

PHASE4 = """\
schema: 1
name: phase4
target: l4
dtype: fp16
head_dim: 64
masks: [none, causal]
tile: {block_m: 32, block_n: 64}
warps: {compute: 4}
mma: scalar
smem:
  swizzle: {pad_bytes: 4}
  stages: 1
  async_copy: false
"""


def spec_text(head_dim=64, block_m=64, block_n=64, warps="{compute: 4}", mma="mma_m16n8k16", smem="",
              target="l4", name="t"):
    return (f"schema: 1\nname: {name}\ntarget: {target}\nhead_dim: {head_dim}\n"
            f"tile: {{block_m: {block_m}, block_n: {block_n}}}\nwarps: {warps}\nmma: {mma}\n"
            + (f"smem: {smem}\n" if smem else ""))


def plan_of(text: str, file: str = "t.yaml"):
    return make_plan(parse_spec(text, file=file), file=file)


def layout(plan) -> list[tuple]:
    return [(r.name, r.offset, r.bytes, r.pitch_bytes) for r in plan.regions]


# -- layouts ----------------------------------------------------------------------------------

def test_phase4_layout():
    p = plan_of(PHASE4)
    # Q: 32 rows x (128 + 4) B = 4224, then K and V: 64 rows x 132 B = 8448 each (4224, 12672 and
    # 21120 are multiples of 128, so no alignment gap), then P: 32 x 64 fp32 = 8192.
    assert layout(p) == [
        ("q", 0, 4224, 132),
        ("k0", 4224, 8448, 132),
        ("v0", 12672, 8448, 132),
        ("p", 21120, 8192, 256),
    ]
    assert p.smem_bytes == 29312
    assert p.smem_budget == 49152 and not p.smem_dynamic
    assert (p.threads, p.compute_warps, p.producer_warps, p.rows_per_warp) == (128, 4, 0, 8)
    assert p.chunks_per_row == 8
    assert (p.fragments.keys_per_lane, p.fragments.pairs_per_lane, p.fragments.rows_per_warp) == (2, 1, 8)
    assert p.functions == (("none", "attngen_phase4_none"), ("causal", "attngen_phase4_causal"))
    assert (p.ctype, p.ctype2) == ("half", "half2")
    assert (p.q_copy.chunks, p.q_copy.iterations, p.q_copy.exact) == (256, 2, True)
    assert (p.kv_copy.chunks, p.kv_copy.iterations, p.kv_copy.exact) == (512, 4, True)
    # 3 blocks of 29312 + 1024 reserved fit in the L4's 100 KiB per SM
    assert p.occupancy.by_smem() == 3


def test_phase4_file_plans_the_same():
    path = ROOT / "specs" / "phase4.yaml"
    if not path.is_file():
        pytest.skip("specs/phase4.yaml is not in this checkout")
    p = make_plan(load_spec(path))
    assert p.smem_bytes == 29312
    assert layout(p) == layout(plan_of(PHASE4))


def test_alignment_gap():
    # Q: 8 rows x 132 B = 1056 -> K starts at the next multiple of 128, 1152.
    p = plan_of(spec_text(block_m=8, mma="scalar", smem="{swizzle: {pad_bytes: 4}}"))
    assert layout(p) == [
        ("q", 0, 1056, 132),
        ("k0", 1152, 8448, 132),
        ("v0", 9600, 8448, 132),
        ("p", 18048, 2048, 256),
    ]
    assert p.smem_bytes == 20096


def test_mma_two_stage_layout():
    # No padding with the XOR swizzle: 128 B rows; Q 64 x 128, then k0 v0 k1 v1 of 64 x 128 each.
    p = plan_of(spec_text(smem="{swizzle: {xor_bits: 3}, stages: 2, async_copy: true, q_in_registers: true}"))
    assert layout(p) == [
        ("q", 0, 8192, 128),
        ("k0", 8192, 8192, 128),
        ("v0", 16384, 8192, 128),
        ("k1", 24576, 8192, 128),
        ("v1", 32768, 8192, 128),
    ]
    assert p.smem_bytes == 40960
    assert [(k.name, v.name) for k, v in p.kv_regions] == [("k0", "v0"), ("k1", "v1")]
    assert (p.threads, p.rows_per_warp) == (128, 16)
    m = p.fragments
    assert (m.m_tiles, m.n_tiles, m.d_tiles, m.k_steps_qk, m.k_steps_pv) == (1, 8, 8, 4, 4)
    assert (m.s_regs, m.o_regs, m.q_regs) == (32, 32, 16)
    assert p.swizzle.describe() == "xor: chunk ^= row & 7"


def test_wmma_layout():
    # Pad 16: 144 B rows. Q 32 x 144 = 4608; K, V 64 x 144 = 9216; then S (32 x 64 fp32 = 8192),
    # P (32 x 64 half = 4096) and O (32 x 64 fp32 = 8192); all offsets already 128-aligned.
    p = plan_of(spec_text(block_m=32, warps="{compute: 2}", mma="wmma_m16n16k16", smem="{swizzle: {pad_bytes: 16}}"))
    assert layout(p) == [
        ("q", 0, 4608, 144),
        ("k0", 4608, 9216, 144),
        ("v0", 13824, 9216, 144),
        ("s", 23040, 8192, 256),
        ("p", 31232, 4096, 128),
        ("o", 35328, 8192, 256),
    ]
    assert p.smem_bytes == 43520
    assert p.kind.name == "fwd_wmma" and p.rows_per_warp == 16


def test_specialized_warps_and_barriers():
    p = plan_of(spec_text(head_dim=128, block_n=32, warps="{producer: 1, consumer: 4}",
                          smem="{swizzle: {xor_bits: 3}, stages: 3, async_copy: true, opt_in: true}"))
    assert (p.threads, p.compute_threads, p.producer_threads) == (160, 128, 32)
    assert p.kv_copy.threads == 32 and p.q_copy.threads == 160
    # full[s] then empty[s], 8-byte mbarriers in their own region after the tiles
    assert [(b.name, b.stage, b.offset, b.arrivals) for b in p.barriers] == [
        ("full0", 0, 65536, 32), ("full1", 1, 65544, 32), ("full2", 2, 65552, 32),
        ("empty0", 0, 65560, 128), ("empty1", 1, 65568, 128), ("empty2", 2, 65576, 128),
    ]
    assert all(b.arrive.startswith("producer") for b in p.barriers[:3])
    assert all(b.arrive.startswith("consumer") for b in p.barriers[3:])
    assert p.region("bars").offset == 65536 and p.barrier_bytes == 8
    # Q 64 x 256 B, then three stages of K and V, 32 x 256 B each, then the mbarriers
    assert [r.offset for r in p.regions] == [0, 16384, 24576, 32768, 40960, 49152, 57344, 65536]
    assert p.smem_bytes == 65536 + 48 and p.smem_dynamic


def test_bf16_types():
    p = plan_of(spec_text().replace("head_dim:", "dtype: bf16\nhead_dim:"))
    assert (p.ctype, p.ctype2) == ("__nv_bfloat16", "__nv_bfloat162")


@pytest.mark.parametrize("path", SPEC_PATHS, ids=lambda p: p.name)
def test_repo_specs_plan_within_budget(path):
    p = make_plan(load_spec(path))
    assert 0 < p.smem_bytes <= p.smem_budget or (p.smem_bytes == 0 and not p.regions)   # a merge uses none
    assert p.smem_dynamic == (p.smem_bytes > p.target.smem_per_block)
    # regions are 128-aligned and do not overlap
    end = 0
    for r in p.regions:
        assert r.offset % 128 == 0 and r.offset >= end
        end = r.end
    assert p.smem_bytes == end


# -- budget -----------------------------------------------------------------------------------

def test_budget_refusal_lists_every_region():
    # block_m 128: Q 128 x 132 = 16896, K and V 8448 each, P 128 x 64 fp32 = 32768 -> 66560 B.
    text = spec_text(block_m=128, mma="scalar", smem="{swizzle: {pad_bytes: 4}}")
    with pytest.raises(BudgetError) as info:
        plan_of(text, file="big.yaml")
    err = info.value
    msg = str(err)
    assert err.key == "smem" and err.file == "big.yaml"
    assert "shared memory 66560 B (65.00 KiB) exceeds the budget of 49152 B (48.00 KiB) by 17408 B" in msg
    rows = {ln.split()[0]: ln.split() for ln in err.breakdown.splitlines()[1:]}
    assert rows["q"][-2:] == ["16896", "16.50"]
    assert rows["k0"][-2:] == ["8448", "8.25"]
    assert rows["v0"][-2:] == ["8448", "8.25"]
    assert rows["p"][-2:] == ["32768", "32.00"]
    assert rows["total"][-2:] == ["66560", "65.00"]
    assert rows["budget"][1:3] == ["49152", "48.00"] and "(l4, default per block)" in err.breakdown
    # fits the L4's opt-in maximum, so the hint says how to opt in
    assert "set smem.opt_in: true (the l4 allows 101376 B per block)" in msg


def test_budget_refusal_through_cli(tmp_path):
    p = tmp_path / "big.yaml"
    p.write_text(spec_text(block_m=128, mma="scalar", smem="{swizzle: {pad_bytes: 4}}"))
    result = CliRunner().invoke(main, ["explain", str(p)])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert "exceeds the budget of 49152 B" in result.output and "32768" in result.output


def test_opt_in_accepted_on_l4():
    text = spec_text(block_m=128, mma="scalar", smem="{swizzle: {pad_bytes: 4}, opt_in: true}")
    p = plan_of(text)
    assert p.smem_bytes == 66560
    assert p.smem_budget == TARGETS["l4"].smem_per_block_optin == 101376
    assert p.smem_dynamic


def test_exactly_at_budget_is_static():
    # mma, 128 B rows: Q 128 x 128 = 16384 plus two stages of K and V, 64 x 128 = 8192 each: 49152.
    p = plan_of(spec_text(block_m=128, warps="{compute: 8}", smem="{swizzle: {xor_bits: 3}, stages: 2, async_copy: true}"))
    assert p.smem_bytes == 49152 == p.smem_budget
    assert not p.smem_dynamic


def test_one_stage_more_needs_opt_in():
    smem = "{swizzle: {xor_bits: 3}, stages: 3, async_copy: true%s}"
    with pytest.raises(BudgetError, match="65536 B .* exceeds the budget of 49152 B"):
        plan_of(spec_text(block_m=128, warps="{compute: 8}", smem=smem % ""))
    p = plan_of(spec_text(block_m=128, warps="{compute: 8}", smem=smem % ", opt_in: true"))
    assert p.smem_bytes == 65536 and p.smem_dynamic


def test_opt_in_maximum_depends_on_target():
    # block_m 256: Q 256 x 132 = 33792, K and V 8448 each, P 256 x 64 fp32 = 65536 -> 116224 B:
    # over the L4's 101376 B opt-in maximum, under the H100's 232448 B.
    smem = "{swizzle: {pad_bytes: 4}, opt_in: true}"
    with pytest.raises(BudgetError) as info:
        plan_of(spec_text(block_m=256, mma="scalar", smem=smem))
    msg = str(info.value)
    assert "116224 B" in msg and "budget of 101376 B" in msg and "(l4, opt-in maximum)" in msg
    assert "shrink tile.block_m" in msg and "opt_in: true" not in msg
    p = plan_of(spec_text(block_m=256, mma="scalar", smem=smem, target="h100"))
    assert p.smem_bytes == 116224 and p.smem_budget == 232448 and p.smem_dynamic


def test_over_opt_in_without_opt_in_says_shrink():
    with pytest.raises(BudgetError) as info:
        plan_of(spec_text(block_m=256, mma="scalar", smem="{swizzle: {pad_bytes: 4}}"))
    assert "shrink tile.block_m" in str(info.value) and "opt_in: true" not in str(info.value)


# -- bank conflicts ---------------------------------------------------------------------------

def test_phase_degree_by_hand():
    # 16-byte accesses, 8 per phase: 8 rows of a 128 B pitch all start in bank 0 -> 8 wavefronts.
    assert banks.phase_degree([r * 128 for r in range(8)], 16) == 8
    assert banks.phase_degree([r * 128 + 16 * r for r in range(8)], 16) == 1
    assert banks.phase_degree([r * 144 for r in range(8)], 16) == 1
    # 4-byte accesses: lanes reading the same word broadcast; two words in one bank conflict.
    assert banks.phase_degree([0] * 32, 4) == 1
    assert banks.phase_degree([4 * lane for lane in range(32)], 4) == 1
    assert banks.phase_degree([128 * lane for lane in range(32)], 4) == 32
    assert banks.phase_degree([132 * lane for lane in range(32)], 4) == 1


def _degrees(plan) -> dict[str, int]:
    return {p.name: p.degree for p in plan.bank_report}


def test_xor_swizzle_makes_ldmatrix_conflict_free():
    swizzled = _degrees(plan_of(spec_text(smem="{swizzle: {xor_bits: 3}, stages: 2, async_copy: true}")))
    plain = _degrees(plan_of(spec_text(smem="{swizzle: none, stages: 2, async_copy: true}")))
    ldm = [n for n in swizzled if n.startswith("ldmatrix")]
    assert len(ldm) == 3  # Q, K and V fragments
    assert all(swizzled[n] == 1 for n in swizzled), swizzled
    # unswizzled 128 B rows: the 8 row addresses of one 8x8 matrix all hit the same 4 banks
    assert all(plain[n] == 8 for n in ldm), plain


def test_pad_breaks_scalar_conflicts():
    padded = _degrees(plan_of(PHASE4))
    plain = _degrees(plan_of(PHASE4.replace("{pad_bytes: 4}", "none")))
    assert all(d == 1 for d in padded.values()), padded
    # one key per lane with 128 B rows: all 32 lanes read the same bank
    assert plain["K read for Q.K^T (half2 per lane, one key per lane)"] == 32
    # four rows of eight 16-byte chunks per 32 lanes, each row in the same banks
    assert plain["K/V tile store (4 x 4 B per 16-B chunk)"] == 4


def test_min_blocks_per_sm_reaches_launch_bounds():
    from attngen.render import render_plan
    p = plan_of(spec_text() + "min_blocks_per_sm: 2\n")
    assert p.min_blocks_per_sm == 2
    src = render_plan(p, "t.yaml", "")
    assert "__launch_bounds__(attngen_t::kThreads, attngen_t::kMinBlocksPerSm)" in src
    assert "constexpr int kMinBlocksPerSm = 2;" in src
    unset = plan_of(spec_text())
    assert unset.min_blocks_per_sm is None
    assert "constexpr int kMinBlocksPerSm = 0;" in render_plan(unset, "t.yaml", "")


def test_min_blocks_per_sm_must_fit_the_sm():
    # 4 warps = 128 threads; the L4 holds 1536 threads per SM, so 13 blocks do not fit; 3 leave the
    # 64 accumulator registers the kernel holds and the kind's margin (65536 / (3 x 128) = 168 per
    # thread), so the hint suggests 3, not the 12 that are resident
    assert plan_of(spec_text() + "min_blocks_per_sm: 3\n").min_blocks_per_sm == 3
    with pytest.raises(SpecError) as info:
        plan_of(spec_text() + "min_blocks_per_sm: 13\n")
    assert info.value.key == "min_blocks_per_sm" and "min_blocks_per_sm <= 3" in info.value.hint


def test_min_blocks_per_sm_must_leave_the_registers_the_kernel_holds():
    with pytest.raises(SpecError) as info:
        plan_of(spec_text() + "min_blocks_per_sm: 12\n")
    assert info.value.key == "min_blocks_per_sm"
    assert "cap ptxas at 40 registers per thread, but the kernel holds at least 64" in info.value.message
    assert "use min_blocks_per_sm <= 3" in info.value.message


def test_wgmma_homogeneous_issuer():
    """Without a producer warpgroup the first thread of the last consumer warpgroup (whose rows see
    every tile) issues the copies; the entry cap alone gives 2 warpgroups 255 registers."""
    text = spec_text(head_dim=128, block_m=128, block_n=176, warps="{compute: 8}", mma="wgmma_m64nNk16",
                     smem="{swizzle: {xor_bits: 3}, stages: 2, async_copy: true, opt_in: true}", target="h100")
    p = plan_of(text)
    f = p.fragments
    assert (f.has_producer, f.issuer_thread, f.producer_registers, f.consumer_registers) == (False, 128, 0, 0)
    assert (p.threads, p.producer_threads, f.s_regs, f.k_steps_pv, f.k_tile_bytes) == (256, 0, 88, 11, 176 * 128 * 2)
    assert all(r.offset % 1024 == 0 for r in p.regions if r.name != "bars")
    assert "consumer thread 128" in p.roles[0] and len(p.roles) == 1
    assert p.barriers[0].arrive.startswith("the issuer (consumer thread 128)")


def test_wgmma_persistent_grid_and_q_barriers():
    """Persistent: one block per SM (never more than there are query blocks), and a q_empty mbarrier
    after q_full that the producer waits on before it replaces Q."""
    text = (spec_text(head_dim=128, block_m=128, block_n=128, warps="{producer: 4, consumer: 8}",
                      mma="wgmma_m64nNk16", smem="{swizzle: {xor_bits: 3}, stages: 2, async_copy: true, opt_in: true}",
                      target="h100") + "registers: {producer: 24, consumer: 240}\nschedule: {persistent: true}\n")
    p = plan_of(text)
    assert p.persistent and p.grid(4, 16, 2048, sm_count=132) == (132, 1, 1) and p.grid(1, 2, 300, 132) == (6, 1, 1)
    assert p.grid(1, 1, 1000) == (8, 1, 1) and p.grid(64, 64, 8192) == (p.target.sm_count, 1, 1)
    assert [(b.name, b.arrivals) for b in p.barriers[-2:]] == [("q_full", 1), ("q_empty", 8)]
    assert p.region("bars").bytes == 8 * (2 * 2 + 2)   # not overlapped: one full/empty pair per stage
    plain = plan_of(text.replace("persistent: true", "persistent: false"))
    assert not plain.persistent and plain.grid(4, 16, 2048, sm_count=132) == (16, 16, 4)


def test_wgmma_three_way_turns_and_epilogue_barriers():
    """Ping-pong with three consumer warpgroups: turn barriers 1-3, the staged epilogue's from 4;
    with two (or none) the epilogue's stay at 3. Four or one consumer warpgroups are refused."""
    def text(consumers, pingpong):
        return (spec_text(head_dim=64, block_m=64 * consumers, block_n=128,
                          warps=f"{{producer: 4, consumer: {4 * consumers}}}", mma="wgmma_m64nNk16",
                          smem="{swizzle: {xor_bits: 3}, stages: 2, async_copy: true, opt_in: true}", target="h100")
                + ("registers: {producer: 32, consumer: 160}\n" if consumers == 3 else
                   "registers: {producer: 24, consumer: 240}\n")
                + f"schedule: {{overlap: true, pingpong: {str(pingpong).lower()}}}\nepilogue: tma\n")
    for consumers, pingpong, epilogue in ((3, True, 4), (2, True, 3), (3, False, 3)):
        f = plan_of(text(consumers, pingpong)).fragments
        assert (f.pingpong, f.turn_barrier, f.epilogue_barrier) == (pingpong, 1, epilogue)
    assert "named barriers 1-3" in explain(plan_of(text(3, True)))
    with pytest.raises(SpecError, match="8 or 12"):
        plan_of(text(1, True))


def test_wgmma_varlen_functions():
    """varlen: true adds a varlen function per mask; their Params carry the sequence fields but no
    q/k/v pointers (TMA maps read them); a persistent TMA-store spec's varlen grid is one block per
    query block of the longest sequence, and explain says how a block reaches its sequence's rows."""
    text = (spec_text(head_dim=128, block_m=128, block_n=128, warps="{producer: 4, consumer: 8}",
                      mma="wgmma_m64nNk16", smem="{swizzle: {xor_bits: 3}, stages: 2, async_copy: true, opt_in: true}",
                      target="h100") + "registers: {producer: 24, consumer: 240}\nepilogue: tma\n"
            "schedule: {persistent: true}\nvarlen: true\n")
    p = plan_of(text)
    assert p.varlen and [k for k, _ in p.functions] == ["none", "causal", "none_varlen", "causal_varlen"]
    names = {f.name for f in p.abi.fields}
    assert {"cu_seqlens_q", "cu_seqlens_k", "seq_order", "total_q", "errors", "tma_q", "tma_o", "o"} <= names
    assert not names & {"q", "k", "v", "q_row_stride"}
    assert p.grid(4, 16, 2048, sm_count=132) == (132, 1, 1) and p.varlen_grid(4, 16, 2048) == (16, 16, 4)
    line = next(x.strip() for x in explain(p).splitlines() if x.strip().startswith("varlen: the maps"))
    assert "no persistent loop" in line and "not a TMA store" in line
    with pytest.raises(SpecError, match="schedule.persistent"):     # it would change no varlen function
        plan_of(text.replace("varlen: true", "varlen: only"))
    only = plan_of(text.replace("varlen: true", "varlen: only").replace("schedule: {persistent: true}\n", ""))
    assert only.varlen and [k for k, _ in only.functions] == ["none_varlen", "causal_varlen"]
    assert "cu_seqlens_q" in {f.name for f in only.abi.fields}
    plain = plan_of(text.replace("varlen: true", "varlen: false"))
    assert not plain.varlen and "varlen: the maps" not in explain(plain)
    assert "cu_seqlens_q" not in {f.name for f in plain.abi.fields}


def test_wgmma_own_epilogue_tile():
    """epilogue_tile: own stages O in a tile of its own (block_m x head_dim_v more shared memory, on a
    swizzle repeat), so a persistent block's consumers hand Q back before the epilogue."""
    text = (spec_text(head_dim=128, block_m=128, block_n=128, warps="{producer: 4, consumer: 8}",
                      mma="wgmma_m64nNk16", smem="{swizzle: {xor_bits: 3}, stages: 2, async_copy: true, opt_in: true}",
                      target="h100") + "registers: {producer: 24, consumer: 240}\nepilogue: tma\n"
            "schedule: {persistent: true}\n")
    over_q, own = plan_of(text), plan_of(text + "epilogue_tile: own\n")
    assert over_q.fragments.o_stage_offset == over_q.region("q").offset
    assert own.fragments.o_stage_offset == own.region("o").offset and own.region("o").offset % 1024 == 0
    assert own.smem_bytes == over_q.smem_bytes + 128 * 128 * 2
    assert "O tile of its own" in explain(own) and "before its epilogue" in " ".join(own.schedule)
    assert "out of the Q tile" in " ".join(over_q.schedule)


def test_wgmma_own_epilogue_tile_in_turns():
    """epilogue_tile: own_in_turns stages O in a tile of one warpgroup's 64 rows (half of own's at two consumer
    warpgroups), which the warpgroups take in turn on named barriers after the epilogue's (5 and 6); Q goes back
    before the epilogue as with own."""
    text = (spec_text(head_dim=256, block_m=128, block_n=64, warps="{producer: 4, consumer: 8}",
                      mma="wgmma_m64nNk16", smem="{swizzle: {xor_bits: 3}, stages: 2, async_copy: true, opt_in: true}",
                      target="h100") + "registers: {producer: 24, consumer: 240}\nepilogue: tma\n"
            "schedule: {overlap: true, persistent: true}\n")
    over_q, turns = plan_of(text), plan_of(text + "epilogue_tile: own_in_turns\n")
    assert turns.region("o").offset % 1024 == 0 and turns.fragments.o_stage_offset == turns.region("o").offset
    assert turns.smem_bytes == over_q.smem_bytes + 64 * 256 * 2
    assert turns.fragments.o_tile_in_turns and turns.fragments.o_turn_barrier == turns.fragments.epilogue_barrier + 2
    assert not over_q.fragments.o_tile_in_turns
    assert "in its turn" in " ".join(turns.schedule) and "before its epilogue" in " ".join(turns.schedule)
    with pytest.raises((BudgetError, SpecError)):   # a whole own tile does not fit at head_dim 256
        plan_of(text + "epilogue_tile: own\n")


def test_wgmma_two_q_tiles():
    """schedule.q_tiles: 2 (persistent) gives a second swizzled Q tile right after the first and a
    q_full / q_empty pair per tile, so the producer loads the next query block's Q into the other tile."""
    from attngen.render import render_plan
    text = (spec_text(head_dim=128, block_m=128, block_n=128, warps="{producer: 4, consumer: 8}",
                      mma="wgmma_m64nNk16", smem="{swizzle: {xor_bits: 3}, stages: 2, async_copy: true, opt_in: true}",
                      target="h100") + "registers: {producer: 24, consumer: 240}\nepilogue: tma\n")
    one = plan_of(text + "schedule: {overlap: true, persistent: true}\n")
    two = plan_of(text + "schedule: {overlap: true, persistent: true, q_tiles: 2}\n")
    assert (one.fragments.q_tiles, one.fragments.q_tile_stride) == (1, 0)
    assert two.fragments.q_tiles == 2 and two.fragments.q_tile_stride == two.region("q1").offset - two.region("q").offset
    assert two.region("q1").offset % 1024 == 0 and two.smem_bytes == one.smem_bytes + 128 * 128 * 2 + 2 * 8
    assert [b.name for b in one.barriers][-2:] == ["q_full", "q_empty"]
    assert [b.name for b in two.barriers][-4:] == ["q_full0", "q_full1", "q_empty0", "q_empty1"]
    offsets = [b.offset for b in two.barriers]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    assert "tile i % 2" in " ".join(two.schedule) and "tile i % 2" not in " ".join(one.schedule)
    source = render_plan(two, "t.yaml", "")
    assert "constexpr int kQTiles = 2;" in source and "warp = uniform_warp()" in source
    plain = plan_of(text.replace("epilogue: tma\n", ""))
    assert "uniform_warp" not in render_plan(plain, "t.yaml", "")   # a block of one query block keeps threadIdx.x / 32


def test_wgmma_separate_kv_barriers_key_overrides_the_schedule():
    """schedule.separate_kv_barriers: false keeps one full/empty pair per stage on the overlapped
    schedule (and true separates a sequential one's); unset follows overlap."""
    text = (spec_text(head_dim=128, block_m=128, block_n=128, warps="{producer: 4, consumer: 8}",
                      mma="wgmma_m64nNk16", smem="{swizzle: {xor_bits: 3}, stages: 3, async_copy: true, opt_in: true}",
                      target="h100") + "registers: {producer: 24, consumer: 240}\n")
    pair = plan_of(text + "schedule: {overlap: true, separate_kv_barriers: false}\n")
    assert not pair.fragments.separate_kv_barriers and [b.name for b in pair.barriers] == [
        "full0", "full1", "full2", "empty0", "empty1", "empty2", "q_full"]
    split = plan_of(text + "schedule: {separate_kv_barriers: true}\n")
    assert split.fragments.separate_kv_barriers and not split.fragments.overlap and len(split.barriers) == 4 * 3 + 1


@pytest.mark.parametrize("epilogue, maps", [("registers", ["q", "k", "v"]), ("shared", ["q", "k", "v"]),
                                            ("tma", ["q", "k", "v", "o"])])
def test_wgmma_epilogue(epilogue, maps):
    """O staged in the Q tile needs no more shared memory; a TMA store adds a stored map of O whose box
    is one warpgroup's 64 rows, carried in Params after the loaded ones."""
    text = (spec_text(head_dim=128, block_m=128, block_n=128, warps="{producer: 4, consumer: 8}",
                      mma="wgmma_m64nNk16", smem="{swizzle: {xor_bits: 3}, stages: 2, async_copy: true, opt_in: true}",
                      target="h100") + f"registers: {{producer: 24, consumer: 240}}\nepilogue: {epilogue}\n")
    p = plan_of(text)
    assert p.fragments.epilogue == epilogue and p.smem_bytes == plan_of(text.replace(epilogue, "registers")).smem_bytes
    assert [m.tensor for m in p.tensor_maps] == maps
    if epilogue == "tma":
        o = p.tensor_maps[-1]
        assert (o.store, o.box_rows, o.abi_field) == (True, 64, "tma_o") and "not written" in o.describe()
        loads_only = plan_of(text.replace(epilogue, "registers")).abi
        assert p.abi.fields[-1].name == "tma_o" and p.abi.size == loads_only.size + 128
    assert f"epilogue: {epilogue}" in explain(p)
    assert ("Q tile" in p.schedule[-2]) == (epilogue != "registers")


# d160 takes 80-key tiles: 128 would need about 184 registers per consumer thread, over the 160 of
# three consumer warpgroups (it spilled 964 B).
@pytest.mark.parametrize("head_dim, swizzle, tile_dim, mode, tma, bn", [
    (96, "{xor_bits: 2, row_shift: 1}", 96, 2, "64B", 128), (80, "{xor_bits: 1, row_shift: 2}", 80, 3, "32B", 128),
    (40, "{xor_bits: 1, row_shift: 2}", 48, 3, "32B", 128), (40, "{xor_bits: 3}", 64, 1, "128B", 128),
    (160, "{xor_bits: 2, row_shift: 1}", 160, 2, "64B", 80)])
def test_wgmma_panels_of_any_head_dim(head_dim, swizzle, tile_dim, mode, tma, bn):
    """Head dims that are not multiples of 64 take 64- or 32-byte swizzled panels (or pad to whole
    panels): the descriptors' mode, stride and V offsets, the TMA boxes and transaction bytes, the
    accumulators and the P.V width all follow the panel, and a padded tile says so in explain."""
    text = (spec_text(head_dim=head_dim, block_m=192, block_n=bn, warps="{producer: 4, consumer: 12}",
                      mma="wgmma_m64nNk16", smem=f"{{swizzle: {swizzle}, stages: 2, async_copy: true, opt_in: true}}",
                      target="h100") + "registers: {producer: 32, consumer: 160}\n")
    p = plan_of(text)
    f, row = p.fragments, {"128B": 128, "64B": 64, "32B": 32}[tma]
    assert (f.tile_dim, f.panels, f.panel_cols, f.panel_row_bytes) == (tile_dim, tile_dim * 2 // row, row // 2, row)
    assert (f.descriptor_mode, f.swizzle_atom_bytes, f.k_steps_per_panel) == (mode, 8 * row, row // 32)
    assert (f.v_lbo_bytes, f.v_step_bytes, f.o_regs, f.k_steps_qk) == (bn * row, 16 * row, tile_dim // 2, tile_dim // 16)
    assert (f.q_bytes, f.k_tile_bytes, f.v_tile_bytes) == (192 * tile_dim * 2, bn * tile_dim * 2, bn * tile_dim * 2)
    assert p.region("q").bytes == 192 * tile_dim * 2 and all(r.offset % 1024 == 0 for r in p.regions if r.name != "bars")
    assert {(m.box_cols, m.swizzle) for m in p.tensor_maps} == {(row // 2, tma)}
    assert (p.head_dim, p.chunks_per_row) == (head_dim, head_dim // 8)   # what the runtime checks and stores
    # The plan's swizzle is the TMA pattern: 16-byte chunk c of panel row r at c ^ (r / (8 / chunks) % chunks).
    chunks = row // 16
    assert all(p.swizzle.chunk_offset(r, c) == r * row + 16 * (c ^ (r // (8 // chunks) % chunks))
               for r in range(16) for c in range(chunks))
    padded = [line for line in explain(p).splitlines() if "padded to" in line]
    assert bool(padded) == (tile_dim != head_dim)
    if padded:
        assert f"head_dim {head_dim} padded to {tile_dim} columns" in padded[0]


def test_wgmma_head_dim_v():
    """head_dim_v (DeepSeek MLA: 192 / 128): V tiles, O's accumulators, P.V's N, V's TMA bytes and the
    output's columns follow head_dim_v; Q and K keep head_dim; explain names both and the scale."""
    text = (spec_text(head_dim=192, block_m=128, block_n=128, warps="{producer: 4, consumer: 8}",
                      mma="wgmma_m64nNk16", smem="{swizzle: {xor_bits: 3}, stages: 2, async_copy: true, opt_in: true}",
                      target="h100") + "head_dim_v: 128\nregisters: {producer: 24, consumer: 240}\n")
    p = plan_of(text)
    f = p.fragments
    assert (p.head_dim, p.v_dim, p.head_dim_v) == (192, 128, 128)
    assert (f.tile_dim, f.tile_dim_v, f.panels, f.panels_v, f.o_regs) == (192, 128, 3, 2, 64)
    assert (f.q_bytes, f.k_tile_bytes, f.v_tile_bytes) == (128 * 192 * 2, 128 * 192 * 2, 128 * 128 * 2)
    assert p.region("k0").bytes == 128 * 192 * 2 and p.region("v0").bytes == 128 * 128 * 2
    text_out = explain(p)
    assert "V and O: head_dim_v 128, Q and K: head_dim 192 (the default scale is 1/sqrt(192))" in text_out
    assert "m64n128k16 (P.V" in text_out and "K 49152 B and V 32768 B per stage" in text_out
    assert p.spec.register_need()[0] == 64 + 64 + 40    # S + O + the sequential schedule's margin
    same = plan_of(text.replace("head_dim_v: 128", "head_dim_v: 192").replace("block_n: 128", "block_n: 96"))
    # head_dim_v equal to head_dim is the plain plan
    assert (same.head_dim_v, same.v_dim, same.fragments.tile_dim_v) == (0, 192, 192)
    # O is staged in the Q tile by the shared and TMA epilogues: it must not be wider than Q
    with pytest.raises(SpecError) as info:
        plan_of(text.replace("head_dim: 192", "head_dim: 64").replace("head_dim_v: 128", "head_dim_v: 128\n"
                                                                         "epilogue: tma"))
    assert info.value.key == "epilogue" and "use epilogue: registers" in info.value.message


def test_wgmma_layout_and_numbers():
    """Hopper kind: 128-byte-swizzled tiles on 1024-byte boundaries, [panels][rows][64] each; a K/V
    ring; full and empty mbarriers of K and of V per stage and one for Q; TMA transaction bytes; sm_90a."""
    text = (spec_text(head_dim=128, block_m=128, block_n=128, warps="{producer: 4, consumer: 8}",
                      mma="wgmma_m64nNk16", smem="{swizzle: {xor_bits: 3}, stages: 2, async_copy: true, opt_in: true}",
                      target="h100") + "registers: {producer: 24, consumer: 240}\n")
    p = plan_of(text)
    assert layout(p) == [("q", 0, 32768, 128), ("k0", 32768, 32768, 128), ("v0", 65536, 32768, 128),
                         ("k1", 98304, 32768, 128), ("v1", 131072, 32768, 128), ("bars", 163840, 40, 8)]
    assert all(r.offset % 1024 == 0 for r in p.regions if r.name != "bars") and p.smem_align == 1024
    assert p.kv_stage_stride == 65536 and p.threads == 384 and p.min_blocks_per_sm == 1
    f = p.fragments
    assert (f.consumer_warpgroups, f.panels, f.s_regs, f.o_regs, f.k_steps_qk, f.k_steps_pv) == (2, 2, 64, 64, 8, 8)
    assert (f.q_bytes, f.k_tile_bytes, f.v_tile_bytes, f.producer_registers, f.consumer_registers) == (
        32768, 32768, 32768, 24, 240)
    assert (f.has_producer, f.issuer_thread, f.separate_kv_barriers) == (True, 256, False)
    # not overlapped: one full (an expect_tx for K and one for V) and one empty per stage
    assert [(b.name, b.arrivals) for b in p.barriers] == [("full0", 2), ("full1", 2), ("empty0", 8), ("empty1", 8),
                                                          ("q_full", 1)]
    # overlapped: K is handed back after S, V after P.V, on their own mbarriers
    o = plan_of(text + "schedule: {overlap: true}\n")
    assert o.fragments.separate_kv_barriers and [(b.name, b.arrivals) for b in o.barriers] == [
        ("full_k0", 1), ("full_k1", 1), ("full_v0", 1), ("full_v1", 1), ("empty_k0", 8), ("empty_k1", 8),
        ("empty_v0", 8), ("empty_v1", 8), ("q_full", 1)]
    assert [b.offset for b in o.barriers] == list(range(163840, 163840 + 72, 8))
    # the softmax's own block (a ptxas scheduling matter): only the source changes, and only where asked
    from attngen.render import render_for
    plain, own = render_for(o)[1], render_for(plan_of(text + "schedule: {overlap: true, softmax_block: true}\n"))[1]
    assert not o.fragments.softmax_block and "_own_block" not in plain and "nctaid" not in plain
    assert own.count("in_own_block(") == 2 and "%%nctaid.x" in own   # its definition and the loop's call
    assert "in_own_block([&] { softmax_rows(s, alpha, row_max, row_sum," in own
    # Q's k-step descriptors (also a ptxas matter): advanced from the warpgroup's by default, rebuilt from each
    # step's address where asked; the two give the same value wherever Q can sit in shared memory
    rebuilt = render_for(plan_of(text + "schedule: {overlap: true, q_descriptors: rebuilt}\n"))[1]
    assert not o.fragments.q_steps_rebuilt and "return desc_advance(smem_desc(sQ + wg_row0" in plain
    assert "return desc_advance(smem_desc(sQ" not in rebuilt and "return smem_desc(sQ + (kk / kKStepsPerPanel)" in rebuilt

    def smem_desc(addr, lbo, sbo, mode):   # lib/wgmma.j2's, bit for bit
        return ((addr & 0x3FFFF) >> 4) | ((lbo >> 4) & 0x3FFF) << 16 | ((sbo >> 4) & 0x3FFF) << 32 | mode << 62

    def desc_advance(desc, nbytes):
        return (desc & ~0xFFFFFFFF) | (((desc & 0xFFFFFFFF) + (nbytes >> 4)) & 0xFFFFFFFF)

    f, row_bytes = o.fragments, o.fragments.panel_row_bytes
    for s_q in range(0, 228 * 1024 - f.q_bytes + 1, 1024):
        for wg_row0 in range(0, o.spec.tile.block_m, 64):
            for kk in range(f.k_steps_qk):
                step = (kk // f.k_steps_per_panel) * o.spec.tile.block_m * row_bytes + (kk % f.k_steps_per_panel) * 32
                built = smem_desc(s_q + wg_row0 * row_bytes + step, 16, f.swizzle_atom_bytes, f.descriptor_mode)
                assert desc_advance(smem_desc(s_q + wg_row0 * row_bytes, 16, f.swizzle_atom_bytes, f.descriptor_mode),
                                    step) == built
    assert p.compile_arch("sm_90") == "sm_90a" and [m.tensor for m in p.tensor_maps] == ["q", "k", "v"]
    # the maps travel by value: three 128-byte, 64-byte aligned Params fields, Params a __grid_constant__
    assert [(f.name, f.size, f.align) for f in p.abi.fields[-3:]] == [("tma_q", 128, 64), ("tma_k", 128, 64),
                                                                      ("tma_v", 128, 64)]
    assert p.abi.offsets[-3:] == (128, 256, 384) and p.abi.size == 512 and p.params_qualifier == "__grid_constant__ "


def test_a_padded_call_of_a_varlen_only_spec_says_so():
    """A kernel whose spec sets varlen: only takes varlen calls; a padded call is refused with what to do
    (the check runs before anything touches a GPU, so a stand-in kernel suffices here)."""
    from types import SimpleNamespace
    from attngen.runtime.kernel import Kernel
    p = make_plan(load_spec(ROOT / "specs" / "h100_mma_d64_softcap.yaml"))
    k = SimpleNamespace(label="h100_mma_d64_softcap", masks=p.masks, entry=dict(p.entry_functions))
    assert Kernel._check_mask(k, True, None, varlen=True) == "causal"
    with pytest.raises(ValueError, match=r"has varlen functions only \(its spec sets varlen: only\): call "
                                         r"kernel.varlen\(...\), or set varlen: true"):
        Kernel._check_mask(k, True, None)
    with pytest.raises(ValueError, match="has no window variant"):
        Kernel._check_mask(k, True, (8, 0), varlen=True)
