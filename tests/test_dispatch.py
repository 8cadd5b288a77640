"""The dispatch table: every committed entry names a spec that serves it, selection by bucket and
group rows, a clear refusal for a key with no entry, and the `attngen dispatch` command. No GPU."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from attngen.cli import main
from attngen.errors import SpecError
from attngen.ops.table import Entry, dump_table, load_table, select, table_path
from spec_sample import spec_text

ROOT = Path(__file__).resolve().parent.parent
TABLE = table_path(ROOT / "specs")


@pytest.mark.exhaustive
def test_committed_table_names_specs_that_serve_it():
    entries = load_table(TABLE)
    from attngen.core.calls import TABLE_CALLS
    assert {e.call for e in entries} == {t.name for t in TABLE_CALLS}    # every call the conventions list serves
    assert {e.arch for e in entries} >= {"sm_90", "sm_89"}
    # Each entry serves its spec on the spec's target arch (tests/test_compile.py compiles specs for it).
    from spec_sample import PLANS
    targets = {path.stem: plan.target.arch for path, plan in PLANS.items()}
    assert not [(e.spec, e.arch) for e in entries if targets[e.spec] != e.arch]
    result = CliRunner().invoke(main, ["check", "--json"], catch_exceptions=False)
    data = json.loads(result.output)
    assert data["dispatch"] and not [d for d in data["dispatch"] if "problem" in d]


def test_table_round_trips(tmp_path):
    entries = load_table(TABLE)
    path = tmp_path / "table.yaml"
    path.write_text(dump_table(entries, "header"))
    assert sorted(map(repr, load_table(path))) == sorted(map(repr, entries))


def test_an_unquoted_comma_in_an_entry_is_named_not_a_traceback(tmp_path):
    """`measured: report.json 512,0` in a flow mapping splits into a key 0: the error names the
    entry and the keys, as for any unknown key."""
    path = tmp_path / "table.yaml"
    path.write_text("entries:\n  - {call: backward, arch: sm_90, dtype: fp16, head_dim: 64, mask: window, "
                    "spec: h100_bwd_d64_window, measured: r.json window 512,0}\n")
    with pytest.raises(SpecError) as info:
        load_table(path)
    assert info.value.key == "entries[0]" and "unknown key(s) 0" in info.value.message
    assert "needs quotes" in info.value.message


def test_select_buckets_and_group_rows():
    entries = (Entry("forward", "sm_90", "fp16", 64, "none", "short", upto=1024),
               Entry("forward", "sm_90", "fp16", 64, "none", "long"),
               Entry("decode", "sm_90", "fp16", 128, "none", "fused", max_group_rows=4),
               Entry("decode", "sm_90", "fp16", 128, "none", "kernel"))
    assert select(entries, "forward", "sm_90", "fp16", 64, "none", 1024).spec == "short"
    assert select(entries, "forward", "sm_90", "fp16", 64, "none", 1025).spec == "long"
    assert select(entries, "decode", "sm_90", "fp16", 128, "none", 8192, group_rows=4).spec == "fused"
    assert select(entries, "decode", "sm_90", "fp16", 128, "none", 8192, group_rows=8).spec == "kernel"
    with pytest.raises(LookupError, match="(?s)no forward kernel for sm_90 fp16 head_dim 80.*attngen bench"):
        select(entries, "forward", "sm_90", "fp16", 80, "none", 10)


def test_window_entries_route_by_width():
    """A window entry with max_window serves windows of at most that many keys a row sees (left + 1 + right,
    a causal call's right 0); wider windows, unbounded sides and calls that give no width take the key's
    other entries. gpt-oss's 127-key window (sinks, d64) goes to the two-warpgroup cell, a 4095-key window to
    the three-warpgroup one (docs/performance/variants.md)."""
    from attngen.core.variants import window_keys
    assert window_keys(True, (127, 0)) == 128 and window_keys(True, (127, 5)) == 128   # causal closes the right
    assert window_keys(False, (64, 63)) == 128 and window_keys(False, (127, -1)) is None
    assert window_keys(True, (-1, 0)) is None and window_keys(True, None) is None
    entries = (Entry("forward", "sm_90", "bf16", 64, "window", "narrow", max_window=128),
               Entry("forward", "sm_90", "bf16", 64, "window", "wide"))
    def pick(window):
        return select(entries, "forward", "sm_90", "bf16", 64, "window", 16384, window=window).spec
    assert pick(128) == "narrow" and pick(1) == "narrow"
    assert pick(129) == "wide" and pick(None) == "wide"
    table = load_table(TABLE)
    for dtype, suffix in (("bf16", "_bf16"), ("fp16", "")):
        def served(window, seqlen=16384):
            return select(table, "forward", "sm_90", dtype, 64, "window", seqlen, scores="sink", window=window).spec
        assert served(window_keys(True, (127, 0))) == f"h100_wgmma_d64_persistent_q2_sink{suffix}"
        assert served(window_keys(True, (127, 0)), 512) == f"h100_wgmma_d64_persistent_q2_sink{suffix}"
        assert served(window_keys(True, (4095, 0))) == f"h100_wgmma_d64_persistent_q2_c3_sink_lazy{suffix}"
        assert served(None) == f"h100_wgmma_d64_persistent_q2_c3_sink_lazy{suffix}"


def test_a_variant_calls_kernel_key_holds_its_window_width():
    """forward_variant resolves a kernel once per key: two windows of other widths are two keys (the table
    may serve them apart), a causal call with no window has none."""
    torch = pytest.importorskip("torch")
    from attngen.ops.library import _variant_kernel_key
    q = torch.empty(1, 8, 64, 64, dtype=torch.bfloat16)
    def key(causal, window):
        return _variant_kernel_key(q, q, q, causal, "bhsd", window, None, None, None)
    # the width is the key's next-to-last field (the last: whether the one-row route may take the call)
    assert key(True, (127, 0))[3] == "window" and key(True, (127, 0))[-2] == 128
    assert key(True, (127, 0)) != key(True, (4095, 0))
    assert key(True, None)[-2] is None and key(True, (-1, 0))[3] == "causal"


def test_a_report_rewriting_a_key_keeps_its_window_width_bucket():
    """`attngen dispatch --from REPORT --write` replaces a key's entries with the report's winners; the key's
    max_window entry stays unless the new entries bring one of their own."""
    from attngen.eval.dispatch_table import merge
    narrow = Entry("forward", "sm_90", "bf16", 64, "window", "narrow", scores="sink", max_window=128)
    old = Entry("forward", "sm_90", "bf16", 64, "window", "old", scores="sink")
    new = Entry("forward", "sm_90", "bf16", 64, "window", "new", scores="sink")
    assert merge([narrow, old], [new]) == [narrow, new]
    narrower = narrow._replace(spec="narrower", max_window=64)
    assert merge([narrow, old], [new, narrower]) == [new, narrower]


def test_max_window_is_refused_off_a_window_entry(tmp_path):
    path = tmp_path / "table.yaml"
    path.write_text("entries:\n  - {call: forward, arch: sm_90, dtype: fp16, head_dim: 64, mask: causal, "
                    "spec: h100_wgmma_d64, max_window: 128}\n")
    with pytest.raises(SpecError) as info:
        load_table(path)
    assert info.value.key == "entries[0].max_window" and "window call" in info.value.message


def test_contiguous_decode_routes_by_group_and_grid():
    """The committed table's contiguous d128 decode: the cell whose last block merges its slices (one launch)
    serves KV heads of at most 4 query rows and grids of 1024 rows and more; its twin that merges a warp's rows
    two at a time (contiguous_pairs) serves KV heads of more rows up to 16k keys and calls of fewer than 32 query
    rows; the combine-kernel cell (two launches, about 4 us more host time per call) serves the rest, where it is
    faster on the GPU and eager alike (H200: docs/decode-h200/routing/)."""
    entries = load_table(TABLE)
    for dtype, suffix in (("bf16", "_bf16"), ("fp16", "")):
        merging, kernel = f"h200_decode_d128_contiguous{suffix}", f"h200_decode_d128{suffix}"
        pairs = f"h200_decode_d128_contiguous_pairs{suffix}"
        for mask in ("none", "causal"):
            def pick(seqlen, group_rows, rows):
                return select(entries, "decode", "sm_90", dtype, 128, mask, seqlen, group_rows=group_rows,
                              rows=rows).spec
            assert pick(16384, 8, 64) == pairs and pick(4096, 32, 32) == pairs          # up to 16k keys, 8+ rows
            assert pick(4096, 4, 32) == merging and pick(16384, 1, 8) == merging        # 4 rows or fewer a KV head
            assert pick(32768, 4, 32) == merging and pick(131072, 4, 4096) == merging   # 32/8 heads, one token
            assert pick(32768, 8, 16) == pairs                                           # B2 8/1
            assert pick(32768, 8, 32) == kernel and pick(32768, 32, 1023) == kernel      # B4 8/1, B1 32/1, ...
            assert pick(32768, 16, 1024) == merging                                      # B8 32/8, 4 new tokens
            assert pick(32768, 8, None) == pairs                                         # no grid size given
    # d64: by group rows at every length; e4m3 caches and paged calls keep their entries
    assert select(entries, "decode", "sm_90", "bf16", 64, "none", 32768, group_rows=8,
                  rows=64).spec == "h200_decode_d64_contiguous_pairs_bf16"
    assert select(entries, "decode", "sm_90", "bf16", 64, "none", 32768, group_rows=4,
                  rows=64).spec == "h200_decode_d64_contiguous_bf16"
    assert select(entries, "decode_kv_e4m3", "sm_90", "fp16", 128, "none", 32768, group_rows=8,
                  rows=64).spec == "h200_decode_d128_kv_e4m3_contiguous_pairs"
    assert select(entries, "decode_kv_e4m3", "sm_90", "fp16", 128, "none", 16384, group_rows=4,
                  rows=64).spec == "h200_decode_d128_kv_e4m3_contiguous"
    # past 16384 keys, 64-127 rows of 4 per KV head: the paged-capable cell (docs/decode-h200/e4m3_b1/)
    assert select(entries, "decode_kv_e4m3", "sm_90", "fp16", 128, "none", 32768, group_rows=4,
                  rows=64).spec == "h200_decode_d128_kv_e4m3"
    assert select(entries, "decode", "sm_90", "bf16", 128, "none", 8192, paged=True, group_rows=8,
                  rows=8).spec == "h200_decode_d128_bf16"


def test_merge_rows_pairs_only_in_the_cells_that_ask():
    """merge_rows 2 renders combine_rows and the pair loop; the other merging cells keep the one-row loop
    (their code unchanged), and a combine-kernel cell refuses the key."""
    generated = ROOT / "generated"
    pairs = (generated / "h200_decode_d128_contiguous_pairs_split.cu").read_text()
    plain = (generated / "h200_decode_d128_contiguous_split.cu").read_text()
    assert "combine_rows(p, pair, 2" in pairs and "combine_rows" not in plain
    from attngen.errors import SpecError
    from attngen.plan import make_plan
    from attngen.spec import load_spec
    spec = load_spec(ROOT / "specs/h200_decode_d128_bf16.yaml").model_copy(update={"merge_rows": 2})
    with pytest.raises(SpecError, match="merge_rows 2 needs a split kernel that merges"):
        make_plan(spec, "x.yaml")


def test_head_dim_v_is_part_of_the_key():
    """A call whose V has its own head dim (MLA: 192 / 128) finds only entries of that head_dim_v;
    a plain call never gets them; the refusal names head_dim_v. Bench shapes take it as a 5th number."""
    from attngen.eval.bench import Case, parse_shape
    entries = (Entry("forward", "sm_90", "fp16", 192, "none", "plain"),
               Entry("forward", "sm_90", "fp16", 192, "none", "mla", head_dim_v=128))
    assert select(entries, "forward", "sm_90", "fp16", 192, "none", 4096).spec == "plain"
    assert select(entries, "forward", "sm_90", "fp16", 192, "none", 4096, head_dim_v=128).spec == "mla"
    with pytest.raises(LookupError, match="head_dim 192 head_dim_v 96 mask none"):
        select(entries, "forward", "sm_90", "fp16", 192, "none", 4096, head_dim_v=96)
    assert parse_shape("4x16x2048x192x128") == (4, 16, 2048, 192, 128) and parse_shape("1x2x3x64x64") == (1, 2, 3, 64)
    c = Case(4, 16, 2048, 192, "fp16", False, 128)
    assert c.label == "4x16x2048x192x128 fp16" and c.flops == 2.0 * 4 * 16 * 2048 * 2048 * (192 + 128)
    assert Case(4, 16, 2048, 64, "fp16", True).flops == 4.0 * 4 * 16 * 2048 * 2048 * 64 / 2


def test_dispatch_command_explains_and_refuses():
    run = CliRunner().invoke(main, ["dispatch", "--head-dim", "64", "--causal", "--seqlen", "4096"])
    assert run.exit_code == 0 and "-> h100_wgmma_d64" in run.output and "why:" in run.output
    run = CliRunner().invoke(main, ["dispatch", "--head-dim", "200", "--arch", "sm_89"])   # nothing served above
    assert run.exit_code == 2 and "has no forward kernel" in run.output
    # a head dim below a served one runs padded to it: the line says so, --json gives the padded head dim
    run = CliRunner().invoke(main, ["dispatch", "--head-dim", "59", "--arch", "sm_90", "--causal"])
    assert run.exit_code == 0 and "head_dim 59 causal" in run.output, run.output
    assert "-> h100_wgmma_d64" in run.output and "(q, k and v zero-padded to head_dim 64)" in run.output
    run = CliRunner().invoke(main, ["dispatch", "--head-dim", "224", "--arch", "sm_90", "--call", "backward", "--json"])
    assert run.exit_code == 0 and json.loads(run.output)["padded_head_dim"] == 256
    run = CliRunner().invoke(main, ["dispatch", "--head-dim", "64", "--arch", "sm_90", "--json"])
    assert json.loads(run.output)["padded_head_dim"] is None
    run = CliRunner().invoke(main, ["dispatch", "--write"])
    assert run.exit_code == 2 and "--from" in run.output


def test_dispatch_command_names_the_one_row_route():
    """A forward call's explanation says where a call of a few query rows goes instead (the decode call,
    ops.library.OneRowDecode: up to ATTENTION.one_row_max_rows) where the decode table serves the head dim, and gives
    the command that shows its kernel; one row with a variant (softcap, sinks, ALiBi, a window) from the work
    threshold on, at the call's own head dim where the decode table has its variant there; not for a V head dim of its
    own, or another call."""
    run = CliRunner().invoke(main, ["dispatch", "--head-dim", "128", "--seqlen", "4096"])
    assert run.exit_code == 0 and "few query rows: attngen.attention runs the decode call" in run.output, run.output
    assert "attngen dispatch --call decode --dtype fp16 --head-dim 128 --seqlen 4096 --group-rows" in run.output
    decode = CliRunner().invoke(main, ["dispatch", "--call", "decode", "--dtype", "fp16", "--head-dim", "128",
                                       "--seqlen", "4096", "--group-rows", "4"])
    assert decode.exit_code == 0 and "-> h200_decode_d128" in decode.output, decode.output
    assert json.loads(CliRunner().invoke(main, ["dispatch", "--head-dim", "64", "--causal", "--json"]).output)[
        "one_query_row"].startswith("attngen.attention runs the decode call")
    padded = CliRunner().invoke(main, ["dispatch", "--head-dim", "112", "--dtype", "bf16"])   # runs at d128
    assert "few query rows" in padded.output and "--call decode --dtype bf16 --head-dim 128" in padded.output
    assert "up to 8 query rows per head" in run.output
    for args, named in ((["--scores", "softcap", "--causal"], "softcap"), (["--scores", "sink", "--causal"], "sink"),
                        (["--scores", "alibi"], "alibi"), (["--window", "--window-keys", "1024", "--causal"], "window")):
        variant = CliRunner().invoke(main, ["dispatch", "--dtype", "bf16", *args])
        assert "few query rows" in variant.output and f"one query row with {named} where batch x query heads x " \
            "the keys it sees reach 131,072" in variant.output, (args, variant.output)
    # sinks beside softcap: no decode kernel holds both, so the softcap kernel runs with the sinks joined after it,
    # as ops.library's route runs it
    joined = CliRunner().invoke(main, ["dispatch", "--dtype", "bf16", "--scores", "softcap+sink", "--causal"])
    assert "one query row with softcap+sink where" in joined.output, joined.output
    # d96's variant forward runs padded to d128, but the route takes the call at d96 first, where the decode table has
    # the variant (forward_variant asks before padding); a head dim with no decode cells of its own: the padded one
    # (whatever its work there: the forward would copy q, k and v padded)
    for dim, runs_at, where in (("96", "96", "softcap, whatever its work (the forward would pad the call)"),
                                ("112", "128", "softcap where batch x query heads x the keys it sees reach 131,072")):
        run = CliRunner().invoke(main, ["dispatch", "--dtype", "bf16", "--head-dim", dim, "--scores", "softcap"])
        assert "(q, k and v zero-padded to head_dim 128)" in run.output and f"one query row with {where}" in \
            run.output and f"--call decode --dtype bf16 --head-dim {runs_at} " in run.output, run.output
    window = CliRunner().invoke(main, ["dispatch", "--dtype", "bf16", "--head-dim", "96", "--window", "--causal"])
    assert "(q, k and v zero-padded" not in window.output and "one query row with window where batch x query " \
        "heads x the keys it sees reach 131,072" in window.output, window.output   # d96's own window kernel
    for args in (["--head-dim-v", "128", "--head-dim", "192"], ["--call", "backward"]):
        run = CliRunner().invoke(main, ["dispatch", "--dtype", "bf16", *args])
        assert run.exit_code == 0 and "few query rows" not in run.output, (args, run.output)
    # a variant the decode table lacks at the head dim (none in the shipped table now: a table without d64's softcap)
    from attngen.cli.dispatch import one_row_text
    entries = [e for e in load_table(table_path(Path(__file__).parent.parent / "specs"))
               if not (e.call == "decode" and e.head_dim == 64 and "softcap" in e.scores)]
    assert one_row_text(entries, "forward", "sm_90", "bf16", 64, 0, "none", "softcap", 2048) == ""
    assert "one query row with alibi" in one_row_text(entries, "forward", "sm_90", "bf16", 64, 0, "none", "alibi", 2048)


def test_dispatch_command_says_when_a_call_launches_an_awaiting_twin():
    """A forward spec with awaiting twins: the line names the twin, the rule, and with --rows which one this call
    launches (the twin up to 4x16x2048x2048 scores, causal halved); a spec without them has no such line."""
    def run(*args):
        result = CliRunner().invoke(main, ["dispatch", "--dtype", "bf16", "--head-dim", "128", *args])
        assert result.exit_code == 0, result.output
        return result.output
    short = run("--causal", "--seqlen", "2048", "--rows", str(4 * 16 * 2048))
    assert "launch: attngen_h100_wgmma_d128_persistent_q2_kmpb_bf16_causal_awaits" in short
    assert "this call: the twin" in short
    assert "this call: the usual function" in run("--seqlen", "8192", "--rows", str(2 * 16 * 8192))
    assert "launch:" not in run("--causal", "--seqlen", "16384", "--scores", "softcap")   # h100_wgmma_d128_softcap_bf16
    as_json = json.loads(run("--seqlen", "1024", "--json"))
    assert as_json["launch"].startswith("attngen_h100_wgmma_d128_persistent_q2_kmpb_bf16_none_awaits")


def test_table_from_bench_reports(tmp_path):
    from attngen.eval.dispatch_table import forward_entries, read_reports
    reports = read_reports([ROOT / "docs/hopper-h200/round3/grid_fp16.json"])
    new = forward_entries(reports)
    d64 = sorted((e for e in new if e.head_dim == 64 and e.mask == "none"), key=lambda e: e.upto or 1e9)
    assert [e.upto for e in d64] == [1024, 4096, None]
    assert all(e.us <= e.runner_up_us for e in new)


def test_a_later_report_remeasures_a_cell():
    """Two reports that measure the same cell (key, seqlen and grid): the later one's ranking makes
    the entry, the earlier one's other cells stay."""
    from attngen.eval.dispatch_table import forward_entries, read_reports
    grid, walk = read_reports([ROOT / "docs/hopper-h200/round3/grid_fp16.json",
                               ROOT / "docs/hopper-h200/round4/walk_dispatch.json"])

    def d64_none(reports):
        return sorted(((e.upto, e.min_rows, e.spec, e.measured.split()[0]) for e in forward_entries(reports)
                       if e.head_dim == 64 and e.mask == "none" and e.dtype == "fp16"),
                      key=lambda t: (t[0] or 1e9, t[1] or 0))
    before = d64_none([grid])
    assert [t[:3] for t in before] == [(1024, None, "h100_wgmma_d64_n128c1hs2oet"), (4096, None, "h100_wgmma_d64"),
                                       (None, None, "h100_wgmma_d64")]
    assert {t[3] for t in d64_none([grid, walk])} == {walk[0]}    # walk measures every cell grid does, and more
    # the other way round, grid's cells (1x8x512, 4x16x2048, 2x16x8192) replace walk's; walk's others stay
    mixed = d64_none([walk, grid])
    assert [t[3] == grid[0] for t in mixed] == [True, False, False, False, False, False, True, True]
    assert mixed[-2][:3] == (4096, 46340, "h100_wgmma_d64") and mixed[-1] == before[-1]


def test_a_bucket_splits_by_grid_where_its_winner_does():
    """Cells of one seqlen on grids of different size (batch x heads) with different winners: the
    small grids' winner serves every call, the large grids' one calls from the geometric mean of the
    rows between them, unless it wins by no more than the split margin; select takes the largest
    min_rows a call reaches."""
    from attngen.eval.dispatch_table import forward_entries, read_reports
    entries = forward_entries(read_reports([ROOT / "docs/hopper-h200/round4/walk_dispatch.json"]))
    d64 = sorted(((e.upto, e.min_rows, e.spec) for e in entries
                  if e.head_dim == 64 and e.mask == "none" and e.dtype == "fp16"), key=lambda t: (t[0] or 1e9, t[1] or 0))
    small, large = "h100_wgmma_d64_n128c1hs2oet", "h100_wgmma_d64_persistent_q2"
    c3 = "h100_wgmma_d64_persistent_q2_c3"
    # 512 keys: 1x8 (4096 rows) against 16x16 (131072); 1024: 1x8, 2x16, 8x16 (8192, 32768, 131072);
    # 2048: 1x8 (16384) against 4x16 (131072); 8192: 2x16 only
    assert d64 == [(724, None, small), (724, 23170, c3), (1448, None, small), (1448, 16384, large),
                   (1448, 65536, c3), (4096, None, large), (4096, 46340, c3), (None, None, c3)]
    for rows, spec in ((8 * 1024, small), (16384, large), (65535, large), (16 * 16 * 1024, c3), (None, small)):
        assert select(entries, "forward", "sm_90", "fp16", 64, "none", 1024, rows=rows).spec == spec
    assert select(entries, "forward", "sm_90", "fp16", 64, "none", 2048, rows=8 * 2048).spec == large
    assert select(entries, "forward", "sm_90", "fp16", 64, "none", 600, rows=10**6).spec == c3
    # causal 2048 keys: c3 wins 4x16 by 0.9 % (100.2 against 101.1 us), within the margin: no split
    causal = [(e.upto, e.min_rows, e.spec) for e in entries
              if e.head_dim == 64 and e.mask == "causal" and e.dtype == "fp16" and e.upto == 4096]
    assert causal == [(4096, None, large)]
    # remeasured after three-warpgroup turns skip hidden tiles: c3 wins 4x16x2048 causal by 5 %, so
    # the bucket splits at 46340 rows (1x8 stays with the two-warpgroup spec)
    entries = forward_entries(read_reports([ROOT / "docs/hopper-h200/round4/walk_dispatch.json",
                                            ROOT / "docs/hopper-h200/round4/turns_d64_causal.json"]))
    causal = [(e.upto, e.min_rows, e.spec) for e in entries
              if e.head_dim == 64 and e.mask == "causal" and e.dtype == "fp16" and e.upto == 4096]
    assert causal == [(4096, None, large), (4096, 46340, c3)]


def test_write_from_a_sweep_report_refuses_uncommitted_winners(tmp_path, monkeypatch):
    """A sweep report's winners become entries only when they are committed specs."""
    import shutil
    specs = tmp_path / "specs"
    shutil.copytree(ROOT / "specs", specs)
    sweep = ROOT / "docs/hopper-h200/round2/sweep_d64.json"
    run = CliRunner().invoke(main, ["dispatch", "--from", str(sweep), "--write", "--specs-dir", str(specs)])
    assert run.exit_code == 2 and "not in" in run.output and "--write-best" in run.output
    monkeypatch.chdir(ROOT)            # the table cites reports relative to the working directory
    bench = "docs/hopper-h200/round3/grid_fp16.json"
    short = "docs/hopper-h100/round4_persistent_q2_dispatch.json"   # the d128 cells of 1024 keys (H100)
    walk = "docs/hopper-h200/round4/walk_dispatch.json"   # remeasures 2048-key cells of `bench` (H200)
    long = "docs/hopper-h200/round4/walk_d128_long.json"   # d128 at 8192 and 16384 keys (H200)
    turns = "docs/hopper-h200/round4/turns_d64_causal.json"   # d64 causal after the empty turns (H200)
    small = "docs/hopper-h200/round4/persistent_c1_d64_grid.json"   # d64 with the one-consumer persistent spec
    chains = "docs/hopper-h200/round4/max_chains_d64_causal.json"   # d64 causal with a row max in four chains
    # d128 from 1024 keys with P at the kept max in two buffers (H100; its 1x16x16384 bf16 full cell left out)
    kmpb = "docs/hopper-h200/kept_max_first/p_buffers_h100/walk_kmpb_from1024.json"
    # d64 causal on the three-warpgroup cell with lazy_rescale alone (H200), where the three-warpgroup cell won
    lazy = "docs/hopper-h200/kept_max_first/members/h200/made/d64_causal_lazy.json"
    # d128 full masks at 256 keys (small and large grids) and 16x16x512 with the block's rows of O written out beside
    # the next block's first S (H100): its member serves from 363 keys
    io = "docs/hopper-h200/item_overlap/h100/io_dispatch.json"
    # d128 causal at 384 keys (H100): the non-persistent ppet cell ahead of persistent_q2 on every grid timed, where
    # a head's ramp of three query blocks leaves its middle block last
    ramps = "docs/hopper-h200/short_ramps/h100/ramps_d128.json"
    # d128 causal at 384 and 640 keys on 1x8 to 32x16 heads (H100), with two heads' middle query blocks in one unit
    # of the persistent walk (schedule.middle_pairs): its member serves the large grids of both odd ramps
    pairs = "docs/hopper-h200/middle_pairs/h100/pm_d128.json"
    # the same cells again once the member took L2 eviction hints (schedule.l2_hints); its trial members left out
    hints = "docs/hopper-h200/middle_pairs/h100/l2/pm_l2_d128_served.json"
    # d128 causal at 256 keys (two query blocks), where the 443-key bucket had reached: ppet from 46341 rows
    two = "docs/hopper-h200/middle_pairs/h100/l2/pm_d128_256.json"
    # d128 causal at 384 and 896 keys (H100) with the member whose walk may take an odd ramp's longest blocks alone
    alone = "docs/hopper-h200/short_first/h100/pm_la/pm_la_d128_bench.json"
    # d128 causal at 768-1408 keys (H100) with the member whose walk may deal the query blocks out in a snake
    snake = "docs/hopper-h200/short_first/h100/snake/snake_d128_bench.json"
    run = CliRunner().invoke(main, ["dispatch", "--from", bench, "--from", bench.replace("fp16", "bf16"),
                                    "--from", short, "--from", walk, "--from", long, "--from", turns, "--from", small,
                                    "--from", chains, "--from", kmpb, "--from", lazy, "--from", io, "--from", ramps, "--from", pairs, "--from", hints, "--from", two, "--from", alone, "--from", snake, "--write",
                                    "--specs-dir", str(specs)])
    assert run.exit_code == 0, run.output
    assert sorted(map(repr, load_table(table_path(specs)))) == sorted(map(repr, load_table(TABLE)))


def test_fp8_entries_rebuild_from_their_reports(tmp_path, monkeypatch):
    """The forward_fp8 entries are what their reports give, the later report winning a cell."""
    import shutil
    specs = tmp_path / "specs"
    shutil.copytree(ROOT / "specs", specs)
    monkeypatch.chdir(ROOT)            # the table cites reports relative to the working directory
    reports = ("docs/fp8-h200/bench_wgmma_fp8.json", "docs/fp8-h200/bench_wgmma_fp8_d128_sweep.json",
               "docs/fp8-h200/bench_fp8_persistent.json", "docs/fp8-h200/bench_fp8_d64_persistent.json",
               "docs/fp8-h200/tile_trials/bench_fp8_pingpong_chains.json",   # d128 full masks up to 4096 keys
               "docs/fp8-h200/k_rows/bench_fp8_keo_d64.json", "docs/fp8-h200/k_rows/bench_fp8_keo_d128.json")   # k_rows
    run = CliRunner().invoke(main, ["dispatch", *[a for r in reports for a in ("--from", r)], "--write",
                                    "--specs-dir", str(specs)])
    assert run.exit_code == 0, run.output
    assert sorted(map(repr, load_table(table_path(specs)))) == sorted(map(repr, load_table(TABLE)))


def test_score_modifiers_are_part_of_the_key():
    """A softcap call finds only softcap entries, a plain call never does, and the refusal names the
    modifiers; `attngen check` refuses an entry whose spec applies other modifiers."""
    from attngen.ops.table import entry_problem
    from attngen.plan import make_plan
    from attngen.spec import parse_spec
    entries = (Entry("forward", "sm_90", "fp16", 128, "causal", "plain"),
               Entry("forward", "sm_90", "fp16", 128, "causal", "capped", scores="softcap"))
    assert select(entries, "forward", "sm_90", "fp16", 128, "causal", 4096).spec == "plain"
    assert select(entries, "forward", "sm_90", "fp16", 128, "causal", 4096, scores="softcap").spec == "capped"
    with pytest.raises(LookupError, match="mask causal scores alibi"):
        select(entries, "forward", "sm_90", "fp16", 128, "causal", 4096, scores="alibi")
    plan = make_plan(parse_spec(spec_text(ROOT / "specs" / "h100_wgmma_d128_softcap.yaml")))
    assert entry_problem(Entry("forward", "sm_90", "fp16", 128, "causal", "h100_wgmma_d128_softcap",
                               scores="softcap"), plan) is None
    assert "applies scores [softcap], the entry []" in entry_problem(
        Entry("forward", "sm_90", "fp16", 128, "causal", "h100_wgmma_d128_softcap"), plan)


def test_window_calls_have_their_own_mask():
    from attngen.core.variants import call_mask
    assert call_mask(False, None) == "none" and call_mask(True, None) == "causal"
    assert call_mask(True, (-1, -1)) == "causal" and call_mask(True, (-1, 5)) == "causal"   # causal closes right
    assert call_mask(True, (256, 0)) == "window" and call_mask(False, (-1, 0)) == "window"
    assert call_mask(False, (-1, -1)) == "none"
    entries = load_table(TABLE)
    assert select(entries, "forward", "sm_90", "fp16", 128, "window", 8192).spec == "h100_wgmma_d128_window_persistent_kmpb"


def backward_bench_report() -> dict:
    """A backward bench report (`attngen bench --json` on backward specs), made by hand: d64 fp16
    at two seqlens, both masks, beside SDPA (never an entry)."""
    def result(seqlen, causal, times):
        case = {"batch": 1, "heads": 16, "seqlen": seqlen, "head_dim": 64, "dtype": "fp16", "causal": causal,
                "head_dim_v": 0, "call": "backward"}
        return {"case": case, "label": f"1x16x{seqlen}x64 fp16{' causal' if causal else ''}",
                "timings": [{"impl": impl, "median_us": us, "status": "ok" if us else "wrong"}
                            for impl, us in times]}
    return {"gpu": "NVIDIA H200", "environment": {}, "call": "backward", "results": [
        result(2048, False, [("h100_bwd_d64", 300.0), ("h100_bwd_d64_varlen", 310.0), ("sdpa:flash", 200.0)]),
        result(8192, False, [("h100_bwd_d64", 4000.0), ("h100_bwd_d64_varlen", 3900.0), ("sdpa:flash", 3000.0)]),
        result(8192, True, [("h100_bwd_d64", 2100.0), ("h100_bwd_d64_varlen", None), ("sdpa:flash", 1500.0)])]}


def test_backward_entries_from_a_backward_bench_report():
    """A backward bench report gives `call: backward` entries bucketed by seqlen as forward ones are
    (attngen specs only, fastest first); a forward report gives none, and a backward one no forward entry."""
    from attngen.eval.dispatch_table import backward_entries, bench_entries, entries_summary, forward_entries
    reports = [("bwd.json", backward_bench_report())]
    new = backward_entries(reports)
    assert new == [Entry("backward", "sm_90", "fp16", 64, "none", "h100_bwd_d64", upto=4096, us=300.0,
                         runner_up="h100_bwd_d64_varlen", runner_up_us=310.0, measured="bwd.json 1x16x2048x64 fp16"),
                   Entry("backward", "sm_90", "fp16", 64, "none", "h100_bwd_d64_varlen", us=3900.0,
                         runner_up="h100_bwd_d64", runner_up_us=4000.0, measured="bwd.json 1x16x8192x64 fp16"),
                   Entry("backward", "sm_90", "fp16", 64, "causal", "h100_bwd_d64", us=2100.0,
                         measured="bwd.json 1x16x8192x64 fp16 causal")]
    assert forward_entries(reports) == [] and bench_entries(reports) == new
    grid = read_grid()
    assert backward_entries(grid) == [] and bench_entries(grid) == forward_entries(grid)
    assert entries_summary(new) == "3 backward entries"
    assert entries_summary(forward_entries(grid)) == f"{len(forward_entries(grid))} forward entries"
    assert entries_summary(new + forward_entries(grid)[:2]) == "2 forward and 3 backward entries"


def varlen_bench_report(lengths, rows):
    """An `attngen bench --varlen --json` report, made by hand: d128 fp16 rows of (spec, causal, us
    or None for a failed check), beside torch's varlen flash (never an entry)."""
    batch = f"{len(lengths)} seqs ({sum(lengths)} tokens, {min(lengths)}-{max(lengths)}) H16"
    return {"gpu": "NVIDIA H200", "torch": "2.11", "lengths": lengths, "heads": [16, 16], "rows": [
        {"batch": batch, "causal": causal, "spec": spec, "dtype": "fp16", "head_dim": 128, "attngen_us": us,
         "flash_us": 2 * (us or 1.0), "status": "ok" if us else "wrong"} for spec, causal, us in rows]}


def test_varlen_entries_from_varlen_bench_reports():
    """Varlen bench reports give `call: varlen` entries keyed by each batch's longest sequence and
    bucketed as forward ones are; a failed spec is no entry, and other reports give none."""
    from attngen.eval.dispatch_table import bench_entries, forward_entries, varlen_entries
    reports = [("short.json", varlen_bench_report([100, 2048], [("a", False, 50.0), ("b", False, 40.0),
                                                                ("a", True, 30.0), ("b", True, None)])),
               ("long.json", varlen_bench_report([1, 4096], [("a", False, 90.0), ("b", False, 95.0)]))]
    new = varlen_entries(reports)
    assert new == [Entry("varlen", "sm_90", "fp16", 128, "none", "b", upto=2896, us=40.0, runner_up="a",
                         runner_up_us=50.0, measured="short.json 2 seqs (2148 tokens, 100-2048) H16"),
                   Entry("varlen", "sm_90", "fp16", 128, "none", "a", us=90.0, runner_up="b", runner_up_us=95.0,
                         measured="long.json 2 seqs (4097 tokens, 1-4096) H16"),
                   Entry("varlen", "sm_90", "fp16", 128, "causal", "a", us=30.0,
                         measured="short.json 2 seqs (2148 tokens, 100-2048) H16")]
    assert forward_entries(reports) == [] and bench_entries(reports) == new
    assert varlen_entries(read_grid()) == []


def read_grid():
    from attngen.eval.dispatch_table import read_reports
    return read_reports([ROOT / "docs/hopper-h200/round3/grid_fp16.json"])


def test_write_from_a_backward_bench_report(tmp_path):
    """`attngen dispatch --from REPORT --write` replaces the backward entries of the report's keys
    and keeps every other entry."""
    import shutil
    specs = tmp_path / "specs"
    shutil.copytree(ROOT / "specs", specs)
    report = tmp_path / "bwd.json"
    report.write_text(json.dumps(backward_bench_report()))
    run = CliRunner().invoke(main, ["dispatch", "--from", str(report), "--write", "--specs-dir", str(specs)])
    assert run.exit_code == 0, run.output
    assert run.stdout.endswith(": 3 backward entries from 1 report(s)\n"), run.output
    assert "measured by other reports were replaced" in run.stderr     # the keys' committed entries
    written = load_table(table_path(specs))
    mine = [e for e in written if e.measured and e.measured.startswith(str(report))]
    assert {(e.call, e.mask, e.upto, e.spec) for e in mine} == {("backward", "causal", None, "h100_bwd_d64"),
                                                                ("backward", "none", 4096, "h100_bwd_d64"),
                                                                ("backward", "none", None, "h100_bwd_d64_varlen")}
    replaced = {("backward", "sm_90", "fp16", 64, m) for m in ("none", "causal")}
    kept = [e for e in load_table(TABLE) if (e.call, e.arch, e.dtype, e.head_dim, e.mask) not in replaced
            or e.scores]
    assert sorted(map(repr, written)) == sorted(map(repr, kept + mine))


def test_an_unserved_head_dim_pads_to_the_smallest_served_above(monkeypatch):
    """A call of a head dim the table serves no kernel of runs at the smallest head dim above it that the
    table serves for that call, arch and dtype (attngen.ops.library pads q, k and v); a served head dim,
    a V of its own head dim, or one above every served head dim pads to nothing (0)."""
    import types
    import attngen.runtime as runtime
    from attngen.ops.dispatch import Dispatcher
    monkeypatch.setattr(runtime, "device_info", lambda index: types.SimpleNamespace(arch="sm_90"))
    dispatcher = Dispatcher()
    served = {(e.call, e.dtype, e.head_dim) for e in dispatcher.entries if e.arch == "sm_90" and not e.head_dim_v}

    def expected(call, dtype, d):
        above = sorted(h for c, t, h in served if c == call and t == dtype and h > d)
        return 0 if (call, dtype, d) in served or not above else above[0]
    for call in ("forward", "backward", "varlen", "varlen_backward", "decode"):
        for dtype in ("fp16", "bf16"):
            for d in (8, 24, 59, 64, 72, 111, 128, 200, 224, 256, 288):
                assert dispatcher.padded_head_dim(call, 0, dtype, d, d) == expected(call, dtype, d), (call, dtype, d)
    assert dispatcher.padded_head_dim("forward", 0, "fp16", 59, 59) == 64
    assert dispatcher.padded_head_dim("forward", 0, "bf16", 111, 111) == 128
    assert dispatcher.padded_head_dim("backward", 0, "fp16", 224, 224) == 256
    assert dispatcher.padded_head_dim("decode", 0, "fp16", 111, 111) == 128
    assert dispatcher.padded_head_dim("forward", 0, "fp16", 64, 64) == 0
    assert dispatcher.padded_head_dim("forward", 0, "fp16", 300, 300) == 0
    assert dispatcher.padded_head_dim("forward", 0, "fp16", 59, 48) == 0       # V of its own head dim: no padding


def test_a_v_head_dim_of_its_own_pads_to_the_cheapest_served_pair(monkeypatch):
    """A call whose V head dim differs from q's runs at a served pair at or above both (q and k padded
    to the first, v to the second), the one with the fewest columns; its own pair served: None; a
    call of one head dim pads as padded_head_dim does."""
    import types
    import attngen.runtime as runtime
    from attngen.ops.dispatch import Dispatcher
    from attngen.ops.table import Entry, padded_dims
    monkeypatch.setattr(runtime, "device_info", lambda index: types.SimpleNamespace(arch="sm_90"))
    dispatcher = Dispatcher()
    assert dispatcher.padded_dims("forward", 0, "fp16", 128, 64) is None           # h100_wgmma_d128_v64
    assert dispatcher.padded_dims("forward", 0, "fp16", 192, 128) is None
    assert dispatcher.padded_dims("forward", 0, "fp16", 96, 64) == (96, 96)         # V padded alone
    assert dispatcher.padded_dims("forward", 0, "bf16", 256, 128) == (256, 256)
    assert dispatcher.padded_dims("backward", 0, "fp16", 64, 128) == (128, 128)     # q and k padded
    assert dispatcher.padded_dims("varlen_backward", 0, "fp16", 192, 128) == (256, 256)
    assert dispatcher.padded_dims("varlen_backward", 0, "fp16", 128, 64) == (128, 128)
    assert dispatcher.padded_dims("forward", 0, "fp16", 59, 59) == (64, 64)
    assert dispatcher.padded_dims("forward", 0, "fp16", 300, 128) is None           # nothing above
    for d in (8, 59, 64, 111, 224, 288):      # one head dim: padded_head_dim's answer, as a pair
        got = dispatcher.padded_dims("backward", 0, "fp16", d, d)
        assert (got[0] if got else 0) == dispatcher.padded_head_dim("backward", 0, "fp16", d, d)
    # a pair entry is taken where it costs fewer columns than one head dim for all three
    entries = [Entry(call="forward", arch="sm_90", dtype="fp16", head_dim=128, mask="none", spec="a", head_dim_v=64),
               Entry(call="forward", arch="sm_90", dtype="fp16", head_dim=128, mask="none", spec="b")]
    assert padded_dims(entries, "forward", "sm_90", "fp16", 100, 48) == (128, 64)
    assert padded_dims(entries, "forward", "sm_90", "fp16", 100, 100) == (128, 128)
    assert padded_dims(entries, "forward", "sm_90", "fp16", 100, 80) == (128, 128)


def test_a_variant_missing_at_its_head_dim_pads_to_one_that_has_it(monkeypatch):
    """With the call's mask and score modifiers, a head dim whose kernels lack them runs at the smallest
    head dim above that has them: a window backward at d80 at 96, a softcap backward at d32 at 64, a
    windowed decode at d32 at a served decode head dim with a window; a variant served at its own head dim
    and one served nowhere above pad to nothing; the table's own picks agree (ops.table.select)."""
    import types
    import attngen.runtime as runtime
    from attngen.ops.dispatch import Dispatcher
    monkeypatch.setattr(runtime, "device_info", lambda index: types.SimpleNamespace(arch="sm_90"))
    dispatcher = Dispatcher()
    entries = dispatcher.entries

    def serves(call, d, mask, scores, paged=None):
        return any(e.call == call and e.arch == "sm_90" and e.dtype == "bf16" and e.head_dim == d and not e.head_dim_v
                   and e.mask == mask and e.scores == scores and (paged is None or e.paged == paged) for e in entries)
    for call, d, mask, scores, paged in (("backward", 80, "window", "", None),
                                         ("backward", 32, "causal", "softcap", None),
                                         ("decode", 32, "window", "", False), ("forward", 160, "causal", "softcap", None),
                                         ("varlen", 80, "causal", "softcap", False)):
        assert not serves(call, d, mask, scores, paged), (call, d, mask, scores)
        to = dispatcher.padded_head_dim(call, 0, "bf16", d, d, mask, scores, paged)
        assert to > d and serves(call, to, mask, scores, paged), (call, d, mask, scores, to)
        assert not any(serves(call, h, mask, scores, paged) for h in range(d + 1, to)), (call, d, to)
        select(entries, call, "sm_90", "bf16", to, mask, 2048, scores=scores, paged=bool(paged))   # no LookupError
    assert dispatcher.padded_head_dim("backward", 0, "bf16", 80, 80, "window", "") == 96
    assert dispatcher.padded_head_dim("backward", 0, "bf16", 96, 96, "window", "") == 0       # d96's window cell
    assert dispatcher.padded_head_dim("backward", 0, "bf16", 32, 32, "causal", "softcap") == 64
    assert dispatcher.padded_head_dim("backward", 0, "bf16", 128, 128, "window", "") == 0      # served there
    assert dispatcher.padded_head_dim("forward", 0, "bf16", 128, 128, "causal", "sink") == 0   # nothing above has it
    assert dispatcher.padded_head_dim("backward", 0, "bf16", 96, 96) == 0    # without a mask: any entry serves it


def test_every_key_a_shipped_spec_serves_has_an_entry():
    """No shipped spec serves a key the table lacks (a cell no call could reach): `attngen dispatch
    --serve SPEC --write` adds such keys, unmeasured, when a family gains a member."""
    from attngen.core.spec_cells import in_lab
    from attngen.eval.dispatch_table import serving_entries
    from spec_sample import PLANS
    missing = serving_entries([plan for path, plan in PLANS.items() if not in_lab(path)], load_table(TABLE))
    assert not missing, [f"{e.spec}: {e.call} {e.dtype} {e.head_dim} {e.mask} {e.scores}" for e in missing]


def test_serve_adds_the_keys_of_a_new_member(tmp_path):
    """A member whose entries are missing (as when a family file gains one): --serve lists its keys
    without writing, --write adds exactly them, unmeasured; a second run adds nothing."""
    import shutil
    shutil.copytree(ROOT / "specs", tmp_path / "specs")
    table = tmp_path / "specs" / "dispatch" / "table.yaml"
    full = load_table(table)
    member = {"h100_wgmma_d256_sink", "h100_wgmma_d256_sink_bf16"}
    kept = [e for e in full if e.spec not in member]
    assert len(full) - len(kept) == 6       # forward, masks none / causal / window, fp16 and bf16
    table.write_text(dump_table(kept, "a copy"))
    runner = CliRunner()
    args = ["dispatch", "--specs-dir", str(tmp_path / "specs"), "--serve", str(ROOT / "specs" / "h100_wgmma_d256.yaml")]
    listed = runner.invoke(main, args)
    assert listed.exit_code == 0, listed.output
    assert listed.output.count("-> h100_wgmma_d256_sink") == 6 and "--write adds them" in listed.output
    assert len(load_table(table)) == len(kept)
    written = runner.invoke(main, args + ["--write", "--json"])
    assert written.exit_code == 0, written.output
    added = json.loads(written.output)
    assert {a["spec"] for a in added} == member and all(a["us"] is None for a in added)
    assert sorted(e.key() for e in load_table(table)) == sorted(e.key() for e in full)
    again = runner.invoke(main, args)
    assert again.exit_code == 0 and "no entries" in again.output
    both = runner.invoke(main, args + ["--from", str(table), "--write"])
    assert both.exit_code != 0 and "one at a time" in both.output


def test_coverage_says_served_padded_or_refused_per_head_dim():
    """--coverage: a kernel of the head dim (d256), padded to the next served one (d224, as the entry
    points run it; a paged varlen call with its pools copied, an appending decode with its caches copied
    and written back), refused where nothing at or above the head dim serves the call."""
    run = CliRunner().invoke(main, ["dispatch", "--coverage", "--dtype", "bf16", "--json"])
    assert run.exit_code == 0, run.output
    rows = {(r["call"], r["paged"], r["scores"], r["mask"]): r["head_dims"] for r in json.loads(run.output)["rows"]}
    plain = rows[("forward", False, "", "causal")]
    assert plain["256"] == "served" and plain["224"] == "padded" and plain["59"] == "padded"
    assert rows[("varlen", True, "", "causal")]["160"] == "padded"
    assert rows[("decode_append", False, "", "causal")]["160"] == "padded"     # d256's append kernel
    assert rows[("decode_kv_e4m3", False, "", "causal")]["96"] == "served"     # Phi-3's head dim has e4m3 cells
    assert rows[("decode_kv_e4m3", False, "", "causal")]["80"] == "refused"    # an e4m3 cache is not padded
    assert rows[("decode_append", True, "", "causal")]["80"] == "padded"
    assert rows[("decode", True, "softcap", "window")]["96"] == "served"
    assert rows[("decode", True, "softcap", "window")]["80"] == "padded"
    assert rows[("decode", True, "softcap+alibi", "window")]["128"] == "served"
    # learned sinks beside modifiers no sink kernel has: that kernel, the sinks joined after it
    assert rows[("decode", False, "alibi+sink", "causal")]["96"] == "sinks after"
    assert rows[("forward", False, "softcap+alibi+sink", "causal")]["96"] == "padded"   # the *_sink members
    assert rows[("decode", True, "softcap+alibi+sink", "window")]["256"] == "sinks after"
    assert ("forward", False, "sink", "causal") in rows and rows[("forward", False, "sink", "causal")]["64"] == "served"
    # non-causal ALiBi's varlen backward at d256 runs its window function (ops.library.varlen_backward_mask)
    assert rows[("varlen_backward", False, "alibi", "none")]["256"] == "window"
    assert rows[("varlen_backward", False, "alibi", "causal")]["256"] == "served"
    text = CliRunner().invoke(main, ["dispatch", "--coverage", "--dtype", "bf16"]).output
    assert "Y: a kernel of that head dim" in text and "\nforward " in text


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_decode_calls_pass_their_rows_to_the_table(monkeypatch, layout):
    """The decode call keys the table on its query rows per KV head and its query rows (batch x heads x new
    tokens), in either layout: without rows every call would silently keep the entry for any grid size."""
    pytest.importorskip("torch", reason="attngen.ops.library imports torch (the gpu extra)")
    from attngen.ops import library

    class Shaped:   # stands in for a CUDA tensor: a shape and a device index
        def __init__(self, *shape):
            self.shape, self.dtype = shape, "bf16"

        def get_device(self):
            return 0

    seen = {}
    monkeypatch.setattr(library.DISPATCH, "kernel", lambda *a, **kw: seen.update(kw, seqlen=a[5]) or "kernel")
    b, h, hkv, sq, sk, d = 3, 32, 4, 2, 40000, 128
    q = Shaped(b, h, sq, d) if layout == "bhsd" else Shaped(b, sq, h, d)
    k_cache = Shaped(b, hkv, sk, d) if layout == "bhsd" else Shaped(b, sk, hkv, d)
    assert library._decode_kernel(q, k_cache, None, "causal", layout) == "kernel"
    assert (seen["rows"], seen["group_rows"], seen["seqlen"], seen["paged"]) == (b * h * sq, h // hkv * sq, sk, False)


def test_table_ab_reads_another_table_and_records_the_specs(monkeypatch, tmp_path):
    """attngen.eval.table_ab, the table A/B scripts' helper: a Dispatcher made after read_table_from(path) answers
    from that file, and record_specs() lists the spec of each entry it resolves, in call order."""
    import types
    import attngen.runtime as runtime
    from attngen.eval.table_ab import read_table_from, record_specs
    from attngen.ops import dispatch
    monkeypatch.setattr(runtime, "device_info", lambda index: types.SimpleNamespace(arch="sm_90"))
    monkeypatch.setattr(dispatch, "load_table", dispatch.load_table)     # both helpers patch; undone after the test
    monkeypatch.setattr(dispatch.Dispatcher, "entry", dispatch.Dispatcher.entry)
    monkeypatch.setattr(dispatch.DISPATCH, "_entries", None)    # as in a process before its first call
    entries = [e for e in load_table(table_path(Path(__file__).parent.parent / "specs"))
               if not (e.call == "forward" and e.arch == "sm_90" and e.dtype == "bf16" and e.head_dim == 96
                       and e.mask == "window")]
    other = tmp_path / "table.yaml"
    other.write_text(dump_table(entries, "a table without d96 forward windows"))
    seen = record_specs()
    assert dispatch.Dispatcher().entry("forward", 0, "bf16", 96, "window", 2048).spec == "h100_wgmma_d96_window_bf16"
    read_table_from(str(other))
    with pytest.raises(LookupError):
        dispatch.Dispatcher().entry("forward", 0, "bf16", 96, "window", 2048)
    dispatch.Dispatcher().entry("forward", 0, "bf16", 128, "window", 2048)
    assert seen[0] == "h100_wgmma_d96_window_bf16" and len(seen) == 2 and "d128" in seen[1]
    dispatch.DISPATCH._entries = []     # loaded: too late to change the table
    with pytest.raises(RuntimeError, match="before the first attngen call"):
        read_table_from(str(other))


def test_write_warns_when_it_drops_entries_other_reports_measured(tmp_path, monkeypatch):
    """`attngen dispatch --from ONE --write` rewrites every entry of the report's keys: the entries other reports
    measured for those keys go, and the command says so on stderr, naming the reports to give with --from; given
    every report of those keys, it says nothing."""
    import shutil
    specs = tmp_path / "specs"
    shutil.copytree(ROOT / "specs", specs)
    monkeypatch.chdir(ROOT)            # the table cites reports relative to the working directory
    lazy = "docs/hopper-h200/kept_max_first/members/h200/made/d64_causal_lazy.json"
    run = CliRunner().invoke(main, ["dispatch", "--from", lazy, "--write", "--specs-dir", str(specs)])
    assert run.exit_code == 0, run.output
    assert "warning:" in run.stderr and "measured by other reports were replaced" in run.stderr
    assert "docs/hopper-h200/" in run.stderr and "--from" in run.stderr
    from attngen.eval.dispatch_table import dropped_elsewhere
    old = Entry("forward", "sm_90", "bf16", 64, "causal", "a", us=1.0, measured="r1.json 1x1x1x64")
    new = Entry("forward", "sm_90", "bf16", 64, "causal", "b", us=1.0, measured="r2.json 1x1x1x64")
    assert dropped_elsewhere([old], [new], {"r2.json"}) == {"r1.json": 1}
    assert dropped_elsewhere([old], [new], {"r1.json", "r2.json"}) == {}


def test_paged_entries_split_by_page_size():
    """A paged entry with min_page serves calls of that page size and up; smaller pages (and a call that names
    no page size) take the entry without one. The committed table sends paged varlen prefill of pages of 16 and
    more at d128 to the Hopper kind's paged member, pages of 1 to 8 to the mma.sync cell, which the Hopper member
    trails there (one TMA copy per key; docs/hopper-h200/paged_varlen/)."""
    gather = Entry("varlen", "sm_90", "bf16", 128, "causal", "gather", paged=True)
    copies = Entry("varlen", "sm_90", "bf16", 128, "causal", "copies", paged=True, min_page=16)
    whole = Entry("varlen", "sm_90", "bf16", 128, "causal", "whole", paged=True, min_page=256)
    table = (gather, copies, whole)
    picks = {page: select(table, "varlen", "sm_90", "bf16", 128, "causal", 4096, paged=True, page=page).spec
             for page in (None, 1, 8, 16, 128, 256, 512)}
    assert picks == {None: "gather", 1: "gather", 8: "gather", 16: "copies", 128: "copies", 256: "whole",
                     512: "whole"}
    entries = load_table(TABLE)
    for page, spec in ((1, "h100_mma_d128_paged_bf16"), (8, "h100_mma_d128_paged_bf16"),
                       (16, "h100_wgmma_d128_varlen_paged_bf16"), (512, "h100_wgmma_d128_varlen_paged_bf16")):
        assert select(entries, "varlen", "sm_90", "bf16", 128, "causal", 4096, paged=True, page=page).spec == spec


@pytest.mark.parametrize("extra,problem", [("mask: causal, spec: s, min_page: 16", "this entry is not paged"),
                                          ("mask: causal, spec: s, paged: true, min_page: 24", "a power of two"),
                                          ("mask: causal, spec: s, paged: true, min_page: 1024", "a power of two")])
def test_min_page_is_a_paged_entrys_page_size(tmp_path, extra, problem):
    path = tmp_path / "table.yaml"
    path.write_text("entries:\n  - {call: varlen, arch: sm_90, dtype: fp16, head_dim: 128, " + extra + "}\n")
    with pytest.raises(SpecError) as info:
        load_table(path)
    assert info.value.key == "entries[0].min_page" and problem in info.value.message
