"""The merge of partial results without a GPU: the kind's spec rules, its plan and Params, the rendered
source, the dispatch table's merge entries, and the merge call's argument checks and launches on
stand-in tensors (the checks and the Params packing are plain Python; the GPU tests run the kernel)."""
from __future__ import annotations

import struct
import types
from pathlib import Path

import pytest

from attngen.core.abi import array_bytes
from attngen.core.calls import MERGE, serving
from attngen.core.merge_plan import FORMS, form_key, max_parts_of
from attngen.errors import SpecError
from attngen.explain import explain
from attngen.kinds import kind_of
from attngen.ops.table import entry_problem, load_table, select, table_path
from attngen.plan import make_plan
from attngen.render import render_spec_file
from attngen.spec import load_spec, parse_spec

ROOT = Path(__file__).resolve().parent.parent
D128 = ROOT / "specs" / "h200_merge_d128.yaml"
HEAD = "schema: 1\nname: m\ntarget: h200\nmerge: by_lse\n"


# -- spec and plan ---------------------------------------------------------------------------------

def test_the_merge_key_picks_the_kind_and_its_convention():
    spec = load_spec(D128)
    kind = kind_of(spec)
    assert kind.name == "merge_lse" and kind.calls == MERGE.name and serving("merge") is MERGE


@pytest.mark.parametrize("text, key, words", [
    ("head_dim: 100\n", "head_dim", "multiple of 8"),
    ("head_dim: 128\nmax_parts: 17\n", "max_parts", "less than or equal to 16"),
    ("head_dim: 128\nwarps: 0\n", "warps", "greater than or equal to 1"),
    ("head_dim: 128\ntile: {block_m: 64, block_n: 64}\n", "tile", "merge: by_lse takes no tile"),
    ("head_dim: 128\ndtype: fp32\n", "dtype", "fp16"),
])
def test_a_bad_merge_spec_names_its_key(text, key, words):
    with pytest.raises(SpecError) as err:
        parse_spec(HEAD + text, "m.yaml")
    assert err.value.key == key and words in str(err.value)


def test_plan_has_a_function_per_element_form():
    plan = make_plan(load_spec(D128))
    assert [key for key, _ in plan.functions] == [key for key, _, _ in FORMS]
    assert plan.entry_functions["none"] == "attngen_h200_merge_d128_none"
    assert [plan.form_types(key) for key, _, _ in FORMS] == [("half", "half"), ("float", "half"), ("half", "float"),
                                                             ("float", "float")]
    assert form_key(False, False) == "none" and form_key(True, False) == "fp32_parts"
    assert form_key(False, True) == "fp32_out" and form_key(True, True) == "fp32"
    assert (plan.threads, plan.smem_bytes, plan.block_m, plan.fragments.pairs_per_lane) == (128, 0, 4, 2)
    assert max_parts_of(plan) == 8 and plan.masks == ("none",)
    text = explain(plan)
    assert "fp32_parts: fp32 -> fp16" in text and "up to 8 parts per launch" in text


def test_head_dims_of_the_family():
    for d, pairs in ((64, 1), (96, 2), (128, 2), (256, 4)):
        for suffix, ctype in (("", "half"), ("_bf16", "__nv_bfloat16")):
            plan = make_plan(load_spec(ROOT / "specs" / f"h200_merge_d{d}{suffix}.yaml"))
            assert (plan.head_dim, plan.fragments.pairs_per_lane, plan.ctype) == (d, pairs, ctype)
            assert plan.target.arch == "sm_90"
    assert make_plan(load_spec(ROOT / "specs" / "l4_merge_d96.yaml")).target.arch == "sm_89"


# -- Params -----------------------------------------------------------------------------------------

def test_params_hold_a_pointer_and_strides_per_part():
    plan = make_plan(parse_spec(HEAD + "head_dim: 64\nmax_parts: 4\n"))
    rows = {f.name: (f, offset) for f, offset in plan.abi.rows()}
    part_o, at = rows["part_o"]
    assert part_o.declaration() == "const void* part_o[4];" and (part_o.size, at) == (32, 16)
    assert rows["part_o_strides"][0].declaration() == "long long part_o_strides[12];"
    assert rows["part_lse_strides"][0].declaration() == "long long part_lse_strides[8];"
    assert plan.abi.size == 8 + 8 + 32 + 32 + 3 * 8 + 12 * 8 + 8 * 8 + 4 * 4     # every field, no padding
    assert array_bytes(part_o, "Q", (1, 2)) == struct.pack("<4Q", 1, 2, 0, 0)
    with pytest.raises(ValueError, match="holds 4 values"):
        array_bytes(part_o, "Q", range(5))


def test_rendered_source_declares_what_the_plan_says():
    rendered = render_spec_file(D128)
    source = rendered.source
    assert (ROOT / "generated" / "h200_merge_d128.cu").read_text() == source
    assert "const void* part_o[8];" in source and 'static_assert(sizeof(Params) == 504' in source
    for key, _, _ in FORMS:
        assert f"attngen_h200_merge_d128_{key}(" in source
    assert "merge_row<float, half>" in source and "merge_row<half, float>" in source
    assert "__launch_bounds__(32 * attngen_h200_merge_d128::kRowsPerBlock, attngen_h200_merge_d128::kMinBlocksPerSm)" \
        in source


# -- the dispatch table -----------------------------------------------------------------------------

def test_the_table_serves_merges_on_sm90_and_sm89():
    entries = load_table(table_path(ROOT / "specs"))
    for arch, prefix in (("sm_90", "h200"), ("sm_89", "l4")):
        for d in (32, 40, 64, 80, 96, 128, 160, 192, 256):     # every head dim the forward serves
            for dtype, suffix in (("fp16", ""), ("bf16", "_bf16")):
                e = select(entries, "merge", arch, dtype, d, "none", 0)
                assert e.spec == f"{prefix}_merge_d{d}{suffix}"
                assert entry_problem(e, make_plan(load_spec(ROOT / "specs" / f"{e.spec}.yaml"))) is None
    with pytest.raises(LookupError, match="no merge kernel for sm_90 fp16 head_dim 72"):
        select(entries, "merge", "sm_90", "fp16", 72, "none", 0)


def test_a_merge_spec_serves_no_other_call():
    entries = load_table(table_path(ROOT / "specs"))
    e = select(entries, "decode", "sm_90", "fp16", 128, "none", 4096)
    assert "merge spec, not one for decode" in entry_problem(e, make_plan(load_spec(D128)))


# -- the merge call on stand-in tensors -----------------------------------------------------------

class FakeTensor:
    """What the calls read of a tensor: shape, strides, dtype, device, pointer, element count, and the version
    counter the sequence orders are kept by (never bumped: these stand-ins are not written)."""

    _next = 1 << 20
    _version = 0

    def __init__(self, shape, dtype, strides=None, device=0, ptr=None):
        self.shape = tuple(shape)
        self.dtype = dtype
        self._strides = tuple(strides) if strides else contiguous(self.shape)
        self._device = device
        FakeTensor._next += 1 << 20
        self._ptr = FakeTensor._next if ptr is None else ptr
        self.requires_grad = False

    def stride(self, dim=None):
        return self._strides if dim is None else self._strides[dim]

    def dim(self):
        return len(self.shape)

    def get_device(self):
        return self._device

    @property
    def device(self):
        return f"cuda:{self._device}" if self._device >= 0 else "cpu"

    def data_ptr(self):
        return self._ptr

    def element_size(self):
        return self.dtype.size

    def numel(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    def is_contiguous(self):
        return self._strides == contiguous(self.shape)


def contiguous(shape):
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= n
    return tuple(reversed(out))


class Dtype(types.SimpleNamespace):
    def __repr__(self):
        return self.name

    def __hash__(self):     # a call's prepared key holds dtypes, as torch's are hashable
        return hash(self.name)


HALF, BF16, F32 = Dtype(name="float16", size=2), Dtype(name="bfloat16", size=2), Dtype(name="float32", size=4)


def fake_torch():
    return types.SimpleNamespace(float32=F32, Tensor=FakeTensor, device=lambda kind, index: index,
                                 empty=lambda shape, dtype, device: FakeTensor(shape, dtype, device=device))


def recording_kernel(cls, plan, dtype, torch, tensor_type=FakeTensor):
    """A `cls` kernel of `plan` (not loaded: no GPU) whose launches are recorded in k.launched as (Prepared,
    pointers) instead of run; the caller sets what its convention reads besides, then calls k._setup()."""
    k = object.__new__(cls)
    k.plan, k.label, k.entry, k.dtype = plan, plan.spec.name, plan.entry_functions, dtype
    k._torch, k._tensor_type = torch, tensor_type
    k.launched, k._prepared = [], {}
    k._device = lambda index: types.SimpleNamespace(index=index, sm_count=132)
    k._launches = lambda info, *named: named
    k._alone = lambda info, launches: launches   # decode's lone-block rule reads Functions; these are names
    k._run = lambda prepared, pointers: k.launched.append((prepared, pointers))
    return k


def merge_kernel(spec=D128, dtype=HALF):
    """A MergeKernel of the spec's plan whose launches are recorded instead of run."""
    from attngen.runtime.calls.merge import MergeKernel
    k = recording_kernel(MergeKernel, make_plan(load_spec(spec)), dtype, fake_torch())
    k._setup()
    return k


def parts(n, shape=(2, 3, 5, 128), dtype=HALF, layout="bhsd"):
    lse_shape = (shape[0], shape[1], shape[2]) if layout == "bhsd" else (shape[0], shape[2], shape[1])
    return [FakeTensor(shape, dtype) for _ in range(n)], [FakeTensor(lse_shape, F32) for _ in range(n)]


def test_a_merge_packs_every_part_into_one_launch():
    k = merge_kernel()
    outs, lses = parts(3)
    out, lse = k(outs, lses)
    assert out.shape == outs[0].shape and out.dtype is HALF and lse.shape == (2, 3, 5) and lse.dtype is F32
    (prepared, pointers), = k.launched
    (function, grid), = prepared.launches
    assert function == "attngen_h200_merge_d128_none" and grid == (-(-2 * 3 * 5 // 4), 1, 1)
    assert pointers == (out.data_ptr(),)
    values = dict(zip([f.name for f in k.plan.abi.fields],
                      struct.unpack(k.plan.abi.struct_format(), prepared.template)))
    assert struct.unpack("<8Q", values["part_o"])[:4] == (*(t.data_ptr() for t in outs), 0)
    assert struct.unpack("<24q", values["part_o_strides"])[:3] == outs[0].stride()[:3]
    assert struct.unpack("<16q", values["part_lse_strides"])[:2] == lses[0].stride()[:2]
    assert (values["batch"], values["heads"], values["seqlen"], values["num_parts"]) == (2, 3, 5, 3)


def test_bshd_parts_pass_their_head_and_row_strides():
    k = merge_kernel()
    outs, lses = parts(2, shape=(2, 5, 3, 128), layout="bshd")     # (B, S, H, D)
    k(outs, lses, layout="bshd", out_dtype=F32)
    (prepared, _), = k.launched
    assert prepared.launches[0][0] == "attngen_h200_merge_d128_fp32_out"
    values = dict(zip([f.name for f in k.plan.abi.fields],
                      struct.unpack(k.plan.abi.struct_format(), prepared.template)))
    b, s, h, _ = outs[0].stride()
    assert struct.unpack("<24q", values["part_o_strides"])[:3] == (b, h, s)
    assert (values["heads"], values["seqlen"]) == (3, 5)


def patched(k, prepared, pointers) -> dict:
    """The Params a launch ran with: its template with the call's pointers patched in, by field name."""
    raw = bytearray(prepared.template)
    prepared.patch.pack_into(raw, 0, pointers)
    return dict(zip([f.name for f in k.plan.abi.fields], struct.unpack(k.plan.abi.struct_format(), bytes(raw))))


def test_a_repeated_merge_is_a_prepared_launch_with_its_own_addresses():
    """Parts laid out as an earlier call's (new tensors, the same shapes and strides) take that call's Params:
    one launch with this call's output, LSE and parts' addresses patched in, and no check run again."""
    k = merge_kernel()
    calls = [parts(3, shape=(2, 5, 3, 128), layout="bshd") for _ in range(3)]
    results = [k(outs, lses, layout="bshd") for outs, lses in calls]
    assert len(k._prepared) == 1 and len(k.launched) == 3
    first = k.launched[0][0]
    for (outs, lses), (out, lse), (prepared, pointers) in zip(calls, results, k.launched):
        values = patched(k, prepared, pointers)
        assert prepared.template == first.template
        assert (values["o"], values["lse"]) == (out.data_ptr(), lse.data_ptr())
        assert struct.unpack("<8Q", values["part_o"])[:4] == (*(t.data_ptr() for t in outs), 0)
        assert struct.unpack("<8Q", values["part_lse"])[:4] == (*(t.data_ptr() for t in lses), 0)
        assert (values["batch"], values["heads"], values["seqlen"], values["num_parts"]) == (2, 3, 5, 3)
        assert out.shape == (2, 5, 3, 128) and out.dtype is HALF and lse.shape == (2, 3, 5) and lse.dtype is F32
    assert k.launched[1][1] != k.launched[2][1]
    assert k.last_rounds == 1


@pytest.mark.parametrize("change", ["layout", "out_dtype", "a part's strides", "an LSE's strides", "parts",
                                    "shape", "dtype", "device"])
def test_a_merge_laid_out_otherwise_is_prepared_anew(change):
    """Each part of the key (the layout argument, out_dtype, every part's and LSE's shape, strides, dtype and
    device, how many parts) makes a call of its own Params."""
    k = merge_kernel()
    k(*parts(2))
    outs, lses = parts(2)
    kwargs = {}
    if change == "layout":
        outs, lses = parts(2, shape=(2, 5, 3, 128), layout="bshd")
        kwargs = {"layout": "bshd"}
    elif change == "out_dtype":
        kwargs = {"out_dtype": F32}
    elif change == "a part's strides":
        outs[1] = FakeTensor(outs[1].shape, HALF, strides=(3 * 8 * 128, 8 * 128, 128, 1))
    elif change == "an LSE's strides":
        lses[0] = FakeTensor(lses[0].shape, F32, strides=(3 * 8, 8, 1))
    elif change == "parts":
        outs, lses = parts(3)
    elif change == "shape":
        outs, lses = parts(2, shape=(2, 3, 6, 128))
    elif change == "dtype":
        outs, lses = parts(2, dtype=F32)
    else:
        outs, lses = [FakeTensor(t.shape, HALF, device=1) for t in outs], [FakeTensor(t.shape, F32, device=1) for t in lses]
    out, lse = k(outs, lses, **kwargs)
    assert len(k._prepared) == 2
    values = patched(k, *k.launched[-1])
    assert struct.unpack("<24q", values["part_o_strides"])[3:6] == (
        (outs[1].stride()[:3]) if kwargs.get("layout") != "bshd" else (outs[1].stride(0), outs[1].stride(2), outs[1].stride(1)))
    assert struct.unpack("<16q", values["part_lse_strides"])[:2] == lses[0].stride()[:2]
    assert values["o"] == out.data_ptr() and out.dtype is (F32 if change in ("out_dtype", "dtype") else HALF)


def test_a_merge_into_a_caller_s_out_or_in_rounds_is_not_prepared():
    """A caller's out or lse_out, and more parts than one launch takes, take the full path on every call."""
    k = merge_kernel()
    outs, lses = parts(2)
    for _ in range(2):
        k(outs, lses, out=FakeTensor(outs[0].shape, HALF))
        k(outs, lses, lse_out=FakeTensor(lses[0].shape, F32))
        k(*parts(k._max_parts + 1))
    assert not k._prepared


def test_a_misaligned_part_after_a_prepared_call_is_refused():
    k = merge_kernel()
    k(*parts(2))
    outs, lses = parts(2)
    outs[1] = FakeTensor(outs[1].shape, HALF, ptr=outs[1].data_ptr() + 8)
    with pytest.raises(ValueError, match="16-byte aligned"):
        k(outs, lses)
    assert len(k.launched) == 1


def test_more_parts_than_a_launch_takes_merge_in_rounds():
    k = merge_kernel()
    outs, lses = parts(20)
    k(outs, lses)
    functions = [prepared.launches[0][0] for prepared, _ in k.launched]
    # 8 + 8 + 4 parts into fp32 partials, then the 3 partials into the output
    assert functions == ["attngen_h200_merge_d128_fp32_out"] * 3 + ["attngen_h200_merge_d128_fp32_parts"]
    assert k.last_rounds == 4


def test_empty_rows_launch_nothing():
    k = merge_kernel()
    outs, lses = parts(2, shape=(2, 3, 0, 128))
    out, lse = k(outs, lses)
    assert out.shape == (2, 3, 0, 128) and not k.launched


@pytest.mark.parametrize("change, error, words", [
    (lambda o, l: (o[:1], l), ValueError, "one entry per part (got 1 outputs and 2 LSEs)"),
    (lambda o, l: ([], []), ValueError, "at least one part"),
    (lambda o, l: (o[0], l), TypeError, "lists of tensors"),
    (lambda o, l: ([o[0], FakeTensor((2, 3, 6, 128), HALF)], l), ValueError, "outs[1] has shape (2, 3, 6, 128)"),
    (lambda o, l: ([o[0], FakeTensor((2, 3, 5, 128), BF16)], l), TypeError, "outs[1] is bfloat16 but outs[0] is float16"),
    (lambda o, l: ([o[0], FakeTensor((2, 3, 5, 128), HALF, device=1)], l), ValueError, "must be on one GPU"),
    (lambda o, l: ([FakeTensor((2, 3, 5, 128), HALF, device=-1)] * 2, l), ValueError, "needs CUDA tensors"),
    (lambda o, l: ([FakeTensor((2, 3, 5, 64), HALF)] * 2, l), ValueError, "head_dim 64 but h200_merge_d128"),
    (lambda o, l: ([FakeTensor((2, 3, 5, 128), HALF, strides=(1920, 640, 1, 5))] * 2, l), ValueError,
     "last dimension must be contiguous"),
    (lambda o, l: ([FakeTensor((2, 3, 5, 128), HALF, strides=(1940, 644, 130, 1))] * 2, l), ValueError,
     "16-byte aligned rows"),
    (lambda o, l: ([FakeTensor((2, 3, 5, 128), BF16)] * 2, l), TypeError, "merges float16 or float32 parts"),
    (lambda o, l: (o, [l[0], FakeTensor((2, 3, 5), HALF)]), TypeError, "lses[1] must be float32"),
    (lambda o, l: (o, [l[0], FakeTensor((2, 5, 3), F32)]), ValueError, "lses[1] must be (batch, heads, seqlen)"),
    (lambda o, l: (o, [l[0], FakeTensor((2, 3, 5), F32, strides=(30, 10, 2))]), ValueError, "rows must be contiguous"),
    (lambda o, l: (o, [l[0], FakeTensor((2, 3, 5), F32, device=1)]), ValueError, "must be on one GPU"),
])
def test_bad_arguments_are_refused_in_one_line(change, error, words):
    k = merge_kernel()
    outs, lses = change(*parts(2))
    with pytest.raises(error) as err:
        k(outs, lses)
    assert words in str(err.value) and "\n" not in str(err.value)
    assert not k.launched


def test_bad_layout_and_out_dtype_are_refused():
    k = merge_kernel()
    with pytest.raises(ValueError, match="layout must be one of bhsd, bshd"):
        k(*parts(2), layout="sbhd")
    with pytest.raises(TypeError, match="out_dtype must be float16 or torch.float32"):
        k(*parts(2), out_dtype=BF16)
    with pytest.raises(ValueError, match="out must be float16 of the parts' shape"):
        k(*parts(2), out=FakeTensor((2, 3, 5, 128), F32))
