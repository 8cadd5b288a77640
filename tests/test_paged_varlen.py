"""Paged varlen prefill without a GPU: the spec opt-in (`paged: true` on an mma.sync varlen spec), the
Params it adds, the generated gather, its launch record, and the dispatch table's paged varlen key.
The kernels themselves: tests/test_gpu_paged_varlen.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from attngen.core.launch_plan import LaunchPlan, launch_record
from attngen.core.spec_cells import cell_at
from attngen.core.varlen_plan import PAGED_VARLEN_FIELDS
from attngen.errors import SpecError
from attngen.ops.table import call_text, entry_problem, load_table, select, table_path
from attngen.plan import make_plan
from attngen.spec import load_spec, parse_spec

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "specs"
PAGED = ("h100_mma_d64_paged", "h100_mma_d64_paged_bf16", "h100_mma_d128_paged", "h100_mma_d128_paged_bf16")


def plan_of(name: str):
    return make_plan(load_spec(SPECS / f"{name}.yaml"))


@pytest.mark.parametrize("name", PAGED)
def test_paged_cells_add_their_fields_last(name):
    """A paged cell's Params is its family's varlen Params plus the page fields, appended: every field
    before them keeps its offset."""
    p = plan_of(name)
    assert p.paged and p.varlen
    names = [f.name for f in p.abi.fields]
    assert tuple(names[-len(PAGED_VARLEN_FIELDS):]) == PAGED_VARLEN_FIELDS
    # the same cell without pages: the same Params up to the page fields
    text = cell_at(SPECS / f"{name}.yaml").text
    assert "paged: true" in text
    plain = make_plan(parse_spec(text.replace("paged: true", "paged: false")))
    assert plain.varlen and not plain.paged
    assert list(plain.abi.rows()) == list(p.abi.rows())[:len(plain.abi.fields)]
    assert not set(PAGED_VARLEN_FIELDS) & {f.name for f in plain.abi.fields}
    assert {"window_lo", "window_hi"} <= set(names)     # masks none, causal and window


def test_unpaged_cells_carry_no_page_code():
    """Cells without paged: true render no table reads, no page fields and no gather; paged ones read
    the page size and its shift from Params (any power of two per call), with 64-bit offsets."""
    for name in ("h100_mma_d64", "h100_mma_d128", "h100_mma_d64_window", "h100_mma_d128_m128n32w4s4x3",
                 "h100_wgmma_d128_varlen", "h100_wgmma_d64_softcap_sink", "h100_mma_d256_softcap_alibi_sink"):
        text = (ROOT / "generated" / f"{name}.cu").read_text()
        for word in ("block_table", "page_shift", "copy_kv_pages", "seqused_k", "paged_sequence_rows"):
            assert word not in text, (name, word)
    for name in PAGED + ("h100_mma_d64_alibi", "h100_mma_d128_softcap_alibi_sink_bf16", "h100_mma_d256_paged_softcap"):
        text = (ROOT / "generated" / f"{name}.cu").read_text()
        for word in ("p.block_table[key >> p.page_shift]", "key & (p.page_size - 1)", "copy_kv_pages<kBlockN, kThreads>",
                     "paged_sequence_rows(s)", "long long k_at", "kBadPage"):
            assert word in text, (name, word)
        assert "kPageSize" not in text


def test_paged_needs_a_homogeneous_varlen_ring():
    base = (SPECS / "h100_mma_d64_m128n64w4s2x3q.yaml").read_text().replace(
        "varlen: true", "varlen: true\npaged: true").replace("dtypes: [fp16, bf16]", "dtype: fp16")
    assert parse_spec(base).paged
    # score modifiers read a sequence's lengths and head only: taken (an expression variant is not)
    assert parse_spec(base.replace("varlen: true\n", "varlen: true\nscores: [softcap, alibi, sink]\n", 1)).scores
    expression = "varlen: true\nvariant:\n  score: score * 0.5\n"
    for old, new in (("varlen: true\n", ""), ("varlen: true\n", expression), ("stages: 2", "stages: 1")):
        with pytest.raises(SpecError, match="paged: true reads K/V pages"):
            parse_spec(base.replace(old, new, 1))


@pytest.mark.parametrize("name", PAGED)
def test_launch_record_keeps_paged(name):
    p = plan_of(name)
    record = launch_record(p)
    assert record["pages"] == {"paged": True}
    assert LaunchPlan.from_record(record).paged
    unpaged = launch_record(plan_of("h100_mma_d64_window"))
    assert "pages" not in unpaged and not LaunchPlan.from_record(unpaged).paged


def test_table_keys_varlen_on_paged():
    """Paged varlen calls have entries of their own (paged: true), served by paged cells; a packed
    varlen call never takes them."""
    entries = load_table(table_path(SPECS))
    for dtype in ("fp16", "bf16"):
        for d in (64, 128):
            for mask in ("none", "causal"):
                e = select(entries, "varlen", "sm_90", dtype, d, mask, 4096, paged=True)
                assert e.paged and e.spec == f"h100_mma_d{d}_paged" + ("_bf16" if dtype == "bf16" else "")
                assert entry_problem(e, plan_of(e.spec)) is None
                assert not select(entries, "varlen", "sm_90", dtype, d, mask, 4096).paged
    e = select(entries, "varlen", "sm_90", "fp16", 64, "causal", 4096, paged=True)
    twin = "h100_mma_d64_m128n64w4s2x3q"
    assert "reads contiguous caches only" in entry_problem(e._replace(spec=twin), plan_of(twin))
    assert select(entries, "varlen", "sm_90", "fp16", 64, "window", 4096, paged=True).spec == "h100_mma_d64_paged"
    # score modifiers: at d64 and d128 the scores members, which read pages too (gpt-oss's sinks, ALiBi, ...);
    # at d256 softcap (Gemma 2's global layers) and softcap with a window (its local layers, 32-key tiles),
    # in paged members of their own
    for d, scores, member, mask in [(d, s, m, "window" if m == "window_softcap" else "causal") for d in (64, 128)
                                    for s, m in (("sink", "sink"), ("softcap", "softcap"),
                                                 ("softcap", "window_softcap"), ("alibi", "alibi"),
                                                 ("softcap+alibi+sink", "softcap_alibi_sink"))] + \
            [(256, "softcap", "paged_softcap", "none"), (256, "softcap", "paged_softcap", "causal"),
             (256, "softcap", "paged_window_softcap", "window")]:
        e = select(entries, "varlen", "sm_90", "bf16", d, mask, 4096, paged=True, scores=scores)
        assert e.spec == f"h100_mma_d{d}_{member}_bf16" and plan_of(e.spec).paged, (d, scores, e.spec)
        assert entry_problem(e, plan_of(e.spec)) is None
    for d, mask, scores in ((96, "causal", "softcap"), (256, "causal", "sink"),
                            (256, "causal", "alibi")):   # d96: padded to d128; d256: no kernel
        with pytest.raises(LookupError, match="paged"):
            select(entries, "varlen", "sm_90", "fp16", d, mask, 4096, paged=True, scores=scores)
    assert call_text("varlen", "sm_90", "fp16", 64, "causal", 4096, 16) == \
        "varlen sm_90 fp16 head_dim 64 causal seqlen 4096 page_size 16"


def test_dispatch_cli_shows_the_paged_varlen_pick():
    from click.testing import CliRunner
    from attngen.cli import main
    runner = CliRunner()
    for pg in (1, 16, 256, 512):
        result = runner.invoke(main, ["dispatch", "--call", "varlen", "--head-dim", "128", "--causal", "--page-size",
                                      str(pg)])
        assert result.exit_code == 0 and "-> h100_mma_d128_paged" in result.output, result.output
    result = runner.invoke(main, ["dispatch", "--call", "varlen", "--head-dim", "64", "--page-size", "24"])
    assert result.exit_code != 0 and "power of two" in result.output
    result = runner.invoke(main, ["dispatch", "--call", "varlen", "--head-dim", "64", "--dtype", "bf16"])
    assert result.exit_code == 0 and "_paged" not in result.output.splitlines()[0]
