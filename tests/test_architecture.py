"""The layout holds: imports point down, nothing outside a kind knows kind names, one ABI list
makes the C struct and the Python packing, and every layer handles a spec that renders several
parts (a bundle)."""
from __future__ import annotations

import ast
import dataclasses
import re
import shutil
import struct
from pathlib import Path
from typing import Literal

import pytest
from click.testing import CliRunner
from pydantic import Field

import attngen.kinds as registry
from attngen.cli import main
from attngen.core.abi import Abi, AbiField, blob, float32, int32, int64, pointer
from attngen.core.forward_plan import FORWARD_ABI, Part
from attngen.core.kind import Kind
from attngen.kinds import KINDS, fwd_mma, kind_of
from attngen.plan import make_plan
from attngen.render import render_parts
from attngen.spec import load_spec, parse_spec
from spec_sample import SPEC_PATHS, spec_text

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "attngen"


# -- imports point down ---------------------------------------------------------------------------

def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """attngen modules a file imports (absolute or relative), wherever the import statement is."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("attngen")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("attngen"):
                found.add(target)
                # `from . import x` / `from .kinds import fwd_mma` may name submodules
                found |= {f"{target}.{a.name}" for a in node.names if (PKG.parent / (target.replace(".", "/") + f"/{a.name}")).exists()
                          or (PKG.parent / (target.replace(".", "/") + f"/{a.name}.py")).exists()}
    return found


def layer(module: str) -> tuple[str, str]:
    """(layer, which kind) of a module. Layers from the bottom: base, core, kind, registry, top."""
    if module in ("attngen.errors", "attngen.targets", "attngen.fsutil"):
        return "base", ""
    if module.startswith("attngen.core"):
        return "core", ""
    if module == "attngen.kinds":
        return "registry", ""
    if module.startswith("attngen.kinds."):
        return "kind", module.split(".")[2]
    return "top", ""


ALLOWED = {
    "base": {"base"},
    "core": {"base", "core"},
    "kind": {"base", "core", "kind"},     # its own kind only (checked below)
    "registry": {"base", "core", "kind"},
    "top": {"base", "core", "registry", "top"},   # never a kind directly: the registry names them
}

MODULES = sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("path", MODULES, ids=[module_name(p) for p in MODULES])
def test_imports_point_down(path):
    me = module_name(path)
    my_layer, my_kind = layer(me)
    for target in imports_of(path) - {me}:
        their_layer, their_kind = layer(target)
        assert their_layer in ALLOWED[my_layer], f"{me} ({my_layer}) imports {target} ({their_layer})"
        if my_layer == "kind" and their_layer == "kind":
            assert their_kind == my_kind, f"kind {my_kind} imports kind {their_kind} ({target})"


def test_the_import_walk_sees_imports():
    """The check above cannot pass by seeing nothing."""
    assert "attngen.core.forward_plan" in imports_of(PKG / "kinds" / "fwd_mma" / "__init__.py")
    assert "attngen.kinds.fwd_mma" in imports_of(PKG / "kinds" / "__init__.py")
    assert layer("attngen.kinds.fwd_mma") == ("kind", "fwd_mma") and layer("attngen.render") == ("top", "")


# -- kind names stay inside their kind ------------------------------------------------------------

KIND_WORDS = ({k.name for k in KINDS} | {k.select_value for k in KINDS}
              | {"scalar", "wmma", "mma", "family"})


def compared_words(tree: ast.AST, vocabulary: set) -> list[tuple[int, str]]:
    """(line, word) of every comparison or lookup of a word of `vocabulary`: == / != / in, a
    subscript, a dict key, a match case."""
    hits = []

    def words(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in vocabulary:
            return [node.value]
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return [w for elt in node.elts for w in words(elt)]
        return []

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            hits += [(node.lineno, w) for side in [node.left, *node.comparators] for w in words(side)]
        elif isinstance(node, ast.Subscript):
            hits += [(node.lineno, w) for w in words(node.slice)]
        elif isinstance(node, ast.Dict):
            hits += [(node.lineno, w) for key in node.keys if key is not None for w in words(key)]
        elif isinstance(node, ast.MatchValue):
            hits += [(node.lineno, w) for w in words(node.value)]
    return hits


def compared_kind_words(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, word) of every comparison or lookup of a kind word, and every use of `.family`."""
    hits = compared_words(tree, KIND_WORDS)
    hits += [(node.lineno, "family") for node in ast.walk(tree)
             if isinstance(node, ast.Attribute) and node.attr == "family"]
    return sorted(hits)


OUTSIDE_KINDS = [p for p in MODULES if "kinds" not in p.relative_to(PKG).parts]


@pytest.mark.parametrize("path", OUTSIDE_KINDS, ids=[module_name(p) for p in OUTSIDE_KINDS])
def test_no_kind_name_compared_outside_kinds(path):
    hits = compared_kind_words(ast.parse(path.read_text()))
    assert not hits, f"{module_name(path)} compares kind names: {hits}"


def test_the_kind_name_check_can_fail():
    tree = ast.parse('if spec.mma == "mma_m16n8k16": pass\nx = {"scalar": 1}\nif plan.family: pass\n'
                     'y = s.mma in ("wmma_m16n16k16", "other")\n')
    assert [w for _, w in compared_kind_words(tree)] == ["mma_m16n8k16", "scalar", "family", "wmma_m16n16k16"]


SHARED_TEMPLATES = sorted((ROOT / "templates" / "lib").rglob("*.j2"))


def test_templates_mirror_the_kinds():
    """templates/ holds lib/, variants/ (one unit per variant) and one folder per kind package of
    attngen/kinds/, and no template lives inside attngen/."""
    kinds = {p.name for p in (PKG / "kinds").iterdir() if (p / "__init__.py").is_file()}
    folders = {p.name for p in (ROOT / "templates").iterdir() if p.is_dir()}
    assert folders == kinds | {"lib", "variants"}
    assert {k.template_folder for k in KINDS} == kinds
    assert not list(PKG.rglob("*.j2"))


@pytest.mark.parametrize("path", SHARED_TEMPLATES, ids=[p.name for p in SHARED_TEMPLATES])
def test_shared_templates_know_no_kind(path):
    for tag in re.findall(r"{%.*?%}|{{.*?}}", path.read_text(), flags=re.S):
        for word in KIND_WORDS:
            assert not re.search(rf"\b{re.escape(word)}\b", tag), f"{path.name}: {tag!r} names {word}"


ALL_TEMPLATES = sorted((ROOT / "templates").rglob("*.j2"))


@pytest.mark.parametrize("path", ALL_TEMPLATES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_templates_bind_values(path):
    """No template logic inside a C++ parameter or argument list: a `{% if %}` or `{{ ... if ... }}`
    between a `(` and its `)` on the lines it spans; C++ decides with constexpr and if constexpr."""
    text = path.read_text()
    depth, line_no = 0, 1
    # a {% raw %} block is C++ (inline asm whose "{%0, %1}" operands are no template tags): its parens count
    for token in re.finditer(r"{% raw %}.*?{% endraw %}|{%.*?%}|{{.*?}}|\(|\)|\n", text, flags=re.S):
        t = token.group(0)
        if t.startswith("{% raw %}"):
            line_no += t.count("\n")
            depth = max(0, depth + t.count("(") - t.count(")"))
        elif t == "\n":
            line_no += 1
        elif t == "(":
            depth += 1
        elif t == ")":
            depth = max(0, depth - 1)
        elif depth and re.search(r"\bif\b", t) and not t.startswith("{#"):
            pytest.fail(f"{path.name}:{line_no}: template condition inside a parameter/argument list: {t}")


def test_log_constants_are_defined_once():
    """ln 2 and log2 e are Python constants (core.constants) the templates bind, written nowhere else."""
    import math
    from attngen.core.constants import LN2, LOG2E
    assert LN2 == math.log(2) and LOG2E == 1 / math.log(2)
    sources = "".join(p.read_text() for p in ALL_TEMPLATES + MODULES)
    for literal in ("0.693147", "1.442695"):
        assert sources.count(literal) == 1, literal         # core/constants.py


# -- one ABI list ---------------------------------------------------------------------------------

def test_abi_offsets_alignment_and_packing():
    abi = Abi("P", (pointer("a", "a pointer"), int32("n", "a count"), blob("map", 128, 64, "a tensor map"),
                    int32("m", "after the map", default=7)))
    assert abi.offsets == (0, 8, 64, 192) and abi.size == 256 and abi.align == 64
    raw = abi.pack({"a": 0x1122334455667788, "n": -3, "map": bytes(range(128))})
    assert len(raw) == 256
    assert struct.unpack_from("<Q", raw, 0)[0] == 0x1122334455667788
    assert struct.unpack_from("<i", raw, 8)[0] == -3 and raw[64:192] == bytes(range(128))
    assert struct.unpack_from("<i", raw, 192)[0] == 7       # the default
    with pytest.raises(ValueError, match="no value for n"):
        abi.pack({"a": 1, "map": bytes(128)})
    with pytest.raises(ValueError, match="no field"):
        abi.pack({"a": 1, "n": 1, "map": bytes(128), "typo": 2})
    with pytest.raises(ValueError, match="declared twice"):
        Abi("P", (int32("n", ""), int32("n", "")))


@pytest.mark.parametrize("value", [b"", bytes(127), bytes(129), "x" * 128], ids=["empty", "short", "long", "str"])
def test_abi_blob_takes_exactly_its_size(value):
    # struct's "128s" pads a short value with zeros and cuts a long one: a wrong tensor map would
    # reach the kernel without a word.
    abi = Abi("P", (int32("n", "a count"), blob("map", 128, 64, "a tensor map")))
    with pytest.raises(ValueError, match="map takes 128 bytes"):
        abi.pack({"n": 1, "map": value})


def test_blob_aligned_above_its_element_after_an_int():
    # unsigned char has alignment 1: without alignas a 16-byte, 8-aligned blob after an int sits at
    # C offset 4 while Python puts it at 8. Every field aligned above its type's own gets alignas.
    abi = Abi("P", (int32("n", "a count"), blob("x", 16, 8, "an 8-aligned blob")))
    assert abi.offsets == (0, 8) and abi.size == 24 and abi.align == 8
    assert [f.declaration() for f in abi.fields] == ["int n;", "alignas(8) unsigned char x[16];"]
    assert blob("y", 4, 1, "bytes").declaration() == "unsigned char y[4];"
    assert pointer("p", "a pointer").declaration() == "const void* p;"
    raw = abi.pack({"n": 5, "x": bytes(range(16))})
    assert raw[8:24] == bytes(range(16)) and raw[4:8] == bytes(4)


@pytest.mark.parametrize("make, message", [
    (lambda: blob("x", 16, 3, ""), "not a power of two"),
    (lambda: AbiField("x", "long long", 8, 4, "q", ""), "below the 8 bytes"),
    (lambda: AbiField("x", "int", 6, 4, "6s", "", array=4), "not 4 equal elements"),
])
def test_abi_field_refuses_what_c_cannot_lay_out(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_forward_abi_matches_the_generated_struct():
    plan = make_plan(parse_spec(spec_text(ROOT / "specs" / "lab" / "h100_mma_d128_ws.yaml")))
    src = render_parts(plan, "specs/x.yaml", "")[0].source
    for f, offset in plan.abi.rows():
        assert f"static_assert(offsetof(Params, {f.name}) == {offset}," in src
    assert f"static_assert(sizeof(Params) == {plan.abi.size}," in src
    names = [f.name for f in FORWARD_ABI.fields]
    assert {"causal_offset", "causal_from_end"} <= set(names)   # a variant's fields, from the same list
    assert names[-6:] == ["cu_seqlens_q", "cu_seqlens_k", "seq_order", "total_q", "total_k",   # varlen sequences
                          "errors"]                                                          # input-error flags


@pytest.mark.parametrize("spec, carries, leaves_out", [
    # padded causal: the causal offset, not the per-sequence flag nor the varlen fields
    ("h100_mma_d128_ws", {"q", "causal_offset"}, {"causal_from_end", "cu_seqlens_q", "total_k", "errors"}),
    # varlen: the varlen fields and the error flags
    ("h100_mma_d128_m128n32w4s4x3", {"causal_offset", "causal_from_end", "cu_seqlens_q", "seq_order", "errors"},
     set()),
    # TMA loads: the maps carry q, k and v; o is still written through its pointer
    ("h100_wgmma_d128", {"o", "o_row_stride", "tma_q", "tma_k", "tma_v"}, {"q", "k_row_stride", "v", "errors"}),
    # decode: its own fields and the error flags, no varlen sequences; LSE rows are contiguous and
    # each sequence's causal offset comes from its cache length
    ("h200_decode_d128", {"block_table", "errors", "lse"},
     {"cu_seqlens_k", "causal_from_end", "causal_offset", "lse_batch_stride", "lse_head_stride"}),
])
def test_a_plans_params_carry_what_its_kernels_read(spec, carries, leaves_out):
    plan = make_plan(parse_spec(spec_text(ROOT / "specs" / f"{spec}.yaml")))
    names = {f.name for f in plan.abi.fields}
    assert carries <= names and not leaves_out & names
    assert leaves_out <= plan.abi.omitted


def test_packing_skips_the_fields_a_plan_omits_and_refuses_unknown_ones():
    abi = Abi("P", (int32("a", "a"), int32("b", "b"), int64("c", "c"))).without({"b"})
    packer = abi.packer(("a", "b", "c"))
    assert packer.pack((1, 2, 3)) == struct.pack("<i4xq", 1, 3)
    buf = bytearray(packer.pack((1, 2, 3)))
    abi.patch(("a", "b")).pack_into(buf, 0, (7, 8))
    assert bytes(buf) == struct.pack("<i4xq", 7, 3)
    with pytest.raises(ValueError, match="no field"):
        abi.packer(("a", "d"))
    with pytest.raises(ValueError, match="no field"):
        abi.without({"b"})


def test_a_patch_takes_its_names_in_the_callers_order():
    """A call may give its pointers in any order (the varlen backward: its sequences' pointers after dout's);
    the patch writes each at its own offset, adjacent ones in one struct, omitted ones dropped."""
    abi = Abi("P", (int32("a", "a"), int32("b", "b"), int64("c", "c"), int32("d", "d"))).without({"b"})
    buf = bytearray(abi.packer(("a", "c", "d")).pack((1, 3, 4)))
    abi.patch(("d", "b", "a", "c")).pack_into(buf, 0, (40, 20, 10, 30))
    assert bytes(buf) == struct.pack("<i4xqi4x", 10, 30, 40)
    in_order = abi.patch(("a", "c", "d"))
    assert in_order._take is None and len(in_order._runs) == 1    # no reordering, one struct


def test_a_view_declares_what_a_kernel_reads_at_the_same_offsets():
    abi = Abi("P", (int32("a", "a"), int64("b", "b"), int32("c", "c"), float32("d", "d")))
    rows = abi.view({"b", "d"})
    assert [(decl, offset) for decl, offset, _ in rows] == [
        ("unsigned char reserved_0[8];", 0), ("long long b;", 8), ("unsigned char reserved_16[4];", 16),
        ("float d;", 20)]
    assert abi.size == 24


def plan_with_tensor_map():
    """Adding a field is one entry: a 128-byte, 64-byte aligned tensor map after the forward fields."""
    plan = make_plan(parse_spec(spec_text(ROOT / "specs" / "l4_mma_d64.yaml")))
    return dataclasses.replace(plan, abi=FORWARD_ABI.with_fields((blob("tma_q", 128, 64, "TMA descriptor of q"),)))


def test_one_line_adds_a_field():
    plan = plan_with_tensor_map()
    src = render_parts(plan, "specs/x.yaml", "")[0].source
    assert FORWARD_ABI.size == 264        # the map goes to the next 64-byte boundary after the forward fields
    assert plan.abi.offsets[-1] == 320 and plan.abi.size == 448
    assert "alignas(64) unsigned char tma_q[128];" in src
    assert "static_assert(offsetof(Params, tma_q) == 320," in src and "static_assert(sizeof(Params) == 448," in src


def plan_with_small_blob():
    """A 16-byte, 8-aligned blob right after an int at an 8-aligned offset (FORWARD_ABI ends at +264,
    the int lies at +264): Python puts the blob at +272, not +268, and C must too."""
    plan = make_plan(parse_spec(spec_text(ROOT / "specs" / "l4_mma_d64.yaml")))
    assert FORWARD_ABI.size == 264
    return dataclasses.replace(plan, abi=FORWARD_ABI.with_fields((int32("n", "an int"),
                                                                  blob("small", 16, 8, "an 8-aligned blob"))))


def test_small_aligned_blob_is_declared_where_python_puts_it():
    plan = plan_with_small_blob()
    src = render_parts(plan, "specs/x.yaml", "")[0].source
    assert plan.abi.offsets[-2:] == (264, 272) and plan.abi.size == 288
    assert "alignas(8) unsigned char small[16];" in src
    assert "static_assert(offsetof(Params, small) == 272," in src and "static_assert(sizeof(Params) == 288," in src


@pytest.mark.nvcc
@pytest.mark.parametrize("make_plan_", [plan_with_tensor_map, plan_with_small_blob], ids=["tensor_map", "small_blob"])
def test_generated_struct_asserts_hold_with_a_new_field(make_plan_):
    """nvcc checks every static_assert of the generated struct against the Python offsets."""
    from attngen.compile import compile_source
    plan = make_plan_()
    res = compile_source(render_parts(plan, "specs/x.yaml", "")[0].source, "sm_89")
    assert {f.name for f in res.functions} == {fn for _, fn in plan.functions}


# -- mask variants bring their own behaviour ---------------------------------------------------------

class Grid:
    """Just enough of a torch bool tensor for the variants' `visible`: ones(...).tril(diagonal)."""

    def __init__(self, rows):
        self.rows = rows

    def tril(self, diagonal=0):
        return Grid([[v and j <= i + diagonal for j, v in enumerate(row)] for i, row in enumerate(self.rows)])


class FakeTorch:
    bool = "bool"

    @staticmethod
    def ones(rows, cols, dtype=None, device=None):
        assert dtype == "bool" and device == "cpu"
        return Grid([[True] * cols for _ in range(rows)])


def test_causal_variant_fills_its_field_and_draws_its_mask():
    from attngen.core.variants import CAUSAL, NONE
    # top-left by default; bottom-right also tells varlen functions to align each sequence's ends
    assert CAUSAL.abi_values(None, 3, 10) == {"causal_offset": 0, "causal_from_end": 0}
    assert CAUSAL.abi_values("bottom_right", 3, 10) == {"causal_offset": 7, "causal_from_end": 1}
    assert CAUSAL.abi_values("bottom_right", 10, 3) == {"causal_offset": -7, "causal_from_end": 1}
    assert NONE.abi_values(None, 3, 10) == {}
    T, F = True, False
    assert CAUSAL.visible(FakeTorch, 2, 4, "top_left", "cpu").rows == [[T, F, F, F], [T, T, F, F]]
    assert CAUSAL.visible(FakeTorch, 2, 4, "bottom_right", "cpu").rows == [[T, T, T, F], [T, T, T, T]]
    assert NONE.visible(FakeTorch, 2, 4, None, "cpu") is None
    with pytest.raises(ValueError, match="takes alignment in"):
        CAUSAL.abi_values("diagonal", 3, 10)
    with pytest.raises(ValueError, match="takes alignment in"):
        NONE.visible(FakeTorch, 2, 4, "top_left", "cpu")


def test_a_new_variant_needs_no_change_to_mask_variant():
    """A variant with Params fields but every key visible (as a runtime-only option would be) and
    its own field name: MaskVariant used to fill `causal_offset` and draw a causal mask for any
    variant with fields."""
    from attngen.core.variants import MaskVariant
    seen = []

    def fill(option, seqlen_q, seqlen_k, window):
        seen.append(option)
        return {"window": 4 if option == "narrow" else 16}

    window = MaskVariant("window", "Mask::Window", ("narrow", "wide"), (int32("window", "keys each row sees"),),
                         "a stand-in", fill, lambda torch, sq, sk, option, device, window: None)
    assert window.abi_values(None, 8, 8) == {"window": 4} and window.abi_values("wide", 8, 8) == {"window": 16}
    assert seen == ["narrow", "wide"]                                  # the option is checked, then passed on
    assert window.visible(FakeTorch, 2, 2, "wide", "cpu") is None
    stray = MaskVariant("stray", "Mask::Stray", (), (), "fills a field it lacks",
                        lambda option, sq, sk, window: {"causal_offset": 0}, lambda *a: None)
    with pytest.raises(ValueError, match="does not declare: causal_offset"):
        stray.abi_values(None, 1, 1)


def test_mask_variant_names_no_variant():
    import inspect
    from attngen.core import variants
    source = inspect.getsource(variants.MaskVariant)
    for word in ("causal", "BOTTOM_RIGHT", "TOP_LEFT", "tril"):
        assert word not in source, f"MaskVariant names {word}: that belongs to a variant"
    assert not hasattr(variants, "mask_abi_fields")


# -- bundles: a spec that renders two parts ---------------------------------------------------------

class TwoPartSpec(fwd_mma.MmaSpec):
    mma: Literal["mma_m16n8k16_pair"] = Field(description="test kind: fwd_mma rendered as two parts")


def two_part_plan(spec, file=None):
    plan = fwd_mma.plan(spec, file)
    main_part = plan.parts[0]
    second = Part("second", main_part.template, f"{spec.name}.second.cu",
                  tuple((m, f"{fn}_second") for m, fn in main_part.functions[:1]))
    return dataclasses.replace(plan, parts=(main_part, second))


TWO_PART = Kind("test_two_part", "two-part test kind", ("mma", "mma_m16n8k16_pair"), TwoPartSpec, two_part_plan,
                fwd_mma.explain, templates="fwd_mma")


@pytest.fixture
def two_part_project(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "KINDS", KINDS + (TWO_PART,))
    text = spec_text(ROOT / "specs" / "l4_mma_d64.yaml").replace("name: l4_mma_d64", "name: pair")
    text = text.replace("mma: mma_m16n8k16", "mma: mma_m16n8k16_pair")
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "pair.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_bundle_renders_each_part(two_part_project):
    from attngen.render import render_spec_file
    r = render_spec_file("specs/pair.yaml")
    assert [name for name, _ in r.files] == ["pair.cu", "pair.second.cu"]
    first, second = (src for _, src in r.files)
    assert "\nattngen_pair_none(" in first and "\nattngen_pair_none_second(" not in first
    assert "\nattngen_pair_none_second(" in second and "\nattngen_pair_causal(" not in second
    assert "Part second of 2 (fwd, second)" in second
    with pytest.raises(ValueError, match="2 parts"):
        r.source


def test_build_and_check_handle_parts(two_part_project):
    runner = CliRunner()
    built = runner.invoke(main, ["build"])
    assert built.exit_code == 0, built.output
    gen = two_part_project / "generated"
    assert sorted(p.name for p in gen.glob("*.cu")) == ["pair.cu", "pair.second.cu"]
    assert runner.invoke(main, ["check"]).exit_code == 0
    (gen / "pair.second.cu").write_text((gen / "pair.second.cu").read_text() + "// edit\n")
    stale = runner.invoke(main, ["check"])
    assert stale.exit_code == 1 and "pair.second.cu" in stale.output
    (gen / "pair.second.cu").unlink()
    missing = runner.invoke(main, ["check"])
    assert missing.exit_code == 1 and "missing" in missing.output and "pair.second.cu" in missing.output


@pytest.mark.nvcc
def test_compile_handles_parts(two_part_project):
    result = CliRunner().invoke(main, ["compile", "--json", "specs/pair.yaml"])
    assert result.exit_code == 0, result.output
    import json
    names = {row["name"] for row in json.loads(result.stdout)}
    assert names == {"attngen_pair_none", "attngen_pair_causal", "attngen_pair_none_second"}


def test_runtime_and_ops_never_import_eval():
    """The call conventions hand verify cases and bench cells to eval/ as data; nothing in the
    runtime or the library imports eval/ (no circle runtime -> eval -> runtime)."""
    import ast
    offenders = []
    for pkg in ("runtime", "ops"):
        for path in (ROOT / "attngen" / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [("." * node.level) + (node.module or "")] if isinstance(node, ast.ImportFrom) else [])
                offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if "eval" in n.split(".")]
    assert not offenders, offenders


def test_call_conventions_are_registered_once():
    """Every kind's convention is in core.calls.CALLS, and the runtime's Kernel class of each is the one
    in the module the list names."""
    from attngen.core.calls import CALLS
    from attngen.kinds import KINDS
    from attngen.runtime.calls import conventions
    assert {k.calls for k in KINDS} <= {c.name for c in CALLS}
    assert list(conventions()) == [c.name for c in CALLS]
    for call in CALLS:
        cls = conventions()[call.name]
        assert cls.convention == call.name and cls.__module__ == call.kernel


def test_a_kind_names_a_listed_convention():
    with pytest.raises(ValueError, match="no call convention 'sideways'"):
        Kind("test_sideways", "a kind of an unknown call", ("mma", "sideways"), fwd_mma.MmaSpec, fwd_mma.plan,
             fwd_mma.explain, calls="sideways")


# -- call conventions stay in their rooms -----------------------------------------------------------

def call_words() -> set[str]:
    """Every name core.calls.CALLS gives: the conventions' and the dispatch table's calls'."""
    from attngen.core.calls import CALLS
    return {c.name for c in CALLS} | {t.name for c in CALLS for t in c.table}


def rooms_of(word: str) -> set[str]:
    """The modules that may compare `word`: the list itself, and the modules of the convention it
    names or serves (Call.modules)."""
    from attngen.core.calls import CALLS
    owners = [c for c in CALLS if word == c.name or word in {t.name for t in c.table}]
    return {"attngen.core.calls"} | {m for c in owners for m in c.modules}


def test_every_module_a_convention_lists_exists():
    from attngen.core.calls import CALLS
    names = {module_name(p) for p in MODULES}
    assert {m for c in CALLS for m in c.modules} <= names


@pytest.mark.parametrize("path", MODULES, ids=[module_name(p) for p in MODULES])
def test_no_convention_compared_outside_its_rooms(path):
    """No `calls == "decode"` in the CLI, bench, verify, a plan or the shared runtime: they read CALLS."""
    me = module_name(path)
    hits = [(line, w) for line, w in compared_words(ast.parse(path.read_text()), call_words()) if me not in rooms_of(w)]
    assert not hits, f"{me} compares call convention names outside their rooms: {hits}"


def test_the_convention_check_can_fail():
    tree = ast.parse('if kind.calls == "backward": pass\nx = {"forward_fp8": 1}\ny = EVALS["varlen"]\n'
                     'z = call in ("varlen_backward", "decode")\n')
    assert [w for _, w in compared_words(tree, call_words())] == ["backward", "forward_fp8", "varlen",
                                                                  "varlen_backward", "decode"]
    assert "attngen.cli" not in rooms_of("decode") and "attngen.eval.bench.decode" in rooms_of("decode")
    assert "attngen.eval.bench.varlen" in rooms_of("varlen") and "attngen.eval.bench.forward" not in rooms_of("backward")


def test_eval_conventions_are_registered_once():
    """Every convention has its eval entry (bench, verify cases), from the modules CALLS names."""
    from attngen.core.calls import CALLS
    from attngen.eval.conventions import EVALS
    assert list(EVALS) == [c.name for c in CALLS]
    for call in CALLS:
        entry = EVALS[call.name]
        assert entry.bench.__module__ == call.bench and entry.options == call.bench_options
        assert entry.cases.__module__ == call.verify


def test_eval_has_a_room_per_call():
    """eval/verify/<call>.py and eval/bench/<call>.py: a convention's verify cases and bench live in
    modules named after it, beside the shared pieces (runner, cases, report, timing) that name none."""
    from attngen.core.calls import CALLS
    for call in CALLS:
        assert (call.verify, call.bench) == (f"attngen.eval.verify.{call.name}", f"attngen.eval.bench.{call.name}")


def test_the_verify_runner_is_handed_its_cases():
    """The runner runs what it is handed: it imports no call's room, nor the registry that names them."""
    from attngen.core.calls import CALLS
    rooms = {m for c in CALLS for m in c.modules} | {"attngen.eval.conventions"}
    assert not imports_of(PKG / "eval" / "verify" / "runner.py") & rooms


def test_the_dispatch_table_serves_the_listed_calls():
    from attngen.core.calls import CALLS
    from attngen.ops import table
    assert table.CALLS == tuple(t.name for c in CALLS for t in c.table)
    assert all(table.CONVENTION[t.name] == c.name for c in CALLS for t in c.table)


def test_fragment_numbers_take_keywords_only():
    """A kind's typed fragment numbers are built by name: 27 positional ints cannot be reviewed."""
    import dataclasses
    for kind in KINDS:
        spec = next(load_spec(p) for p in SPEC_PATHS if kind_of(load_spec(p)) is kind)
        fragments = kind.plan(spec, None).fragments
        assert all(f.kw_only for f in dataclasses.fields(fragments)), type(fragments).__name__
