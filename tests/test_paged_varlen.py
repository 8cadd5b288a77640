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
    # pages of 1 to 8 keys: the mma.sync cell's gather; from 16 the Hopper kind's member (min_page 16)
    for pg, cell in ((1, "h100_mma_d128_paged"), (8, "h100_mma_d128_paged"), (16, "h100_wgmma_d128_varlen_paged"),
                     (512, "h100_wgmma_d128_varlen_paged")):
        result = runner.invoke(main, ["dispatch", "--call", "varlen", "--head-dim", "128", "--causal", "--page-size",
                                      str(pg)])
        assert result.exit_code == 0 and f"-> {cell}\n" in result.output, result.output
        assert ("pages >= 16" in result.output) and ("<- chosen" in result.output)
    result = runner.invoke(main, ["dispatch", "--call", "varlen", "--head-dim", "64", "--page-size", "24"])
    assert result.exit_code != 0 and "power of two" in result.output
    result = runner.invoke(main, ["dispatch", "--call", "varlen", "--head-dim", "64", "--dtype", "bf16"])
    assert result.exit_code == 0 and "_paged" not in result.output.splitlines()[0]


# -- the call's prepared path, on stand-in tensors ----------------------------------------------------

def paged_kernel(name="h100_mma_d128_paged", monkeypatch=None, launch=False):
    """A ForwardKernel of the spec's plan whose launches are recorded instead of run; launch: of the plan its
    committed launch record gives (a LaunchPlan, what the dispatcher loads) rather than the planner's."""
    import types

    from attngen.shipped import committed_launch

    from attngen.runtime.calls import forward, varlen
    from test_merge import HALF, FakeTensor, recording_kernel
    from test_kv_append import I32, fake_torch
    torch = fake_torch()
    torch.argsort = lambda t, **kw: types.SimpleNamespace(to=lambda dtype: FakeTensor(t.shape[:1], I32))
    plan = committed_launch(SPECS / f"{name}.yaml")[0] if launch else plan_of(name)
    k = recording_kernel(forward.ForwardKernel, plan, HALF, torch)
    if monkeypatch is not None:
        monkeypatch.setattr(varlen, "error_word", lambda index: 1 << 42)
    k._setup()
    return k


def test_a_repeated_paged_varlen_call_is_a_prepared_launch_with_its_own_addresses(monkeypatch):
    """The second paged varlen call of a layout takes the prepared path (no checks, no Params laid out):
    the first call's Params with this call's q, k, v, out, offsets, order, block table and seqused_k
    patched in; another layout (a wider table), or validate=True, takes the full path."""
    import struct

    from attngen.runtime.calls import varlen
    from test_merge import HALF
    from test_kv_append import I32
    from test_kv_append import Tensor

    k = paged_kernel(monkeypatch=monkeypatch)
    k._tensor_type = Tensor
    full = []
    first_check = varlen.check_offsets
    monkeypatch.setattr(varlen, "check_offsets", lambda *a, **kw: full.append(1) or first_check(*a, **kw))
    batch, heads, kv_heads, d, pages, page = 4, 16, 4, 128, 64, 16

    def args(cols=8):
        return dict(q=Tensor((40, heads, d), HALF), k=Tensor((pages, page, kv_heads, d), HALF),
                    v=Tensor((pages, page, kv_heads, d), HALF), cu_seqlens_q=Tensor((batch + 1,), I32),
                    block_table=Tensor((batch, cols), I32), seqused_k=Tensor((batch,), I32))

    def launched_params(prepared, pointers):   # the Params a launch gets: the template with its pointers patched
        params = bytearray(prepared.template)
        prepared.patch.pack_into(params, 0, pointers)
        return {f.name: v for f, v in zip(k.plan.abi.fields, struct.unpack(k.plan.abi.struct_format(), bytes(params)))}

    calls = [args(), args()]
    for a in calls:
        k.varlen(a["q"], a["k"], a["v"], a["cu_seqlens_q"], None, block_table=a["block_table"],
                 seqused_k=a["seqused_k"], max_seqlen_q=16, causal=True)
    (p1, pointers1), (p2, pointers2) = k.launched
    assert p2 is p1 and len(full) == 1 and len(k._prepared) == 1
    for a, pointers in zip(calls, (pointers1, pointers2)):
        got = launched_params(p1, pointers)
        for field in ("q", "k", "v", "cu_seqlens_q", "block_table", "seqused_k"):
            assert got[field] == a[field].data_ptr(), field
        assert got["seq_order"] not in (0, a["seqused_k"].data_ptr()) and got["cu_seqlens_k"] == 0
        assert (got["num_pages"], got["page_size"], got["page_shift"], got["table_cols"]) == (pages, page, 4, 8)
        assert got["o"] not in (0, a["q"].data_ptr())
    assert pointers1 != pointers2
    a = args(cols=12)                       # another table width: prepared anew
    k.varlen(a["q"], a["k"], a["v"], a["cu_seqlens_q"], None, block_table=a["block_table"], seqused_k=a["seqused_k"],
             max_seqlen_q=16, causal=True)
    assert len(full) == 2 and launched_params(*k.launched[-1])["table_cols"] == 12
    a = args()
    a["q"] = Tensor(a["q"].shape, HALF, ptr=a["q"].data_ptr() + 8)     # q off 16-byte alignment: the full path
    with pytest.raises(ValueError, match="align"):
        k.varlen(a["q"], a["k"], a["v"], a["cu_seqlens_q"], None, block_table=a["block_table"],
                 seqused_k=a["seqused_k"], max_seqlen_q=16, causal=True)


def test_a_paged_call_takes_its_blocks_order_from_order_by(monkeypatch):
    """order_by=(seqused_k, cu_seqlens_k) names the key counts the blocks are ordered by (a serving step's
    caller's, shared by its layers); without it the call's own; one of another batch is refused."""
    from attngen.runtime.calls import shared
    from test_merge import HALF
    from test_kv_append import I32
    from test_kv_append import Tensor

    k = paged_kernel(monkeypatch=monkeypatch)
    k._tensor_type = Tensor
    sorted_ = []
    monkeypatch.setattr(shared, "longest_first_by_count", lambda torch, t: sorted_.append(t) or Tensor(t.shape, I32))
    args = dict(q=Tensor((40, 16, 128), HALF), k=Tensor((64, 16, 4, 128), HALF), v=Tensor((64, 16, 4, 128), HALF),
                cu_seqlens_q=Tensor((5,), I32))
    own, callers = Tensor((4,), I32), Tensor((4,), I32)
    for order_by, want in ((None, own), ((callers, None), callers)):
        for _ in range(2):     # the second call is prepared: it orders by the same tensor
            k.varlen(args["q"], args["k"], args["v"], args["cu_seqlens_q"], None, block_table=Tensor((4, 8), I32),
                     seqused_k=own, max_seqlen_q=16, causal=True, order_by=order_by)
        assert sorted_[-1] is want      # (the second call's order comes from the first's, cached by address)
    with pytest.raises(ValueError, match="order_by"):
        k.varlen(args["q"], args["k"], args["v"], args["cu_seqlens_q"], None, block_table=Tensor((4, 8), I32),
                 seqused_k=own, max_seqlen_q=16, causal=False, order_by=(Tensor((3,), I32), None))


def _paged_call_kit(monkeypatch):
    """A recording paged kernel, a counter of full-path calls, and makers of a call's arguments."""
    from attngen.runtime.calls import varlen
    from test_merge import F32, HALF
    from test_kv_append import I32
    from test_kv_append import Tensor

    k = paged_kernel(monkeypatch=monkeypatch)
    k._tensor_type = Tensor
    k._torch.empty = lambda shape, dtype=None, device=None: Tensor(shape, dtype or HALF)
    k._torch.device = lambda *a: None
    from attngen.runtime.calls import shared
    monkeypatch.setattr(shared, "longest_first", lambda torch, cu: Tensor((cu.shape[0] - 1,), I32))
    full = []       # one entry per call that took the full path (it works out the page shift once)
    first_shift = varlen.page_shift
    monkeypatch.setattr(varlen, "page_shift", lambda *a, **kw: full.append(1) or first_shift(*a, **kw))

    def args(pages=64, batch=4):
        return dict(q=Tensor((400, 16, 128), HALF), k=Tensor((pages, 16, 4, 128), HALF),
                    v=Tensor((pages, 16, 4, 128), HALF), cu_seqlens_q=Tensor((batch + 1,), I32),
                    block_table=Tensor((batch, 8), I32), seqused_k=Tensor((batch,), I32))

    def call(a, **kw):
        kw = {"max_seqlen_q": 16, "causal": True, **kw}
        return k.varlen(a["q"], a["k"], a["v"], a["cu_seqlens_q"], kw.pop("cu_seqlens_k", None),
                        block_table=a["block_table"], seqused_k=kw.pop("seqused_k", a["seqused_k"]), **kw)
    return k, full, args, call, Tensor, (HALF, F32, I32)


@pytest.mark.parametrize("change", ["lengths from cu_seqlens_k", "a caller's out", "another pool", "max_seqlen_q",
                                    "return_lse", "a window"])
def test_a_paged_call_that_differs_in_its_key_is_prepared_anew(change, monkeypatch):
    """Each part of the key matters: a call that differs from a prepared one in it takes the full path (and
    is then prepared itself), with its own values in the Params."""
    k, full, args, call, Tensor, (HALF, F32, I32) = _paged_call_kit(monkeypatch)
    call(args())
    call(args())
    assert len(full) == 1
    a, kw = args(), {}
    if change == "lengths from cu_seqlens_k":
        kw = {"seqused_k": None, "cu_seqlens_k": Tensor((5,), I32)}
    elif change == "a caller's out":
        kw = {"out": Tensor((400, 16, 128), HALF)}
    elif change == "another pool":
        a = args(pages=96)
    elif change == "max_seqlen_q":
        kw = {"max_seqlen_q": 300}
    elif change == "return_lse":
        kw = {"return_lse": True}
    else:
        kw = {"window": (64, 0)}      # causal as before: only the variant key differs
    for _ in range(2):
        result = call(a, **kw)
    assert len(full) == 2 and len(k._prepared) == 2, "not prepared anew, or not prepared"
    (prepared, pointers) = k.launched[-1]
    params = bytearray(prepared.template)
    prepared.patch.pack_into(params, 0, pointers)
    import struct
    got = {f.name: v for f, v in zip(k.plan.abi.fields, struct.unpack(k.plan.abi.struct_format(), bytes(params)))}
    if change == "lengths from cu_seqlens_k":
        assert got["seqused_k"] == 0 and got["cu_seqlens_k"] == kw["cu_seqlens_k"].data_ptr()
    elif change == "a caller's out":
        assert got["o"] == kw["out"].data_ptr() and result is kw["out"]
    elif change == "another pool":
        assert got["num_pages"] == 96
    elif change == "max_seqlen_q":
        assert launched_grid(prepared)[0] > launched_grid(k.launched[0][0])[0]
    elif change == "return_lse":
        assert got["lse"] == result[1].data_ptr() != 0
    else:
        assert (got["window_lo"], got["window_hi"]) == (-64, 0)   # lo as an offset from the row


def launched_grid(prepared):
    (_name, grid), = prepared.launches
    return grid


@pytest.mark.parametrize("which", ["seqused_k", "cu_seqlens_k"])
def test_lengths_of_a_bad_layout_are_refused_after_a_prepared_call(which, monkeypatch):
    """The lengths tensors' layouts are part of the key: after a call with good ones, int64 lengths of the same
    shape are refused by the full path's checks, not launched from the prepared one."""
    k, full, args, call, Tensor, (HALF, F32, I32) = _paged_call_kit(monkeypatch)
    from test_merge import Dtype
    a = args()
    shape = (4,) if which == "seqused_k" else (5,)
    call(a, cu_seqlens_k=Tensor((5,), I32))
    call(a, cu_seqlens_k=Tensor((5,), I32))
    launched = len(k.launched)
    with pytest.raises(TypeError, match=which):
        call(a, **{"cu_seqlens_k": Tensor((5,), I32), which: Tensor(shape, Dtype(name="int64", size=8))})
    assert len(k.launched) == launched


@pytest.mark.parametrize("what", ["lse_out", "misaligned k", "misaligned v", "misaligned out"])
def test_paged_calls_that_must_be_checked_take_the_full_path(what, monkeypatch):
    """A call that gives lse_out takes the full path every time; a misaligned k, v or out is not launched
    from the prepared path but refused by the full one."""
    k, full, args, call, Tensor, (HALF, F32, I32) = _paged_call_kit(monkeypatch)
    out = Tensor((400, 16, 128), HALF)
    call(args(), out=out) if what == "misaligned out" else call(args())
    a = args()
    if what == "lse_out":
        for _ in range(2):
            call(a, lse_out=Tensor((16, 400), F32), return_lse=True)
        assert len(full) == 3
        return
    launched = len(k.launched)
    if what == "misaligned out":
        with pytest.raises(ValueError, match="align"):
            call(a, out=Tensor(out.shape, HALF, ptr=out.data_ptr() + 8))
    else:
        name = what.split()[1]
        a[name] = Tensor(a[name].shape, HALF, ptr=a[name].data_ptr() + 8)
        with pytest.raises(ValueError, match="align"):
            call(a)
    assert len(k.launched) == launched     # refused by the full path's checks, not launched prepared


@pytest.mark.parametrize("bad", ["3 counts", "none", "offsets of 4", "another GPU", "int64"])
def test_a_bad_order_by_is_refused_on_the_prepared_path_too(bad, monkeypatch):
    """order_by is not part of the key: a prepared call checks it as the full path does (a wrong length
    would make the kernel read past it, or leave rows unwritten)."""
    k, full, args, call, Tensor, (HALF, F32, I32) = _paged_call_kit(monkeypatch)
    from test_merge import Dtype
    a = args()
    good = (Tensor((4,), I32), None)
    call(a, order_by=good)
    call(a, order_by=good)
    assert len(full) == 1
    order_by = {"3 counts": (Tensor((3,), I32), None), "none": (None, None), "offsets of 4": (None, Tensor((4,), I32)),
                "another GPU": (Tensor((4,), I32, device=1), None),
                "int64": (Tensor((4,), Dtype(name="int64", size=8)), None)}[bad]
    with pytest.raises(ValueError, match="order_by"):
        call(a, order_by=order_by)
    k._prepared.clear()
    with pytest.raises(ValueError, match="order_by"):
        call(a, order_by=order_by)


# -- the Hopper kind's paged call, on stand-in tensors ------------------------------------------------------

class RecordedMaps:
    """Stand-in ShapeMaps: records the map specs and views it is made with; a map's 'encoding' is 128 bytes of its
    tensor's address's low byte."""
    made: list = []

    def __init__(self, specs, views, pointer_names=("q", "k", "v", "o")):
        self.specs = specs
        self.order = tuple(pointer_names.index(s.tensor) for s in specs)
        RecordedMaps.made.append(self)

    def values(self, pointers):
        return tuple(bytes([pointers[at] % 251]) * 128 for at in self.order)


@pytest.mark.parametrize("launch", [False, True], ids=["planned", "launch_record"])
@pytest.mark.parametrize("page,box", [(1, 1), (16, 16), (128, 128), (512, 128)])
def test_a_hopper_paged_call_lays_out_maps_of_page_rows(monkeypatch, page, box, launch):
    """The Hopper member's paged call: its K and V maps copy min(page size, 128) rows of a page (the kernel's
    box_shift takes the same), its Params carry the table, lengths and page size but no pool strides (the maps hold
    them), and a repeated call of the layout patches its own tensors' maps and pointers in; alike from the planner's
    plan and from the launch record the dispatcher loads."""
    import struct

    from attngen.runtime import tma
    from test_merge import HALF
    from test_kv_append import I32
    from test_varlen_backward_prepared import Tensor

    monkeypatch.setattr(tma, "ShapeMaps", RecordedMaps)
    RecordedMaps.made = []
    k = paged_kernel("h100_wgmma_d128_varlen_paged", monkeypatch, launch)
    assert type(k.plan).__name__ == ("LaunchPlan" if launch else "ForwardPlan")
    k._tensor_type = Tensor
    names = {f.name for f in k.plan.abi.fields}
    assert {"block_table", "seqused_k", "page_size", "page_shift", "num_pages", "table_cols", "table_stride",
            "tma_q", "tma_k", "tma_v"} <= names
    assert not {"k_page_stride", "v_page_stride", "k", "v", "k_row_stride"} & names
    batch, pages = 4, 64

    def args():
        return dict(q=Tensor((40, 16, 128), HALF), k=Tensor((pages, page, 4, 128), HALF),
                    v=Tensor((pages, page, 4, 128), HALF), cu_seqlens_q=Tensor((batch + 1,), I32),
                    block_table=Tensor((batch, 8), I32), seqused_k=Tensor((batch,), I32))

    def launched_params(prepared, pointers):
        params = bytearray(prepared.template)
        prepared.patch.pack_into(params, 0, pointers)
        return {f.name: v for f, v in zip(k.plan.abi.fields, struct.unpack(k.plan.abi.struct_format(), bytes(params)))}

    calls = [args(), args()]
    for a in calls:
        k.varlen(a["q"], a["k"], a["v"], a["cu_seqlens_q"], None, block_table=a["block_table"],
                 seqused_k=a["seqused_k"], max_seqlen_q=16, causal=True, out=Tensor(a["q"].shape, HALF))
    assert len(RecordedMaps.made) == 1        # one layout: its maps made once
    boxes = {s.tensor: s.box_rows for s in RecordedMaps.made[0].specs}
    assert boxes["k"] == boxes["v"] == box and boxes["q"] == 128
    (p1, pointers1), (p2, pointers2) = k.launched
    assert p2 is p1
    for a, pointers in zip(calls, (pointers1, pointers2)):
        got = launched_params(p1, pointers)
        for field in ("cu_seqlens_q", "block_table", "seqused_k"):
            assert got[field] == a[field].data_ptr(), field
        for tensor in ("q", "k", "v"):
            assert got[f"tma_{tensor}"] == bytes([a[tensor].data_ptr() % 251]) * 128, tensor
        assert (got["num_pages"], got["page_size"], got["page_shift"], got["table_cols"]) == \
            (pages, page, page.bit_length() - 1, 8)
