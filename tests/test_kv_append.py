"""Appending new tokens in the decode call (FlashAttention's k=, v=, rotary_cos=, rotary_sin=,
cache_batch_idx=, cache_leftpad=) without a GPU: the spec key, the plan and its Params, the rendered
code, the dispatch table's decode_append call, the verify cases, and the call's argument checks and
packing on stand-in tensors (the GPU tests, test_gpu_kv_append.py, run the kernel)."""
from __future__ import annotations

import struct
import types
from pathlib import Path

import pytest

from attngen.core.decode_plan import APPEND_FIELDS
from attngen.plan import make_plan
from attngen.spec import load_spec
from test_merge import BF16, F32, HALF, Dtype, FakeTensor, contiguous, recording_kernel

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "specs"
GENERATED = ROOT / "generated"
APPEND_SPECS = ("h200_decode_d128_append", "h200_decode_d128_append_bf16", "h200_decode_d64_append",
                "h200_decode_d64_append_bf16", "h200_decode_d96_append", "h200_decode_d96_append_bf16",
                "h200_decode_d256_append", "h200_decode_d256_append_bf16",
                "h200_decode_d64_append_alibi", "h200_decode_d64_append_alibi_bf16", "h200_decode_d96_append_alibi",
                "h200_decode_d96_append_alibi_bf16",
                "h200_decode_d128_append_alibi", "h200_decode_d128_append_alibi_bf16",
                "h200_decode_d256_append_alibi", "h200_decode_d256_append_alibi_bf16")
I32 = Dtype(name="int32", size=4)


def plan_of(name: str):
    return make_plan(load_spec(SPECS / f"{name}.yaml"))


# -- spec, plan, Params ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", APPEND_SPECS)
def test_append_cells_carry_the_append_fields(name):
    plan = plan_of(name)
    names = {f.name for f in plan.abi.fields}
    assert plan.append and set(APPEND_FIELDS) <= names
    assert plan.paged and set(plan.masks) == {"none", "causal", "window"}


@pytest.mark.parametrize("name", APPEND_SPECS)
def test_only_d256_append_cells_with_score_modifiers_make_them_per_tile(name):
    """row_mods_per_tile: where Q is not held (d256) and the kernel appends, the rows' score modifiers are
    made at every tile (held, ALiBi's spilled with pages or a window); elsewhere they are held, as before."""
    plan = plan_of(name)
    assert plan.row_mods_per_tile == (name.startswith("h200_decode_d256_append_alibi"))
    source = (GENERATED / f"{name}_split.cu").read_text()
    loop = source[source.index("for (int i = 0; i < count; ++i)"):]
    if plan.row_mods_per_tile:
        assert "row_mods(c, p, lane)" in loop and "row_mods(c, p, lane)" not in source[:source.index(loop)]
    elif plan.score_variants:
        assert "row_mods(c, p, lane)" not in loop


def test_cells_without_append_have_no_append_fields_and_append_fields_come_last():
    """A decode cell without the key keeps the Params it had (no append field); in an append cell the
    append fields follow every other, so the others keep the offsets the list gives them."""
    for path in SPECS.glob("h200_decode_*.yaml"):
        plan = plan_of(path.stem)
        names = [f.name for f in plan.abi.fields]
        if plan.append:
            assert names[-len(APPEND_FIELDS):] == list(APPEND_FIELDS)
        else:
            assert not set(APPEND_FIELDS) & set(names)


def test_the_key_defaults_off():
    """Cells that do not set it (every decode cell but the append ones) keep append off; the rule that
    refuses an expression mask with it is in test_spec.RULE_CASES (rule_append_masks)."""
    assert not load_spec(SPECS / "h200_decode_d128.yaml").append
    assert not load_spec(SPECS / "h200_decode_d128_window.yaml").append
    assert load_spec(SPECS / "h200_decode_d128_append.yaml").append


def test_explain_names_the_append():
    from attngen.explain import explain
    text = explain(plan_of("h200_decode_d128_append"))
    assert "append:" in text and "cache_batch_idx" in text
    assert "append:" not in explain(plan_of("h200_decode_d128"))


# -- rendered code ---------------------------------------------------------------------------------

def test_only_append_cells_render_append_code():
    for path in GENERATED.glob("h200_decode_*_split.cu"):
        text = path.read_text()
        words = ("put_new_rows", "rotate_chunk", "p.k_new", "p.rotary_cos", "p.cache_batch_idx", "p.cache_leftpad")
        if "_append" in path.name:
            assert all(w in text for w in words), path.name
            assert "holds_new_rows(c, first + i)" in text and "load_q(smem, p, c, tid, kMask != Mask::None)" in text
        else:
            assert not any(w in text for w in words), path.name


def test_append_cells_write_the_cache_from_the_first_row_block_only():
    """One row block stores each new row; a sequence with a bad length, leftpad or cache row stores none,
    nor does a new row whose page id the table does not give (a clamped page is another sequence's)."""
    text = (GENERATED / "h200_decode_d128_append_split.cu").read_text()
    assert "if (c.row0 != 0 || c.cache_row < 0) continue;" in text
    assert "report_input_error(p, kBadPage);\n                continue;" in text
    assert "k_dst = head_ptr(p.k, page, c.kv_head" in text      # paged: through the table
    assert "+ c.key_base * p.k_row_stride" in text             # leftpad shifts the contiguous row


# -- dispatch --------------------------------------------------------------------------------------

def test_only_calls_with_new_tokens_route_to_append_cells():
    from attngen.ops.table import entry_problem, load_table, select, table_path
    entries = load_table(table_path(SPECS))
    append = [e for e in entries if e.call == "decode_append"]
    assert append and all(e.spec in APPEND_SPECS for e in append)
    assert not any(e.spec in APPEND_SPECS for e in entries if e.call != "decode_append")
    for head_dim in (64, 96, 128):
        for mask in ("none", "causal", "window"):
            for paged in (False, True):
                for dtype, suffix in (("fp16", ""), ("bf16", "_bf16")):
                    e = select(entries, "decode_append", "sm_90", dtype, head_dim, mask, 4096, paged=paged)
                    assert e.spec == f"h200_decode_d{head_dim}_append{suffix}"
                    plain = select(entries, "decode", "sm_90", dtype, head_dim, mask if mask != "window" else "causal",
                                   4096, paged=paged)
                    assert "append" not in plain.spec
    e = next(e for e in append if e.spec == "h200_decode_d128_append" and e.mask == "causal")
    assert entry_problem(e, plan_of(e.spec)) is None
    # an append spec named by a plain decode entry, and a plain spec by an append entry, are refused
    assert "appends new tokens" in entry_problem(e._replace(call="decode"), plan_of(e.spec))
    assert "need a spec with append: true" in entry_problem(e._replace(spec="h200_decode_d128"),
                                                            plan_of("h200_decode_d128"))


def test_dispatch_cli_shows_the_append_pick():
    from click.testing import CliRunner
    from attngen.cli import main
    result = CliRunner().invoke(main, ["dispatch", "--call", "decode_append", "--head-dim", "128", "--causal"])
    assert result.exit_code == 0 and "h200_decode_d128_append" in result.output, result.output


# -- verify cases ----------------------------------------------------------------------------------

@pytest.mark.parametrize("paged", (False, True))
def test_append_cases_are_valid_calls(paged):
    from attngen.eval.verify.decode import append_cases
    n = 128
    cases = append_cases(n, paged, window=True)
    assert any(c.rotary_dim and not c.interleaved for c in cases) and any(c.rotary_dim and c.interleaved for c in cases)
    assert any(c.batch_idx for c in cases) and any(c.leftpad for c in cases)
    assert any(c.page_size for c in cases) == paged and any(not c.page_size for c in cases)
    assert any(c.seqlen_new and c.seqlen_new < c.seqlen_q for c in cases)
    assert any((c.lengths[0] % n) + c.seqlen_new > n for c in cases)   # new tokens across a tile boundary
    for c in cases:
        assert c.appends and c.seqlen_new <= c.seqlen_q
        assert all(L + c.seqlen_new <= c.capacity for L in c.lengths), c.label
        if c.leftpad is not None:
            assert not c.page_size and all(0 <= p <= L for p, L in zip(c.leftpad, c.lengths))
        if c.page_size:
            assert not c.batch_idx
        for d in (64, 128):
            rd = min(d if c.rotary_dim < 0 else c.rotary_dim, d)
            assert rd % 2 == 0 and rd <= d


def test_verify_runs_append_cases_for_append_specs_only():
    from attngen.eval.verify.cases import FULL_SUITE
    from attngen.eval.verify.decode import verify_cases
    for name, expect in (("h200_decode_d128_append", True), ("h200_decode_d128", False)):
        plan = plan_of(name)
        kernel = types.SimpleNamespace(plan=plan, entry=plan.entry_functions)
        cases = verify_cases(kernel, FULL_SUITE, plan.masks)
        assert any(case.appends for _, _, case, _, _ in cases) == expect


# -- the call on stand-in tensors -------------------------------------------------------------------

def fake_torch():
    def empty(shape, dtype=None, device=None):
        return FakeTensor(shape, dtype or HALF)
    return types.SimpleNamespace(float32=F32, int32=I32, Tensor=FakeTensor, empty_like=lambda t: FakeTensor(t.shape, t.dtype),
                                 empty=empty, _C=types.SimpleNamespace(_cuda_isCurrentStreamCapturing=lambda: False,
                                                                        _cuda_getCurrentRawStream=lambda index: 0))


class Tensor(FakeTensor):
    def new_empty(self, shape, dtype=None):
        return FakeTensor(shape, dtype or self.dtype)


def decode_kernel(name="h200_decode_d128_append", dtype=HALF, monkeypatch=None):
    """A DecodeKernel of the spec's plan whose launches are recorded instead of run."""
    from attngen.runtime.calls import decode
    plan = plan_of(name)
    k = recording_kernel(decode.DecodeKernel, plan, dtype, fake_torch())
    k.functions = {name: types.SimpleNamespace(name=name, threads=128) for part in plan.parts
                   for _, name in part.functions}
    k._workspace = lambda index, floats: (1 << 40, None)   # (address, holder)
    k._counters = lambda n, index: (1 << 41, None)
    if monkeypatch is not None:
        monkeypatch.setattr(decode, "error_word", lambda index: 1 << 42)
    k._setup()
    return k


B, H, HKV, SQ, CAP, D = 2, 32, 8, 2, 1024, 128


def call_args(layout="bshd", new=2, rotary=64, dtype=HALF):
    bshd = layout == "bshd"
    q = Tensor((B, SQ, H, D) if bshd else (B, H, SQ, D), dtype)
    kc = Tensor((B, CAP, HKV, D) if bshd else (B, HKV, CAP, D), dtype)
    vc = Tensor(kc.shape, dtype)
    kn = Tensor((B, new, HKV, D) if bshd else (B, HKV, new, D), dtype)
    vn = Tensor(kn.shape, dtype)
    cos = Tensor((CAP, rotary // 2), dtype)
    sin = Tensor((CAP, rotary // 2), dtype)
    lens = Tensor((B,), I32)
    return dict(q=q, k_cache=kc, v_cache=vc, k=kn, v=vn, rotary_cos=cos, rotary_sin=sin, cache_seqlens=lens,
                layout=layout, causal=True)


def run(kernel, **kw):
    q, kc, vc = kw.pop("q"), kw.pop("k_cache"), kw.pop("v_cache")
    return kernel(q, kc, vc, **kw)


def params_of(kernel, prepared) -> dict:
    values = struct.unpack(kernel.plan.abi.struct_format(), prepared.template)
    return {f.name: v for f, v in zip(kernel.plan.abi.fields, values)}


@pytest.mark.parametrize("layout", ("bshd", "bhsd"))
def test_an_append_call_packs_the_new_tokens_into_one_launch(layout, monkeypatch):
    k = decode_kernel(monkeypatch=monkeypatch)
    args = call_args(layout)
    run(k, **args, rotary_interleaved=False)
    (prepared, _pointers), = k.launched
    assert len(prepared.launches) >= 1 and "split_causal" in prepared.launches[0][0]
    p = params_of(k, prepared)
    kn = args["k"]
    assert p["k_new"] == kn.data_ptr() and p["v_new"] == args["v"].data_ptr()
    assert p["rotary_cos"] == args["rotary_cos"].data_ptr() and p["rotary_sin"] == args["rotary_sin"].data_ptr()
    assert (p["seqlen_new"], p["rotary_dim"], p["rotary_interleaved"], p["cache_rows"]) == (2, 64, 0, B)
    st = kn.stride()
    want = (st[0], st[2], st[1]) if layout == "bshd" else (st[0], st[1], st[2])
    assert (p["k_new_batch_stride"], p["k_new_head_stride"], p["k_new_row_stride"]) == want
    assert p["cache_batch_idx"] == 0 and p["cache_leftpad"] == 0


@pytest.mark.parametrize("name", ("h200_decode_d128_append", "h200_decode_d256_append"))
def test_a_repeated_append_call_is_a_prepared_launch_with_its_own_addresses(name, monkeypatch):
    """The second append call of a layout takes the prepared path (no checks, no Params laid out): the
    first call's Params with this call's addresses patched in, the new tokens' and rotary tables' too; a
    call whose new tokens have another layout is prepared anew."""
    k = decode_kernel(name, monkeypatch=monkeypatch)
    d = k.plan.head_dim
    shape = lambda *s: s[:-1] + (d,)   # noqa: E731

    def args(new=2):
        a = call_args(new=new)
        for n in ("q", "k_cache", "v_cache", "k", "v"):
            a[n] = Tensor(shape(*a[n].shape), HALF)
        return a

    first, second = args(), args()
    for a in (first, second):
        a["cache_batch_idx"], a["cache_leftpad"] = Tensor((B,), I32), Tensor((B,), I32)
    run(k, **first)
    run(k, **second)
    (p1, pointers1), (p2, pointers2) = k.launched
    assert p2 is p1 and len(k._prepared) == 1

    def launched_params(prepared, pointers):   # the Params a launch gets: the template with its pointers patched
        params = bytearray(prepared.template)
        prepared.patch.pack_into(params, 0, pointers)
        return {f.name: v for f, v in zip(k.plan.abi.fields, struct.unpack(k.plan.abi.struct_format(), bytes(params)))}

    for call, pointers in ((first, pointers1), (second, pointers2)):
        got = launched_params(p1, pointers)
        for field, arg in (("q", "q"), ("k", "k_cache"), ("v", "v_cache"), ("cache_seqlens", "cache_seqlens"),
                           ("k_new", "k"), ("v_new", "v"), ("rotary_cos", "rotary_cos"), ("rotary_sin", "rotary_sin"),
                           ("cache_batch_idx", "cache_batch_idx"), ("cache_leftpad", "cache_leftpad")):
            assert got[field] == call[arg].data_ptr(), field
        assert got["seqlen_new"] == 2 and got["rotary_interleaved"] == 1
    assert first["k"].data_ptr() != second["k"].data_ptr()
    run(k, **args(new=1), cache_batch_idx=Tensor((B,), I32))     # one new token: another layout
    assert k.launched[-1][0] is not p1 and params_of(k, k.launched[-1][0])["seqlen_new"] == 1
    other = {**args(), "cache_batch_idx": Tensor((B,), I32), "cache_leftpad": Tensor((B,), I32)}
    run(k, **other, rotary_interleaved=False)                      # only the rotary pairing differs: prepared anew
    assert params_of(k, k.launched[-1][0])["rotary_interleaved"] == 0 and len(k._prepared) == 3
    odd = args()
    odd["k"] = Tensor(odd["k"].shape, HALF, ptr=odd["k"].data_ptr() + 8)   # new tokens off 16-byte alignment
    with pytest.raises(ValueError, match="aligned"):                # the full path checks and refuses them
        run(k, **odd)


def test_cache_batch_idx_lets_the_cache_have_more_rows(monkeypatch):
    k = decode_kernel(monkeypatch=monkeypatch)
    args = call_args()
    args["k_cache"] = Tensor((B + 3, CAP, HKV, D), HALF)
    args["v_cache"] = Tensor((B + 3, CAP, HKV, D), HALF)
    with pytest.raises(ValueError, match="k_cache and v_cache must both be"):
        run(k, **args)
    idx, pad = Tensor((B,), I32), Tensor((B,), I32)
    run(k, **args, cache_batch_idx=idx, cache_leftpad=pad)
    p = params_of(k, k.launched[-1][0])
    assert (p["cache_batch_idx"], p["cache_leftpad"], p["cache_rows"]) == (idx.data_ptr(), pad.data_ptr(), B + 3)


def test_an_append_spec_without_new_tokens_takes_batch_idx_alone(monkeypatch):
    k = decode_kernel(monkeypatch=monkeypatch)
    args = call_args()
    for name in ("k", "v", "rotary_cos", "rotary_sin"):
        args.pop(name)
    run(k, **args, cache_batch_idx=Tensor((B,), I32))
    p = params_of(k, k.launched[-1][0])
    assert (p["seqlen_new"], p["rotary_dim"], p["k_new"]) == (0, 0, 0)


def _bad(**change):
    def make():
        args = call_args()
        for key, value in change.items():
            if value is None:
                args.pop(key, None)
            else:
                args[key] = value() if callable(value) else value
        return args
    return make


BAD_CALLS = [
    (_bad(v=None), ValueError, "k and v (the new tokens) come together"),
    (_bad(rotary_sin=None), ValueError, "rotary_cos and rotary_sin come together"),
    (_bad(k=None, v=None), ValueError, "they need k and v"),
    (_bad(cache_seqlens=None), ValueError, "an append call needs cache_seqlens"),
    (_bad(k=lambda: Tensor((B, 3, HKV, D), HALF), v=lambda: Tensor((B, 3, HKV, D), HALF)), ValueError,
     "1 <= seqlen_new <= seqlen_q (2)"),
    (_bad(k=lambda: Tensor((B, 2, HKV // 2, D), HALF), v=lambda: Tensor((B, 2, HKV // 2, D), HALF)), ValueError,
     "kv_heads 8"),
    (_bad(k=lambda: Tensor((B, 2, HKV, D), BF16)), TypeError, "k is bfloat16"),
    (_bad(k=lambda: Tensor((B, 2, HKV, D), HALF, strides=(4096, 1024, 128, 2))), ValueError,
     "last dimension must be contiguous"),
    (_bad(rotary_cos=lambda: Tensor((CAP, 80), HALF), rotary_sin=lambda: Tensor((CAP, 80), HALF)), ValueError,
     "rotary_dim (160: 2 x rotary_cos.shape[1]) must be at most head_dim (128)"),
    (_bad(rotary_cos=lambda: Tensor((CAP - 1, 32), HALF), rotary_sin=lambda: Tensor((CAP - 1, 32), HALF)), ValueError,
     "hold 1023 positions, fewer than the cache's 1024 keys"),
    (_bad(rotary_cos=lambda: Tensor((CAP, 32), BF16)), TypeError, "rotary_cos must have q's dtype"),
    (_bad(rotary_sin=lambda: Tensor((CAP, 16), HALF)), ValueError, "must have one shape"),
    (_bad(rotary_cos=lambda: Tensor((CAP, 32), HALF, strides=(64, 2))), ValueError, "contiguous (seqlen_ro"),
    (_bad(cache_batch_idx=lambda: Tensor((B,), F32)), TypeError, "cache_batch_idx must be int32"),
    (_bad(cache_leftpad=lambda: Tensor((B + 1,), I32)), ValueError, "cache_leftpad must be a contiguous (2,) tensor"),
    (_bad(cache_leftpad=lambda: Tensor((B,), I32, device=1)), ValueError, "cache_leftpad is on cuda:1"),
]


@pytest.mark.parametrize("make, error, fragment", BAD_CALLS, ids=[str(i) for i in range(len(BAD_CALLS))])
def test_bad_append_arguments_are_refused_before_launch(make, error, fragment, monkeypatch):
    k = decode_kernel(monkeypatch=monkeypatch)
    with pytest.raises(error) as err:
        run(k, **make())
    assert fragment in str(err.value)
    assert not k.launched


def test_paged_append_refuses_batch_idx_and_leftpad(monkeypatch):
    k = decode_kernel(monkeypatch=monkeypatch)
    args = call_args()
    args["k_cache"] = Tensor((40, 16, HKV, D), HALF)
    args["v_cache"] = Tensor((40, 16, HKV, D), HALF)
    args["rotary_cos"] = Tensor((64 * 16, 32), HALF)
    args["rotary_sin"] = Tensor((64 * 16, 32), HALF)
    table = Tensor((B, 64), I32)
    for name in ("cache_batch_idx", "cache_leftpad"):
        with pytest.raises(ValueError, match="contiguous caches only"):
            run(k, **args, block_table=table, **{name: Tensor((B,), I32)})
    run(k, **args, block_table=table)
    p = params_of(k, k.launched[-1][0])
    assert (p["page_size"], p["seqlen_new"], p["block_table"]) == (16, 2, table.data_ptr())


def test_a_spec_without_append_refuses_new_tokens(monkeypatch):
    k = decode_kernel("h200_decode_d128", monkeypatch=monkeypatch)
    args = call_args()
    with pytest.raises(ValueError, match="does not append new tokens"):
        run(k, **args)
    for name in ("k", "v", "rotary_cos", "rotary_sin"):
        args.pop(name)
    run(k, **args)   # a plain call packs as before
    assert len(k.launched) == 1


def test_fake_tensor_strides_helper():
    assert contiguous((2, 3, 4)) == (12, 4, 1)
