"""Expression specs without a GPU: the spec rules (with the key and the column), the Params fields of
the params, what a generated file carries, explain's classification lines, and the call's params=
checks that need no tensor."""
from __future__ import annotations

from pathlib import Path

import pytest

from attngen.core.expression_variant import BATCH_FIELD, PARAM_PREFIX, SCALE_FIELD, expression_variant
from attngen.errors import SpecError
from attngen.plan import make_plan
from attngen.spec import parse_spec
from spec_sample import SPEC_PATHS, spec_text

ROOT = Path(__file__).resolve().parents[1]
EXPR_SPECS = sorted(p.relative_to(ROOT / "specs").as_posix() for p in SPEC_PATHS if "_expr_" in p.name and p.name.startswith("h100_"))

BASE = """\
schema: 1
name: t
target: h100
head_dim: 128
tile: {block_m: 128, block_n: 64}
warps: {compute: 8}
mma: mma_m16n8k16
smem: {stages: 2, async_copy: true, opt_in: true}
"""


def spec_with(extra: str):
    return parse_spec(BASE + extra, "t.yaml")


def error_of(extra: str) -> str:
    with pytest.raises(SpecError) as info:
        spec_with(extra)
    return str(info.value)


def test_the_expression_specs_exist():
    # window, softcap + ALiBi, document masking over varlen and prefix-LM, and the single modifiers
    names = set(EXPR_SPECS)
    for want in ("h100_mma_d128_expr_window", "h100_wgmma_d128_expr_window", "h100_mma_d128_expr_softcap_alibi",
                 "h100_wgmma_d128_expr_softcap_alibi", "h100_mma_d128_expr_document", "h100_wgmma_d128_expr_document",
                 "h100_mma_d128_expr_prefix_lm",
                 "h100_wgmma_d128_expr_prefix_lm"):
        assert want + ".yaml" in names or f"lab/{want}.yaml" in names


def test_a_mask_expression_is_the_only_mask_by_default():
    s = spec_with('variant:\n  params: {w: int}\n  mask: "q_idx - kv_idx < w"\n')
    assert list(s.masks) == ["expr"]
    plan = make_plan(s)
    assert plan.masks == ("expr",)
    names = [f.name for f in plan.abi.fields]
    assert PARAM_PREFIX + "w" in names and SCALE_FIELD not in names and BATCH_FIELD not in names


def test_score_expression_fields_and_varlen_batch():
    s = spec_with('varlen: true\nvariant:\n  params: {cap: float, slope: "float[heads]"}\n'
                  '  score: "cap * tanh(score / cap) - slope[h] * abs(q_idx - kv_idx)"\n')
    assert list(s.masks) == ["none", "causal"]
    names = [f.name for f in make_plan(s).abi.fields]
    for n in (PARAM_PREFIX + "cap", PARAM_PREFIX + "slope", SCALE_FIELD, BATCH_FIELD):
        assert n in names


@pytest.mark.parametrize("extra,key,words", [
    ('variant:\n  mask: "kv_idx <= q_idx and nope"\n', "variant.mask", ["column 21", "unknown name 'nope'"]),
    ('variant:\n  score: "score + q_idx % 2.5"\n', "variant.score", ["column", "float where an int is needed"]),
    ('variant:\n  mask: "kv_idx + 1"\n', "variant.mask", ["bool"]),
    ('masks: [none, expr]\nvariant:\n  mask: "kv_idx <= q_idx"\n', "masks", ["masks: [expr]"]),
    ('masks: [expr]\n', "masks", ["variant.mask"]),
    ('scores: [softcap]\nvariant:\n  score: "score * 2"\n', "scores", ["variant.score"]),
    ('variant:\n  params: {w: int}\n', "variant", ["mask expression"]),
    ('variant:\n  params: {w: int}\n  mask: "q_idx - kv_idx < w"\n  verify: {x: [0, 1]}\n', "variant.verify.x",
     ["not a declared param"]),
    ('variant:\n  params: {w: int}\n  mask: "q_idx - kv_idx < w"\n  verify: {w: [5, 1]}\n', "variant.verify.w",
     ["lo <= hi"]),
    ('variant:\n  params: {w: "int[rows]"}\n  mask: "q_idx - kv_idx < w"\n', "variant", ["int[heads]"]),
])
def test_bad_expressions_name_the_key_and_the_fix(extra, key, words):
    message = error_of(extra)
    assert key in message and "Traceback" not in message
    for w in words:
        assert w in message, message


def test_kinds_without_expressions_refuse_them():
    text = BASE.replace("mma: mma_m16n8k16", "mma: wmma_m16n16k16").replace(
        "tile: {block_m: 128, block_n: 64}", "tile: {block_m: 64, block_n: 64}").replace(
        "warps: {compute: 8}", "warps: {compute: 4}").replace("target: h100", "target: l4")
    with pytest.raises(SpecError) as info:
        parse_spec(text + 'variant:\n  mask: "kv_idx <= q_idx"\n', "t.yaml")
    assert "masks" in str(info.value)


@pytest.mark.parametrize("name", EXPR_SPECS)
def test_generated_file_carries_the_expressions(name):
    spec = parse_spec(spec_text(ROOT / "specs" / name), name)
    main = make_plan(spec).parts[0]              # a backward bundle's main part
    text = (ROOT / "generated" / main.file_name).read_text()
    v = spec.variant
    assert "struct VariantEnv" in text
    if v.mask:
        assert f"//   mask:  {v.mask}" in text and "expr_classify" in text and "Mask::Expr" in text
    else:
        assert "expr_classify" not in text and "Mask::Expr" not in text
    if v.score:
        assert f"//   score: {v.score}" in text and "expr_score" in text
    # plain specs carry none of it
    assert "VariantEnv" not in (ROOT / "generated" / "h100_mma_d128.cu").read_text()


def test_explain_shows_the_classification():
    from attngen.explain import explain
    text = explain(make_plan(parse_spec(spec_text(ROOT / "specs" / "h100_wgmma_d128_expr_prefix_lm.yaml"), "x")))
    assert "block classification" in text and "block pairs empty (skipped)" in text


def test_params_are_checked_before_any_launch():
    s = spec_with('variant:\n  params: {w: int, cap: float}\n  mask: "q_idx - kv_idx < w"\n'
                  '  score: "cap * score"\n')
    v = expression_variant(s.variant)
    context = {"batch": 2, "heads": 4, "device": 0}
    with pytest.raises(ValueError, match="lacks cap"):
        v.fill({"w": 3}, 0.1, context)
    with pytest.raises(ValueError, match="does not declare"):
        v.fill({"w": 3, "cap": 1.0, "x": 1}, 0.1, context)
    with pytest.raises(ValueError, match="32-bit int"):
        v.fill({"w": 2.5, "cap": 1.0}, 0.1, context)
    with pytest.raises(ValueError, match="finite"):
        v.fill({"w": 2, "cap": float("nan")}, 0.1, context)
    values = v.fill({"w": 3, "cap": 2.0}, 0.125, context)
    assert values[PARAM_PREFIX + "w"] == 3 and values[PARAM_PREFIX + "cap"] == 2.0
    assert values[SCALE_FIELD] == 0.125 and values["scale_log2"] == pytest.approx(1.4426950408889634)


def test_bench_refuses_variant_specs_with_the_way_to_time_them():
    from types import SimpleNamespace
    from attngen.eval.bench.forward import check_options
    paths = [ROOT / "specs" / n for n in ("h100_wgmma_d128_expr_prefix_lm.yaml", "h100_mma_d128_softcap.yaml",
                                          "h100_mma_d128.yaml")]
    plans = [make_plan(parse_spec(spec_text(p), p.name)) for p in paths]
    problems = check_options(paths, plans, SimpleNamespace(varlen=False))
    assert len(problems) == 1 and "h100_wgmma_d128_expr_prefix_lm, h100_mma_d128_softcap take" in problems[0]
    assert "variant_bench.py" in problems[0]
    assert check_options(paths[2:], plans[2:], SimpleNamespace(varlen=False)) == []


def test_explain_json_carries_the_expressions():
    from attngen.explain import plan_dict
    d = plan_dict(make_plan(parse_spec(spec_text(ROOT / "specs" / "lab" / "h100_mma_d128_expr_window.yaml"), "x")))
    e = d["expressions"]
    assert e["params"] == {"left": "int"} and "kv_idx <= q_idx + causal_offset" in e["mask"] and e["score"] is None
    assert sum(e["sample_4096"].values()) == (4096 // 128) * (4096 // 64) and e["later_rows_see_more"] is True
    assert plan_dict(make_plan(parse_spec(spec_text(ROOT / "specs" / "h100_mma_d128.yaml"), "x")))["expressions"] is None
