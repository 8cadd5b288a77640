"""The built-in variants without a GPU: the window's bounds against a brute-force reading of
FlashAttention's window_size, the score modifiers' Params values and argument checks, the spec
rules that say which kind takes which variant, and what each variant puts in a generated file."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from attngen.core.forward_plan import LOG2E
from attngen.core.variants import (ALIBI, MASKS, SCORES, SOFTCAP, UNBOUNDED, WINDOW, check_window,
                                   score_values, window_bounds)
from attngen.errors import SpecError
from attngen.plan import make_plan
from attngen.spec import parse_spec
from spec_sample import spec_text as committed_text

ROOT = Path(__file__).resolve().parents[1]


def visible_by_definition(i: int, j: int, sq: int, sk: int, left: int, right: int, bottom_right: bool) -> bool:
    """FlashAttention's window_size, read literally: key j is visible to query i when it lies within
    `left` keys before and `right` keys after i's own position (i + Sk - Sq bottom-right, i top-left);
    -1 leaves a side open."""
    pos = i + (sk - sq if bottom_right else 0)
    return (left < 0 or j >= pos - left) and (right < 0 or j <= pos + right) and 0 <= j < sk


@pytest.mark.parametrize("sq,sk", [(5, 5), (3, 9), (9, 3), (1, 1)])
@pytest.mark.parametrize("window", [(0, 0), (1, -1), (-1, 2), (2, 3), (100, 100), (-1, -1)])
@pytest.mark.parametrize("option", ["top_left", "bottom_right"])
def test_window_bounds_match_flash_attention_window_size(sq, sk, window, option):
    lo, hi = window_bounds(option, sq, sk, window)
    for i in range(sq):
        for j in range(sk):
            assert (i + lo <= j <= i + hi) == visible_by_definition(i, j, sq, sk, *window, option == "bottom_right")


def test_window_fields_and_unbounded_sides():
    assert WINDOW.abi_values(None, 4, 10, (3, 0)) == {"window_lo": -3, "window_hi": 0, "window_from_end": 0}
    assert WINDOW.abi_values("bottom_right", 4, 10, (3, -1)) == {"window_lo": 3, "window_hi": UNBOUNDED,
                                                                  "window_from_end": 1}
    # an open side stays beyond any row even after a varlen sequence adds its offset (int32 in the kernel)
    assert UNBOUNDED + 2**30 - 1 < 2**31 and -UNBOUNDED - 2**30 >= -2**31


@pytest.mark.parametrize("bad", [None, 5, (1,), (1, 2, 3), (-2, 0), (0, 1.5), (True, 0), "ab"])
def test_window_argument_is_checked(bad):
    with pytest.raises(ValueError, match="window"):
        check_window(bad)


def test_softcap_folds_the_scale():
    values = SOFTCAP.fill(30.0, 0.125, {})
    assert values["softcap_premul"] == pytest.approx(0.125 / 30.0)
    assert values["scale_log2"] == pytest.approx(30.0 * LOG2E)
    # the kernel's logit is scale_log2 / log2(e) * tanh(s * premul) = cap * tanh(scale * s / cap)
    s = 7.0
    assert values["scale_log2"] / LOG2E * math.tanh(s * values["softcap_premul"]) == pytest.approx(
        30.0 * math.tanh(0.125 * s / 30.0))
    for bad in (0, -1.0, float("inf"), float("nan"), True, "30"):
        with pytest.raises(ValueError, match="softcap"):
            SOFTCAP.fill(bad, 0.125, {})


def test_score_arguments_are_required_and_refused_where_they_do_not_apply():
    with pytest.raises(ValueError, match="pass softcap="):
        score_values((SOFTCAP,), {"softcap": None}, 0.1, {})
    with pytest.raises(ValueError, match="'alibi'"):
        score_values((SOFTCAP,), {"softcap": 5.0, "alibi_slopes": object()}, 0.1, {})
    with pytest.raises(ValueError, match="'softcap'"):
        score_values((), {"softcap": 5.0}, 0.1, {})
    assert score_values((), {"softcap": None, "alibi_slopes": None}, 0.1, {}) == {}


def test_registries_name_each_variant_once():
    assert list(MASKS) == ["none", "causal", "window", "expr"] and list(SCORES) == ["softcap", "alibi", "sink"]
    assert {s.argument for s in SCORES.values()} == {"softcap", "alibi_slopes", "sinks"}


# -- specs ------------------------------------------------------------------------------------------

def spec_text(path: str, **changes) -> str:
    lines = committed_text(ROOT / "specs" / path).splitlines()
    out = []
    for line in lines:
        key = line.split(":", 1)[0]
        if key in changes:
            value = changes.pop(key)
            if value is not None:
                out.append(f"{key}: {value}")
        else:
            out.append(line)
    out += [f"{k}: {v}" for k, v in changes.items() if v is not None]
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("path", ["phase4.yaml", "phase5_wmma.yaml"])
def test_kinds_without_the_hooks_refuse_window_and_scores(path):
    with pytest.raises(SpecError, match="does not generate the window mask") as e:
        parse_spec(spec_text(path, masks="[none, window]"), file="x.yaml")
    assert e.value.key == "masks"
    with pytest.raises(SpecError, match="does not apply score modifiers") as e:
        parse_spec(spec_text(path, scores="[softcap]"), file="x.yaml")
    assert e.value.key == "scores"


def test_decode_takes_the_builtins_or_expressions():
    spec = parse_spec(spec_text("h200_decode_d128.yaml", masks="[none, causal, window]", scores="[softcap, alibi]"),
                      file="x.yaml")
    assert spec.masks == ["none", "causal", "window"] and spec.scores == ["softcap", "alibi"]
    spec = parse_spec(spec_text("h200_decode_d128.yaml", masks=None) + "variant: {mask: \"kv_idx <= q_idx\"}\n",
                      file="x.yaml")
    assert spec.masks == ["expr"]
    with pytest.raises(SpecError, match="not both") as e:
        parse_spec(spec_text("h200_decode_d128.yaml", masks=None, scores="[softcap]")
                   + "variant: {mask: \"kv_idx <= q_idx\"}\n", file="x.yaml")
    assert e.value.key == "scores"


def test_scores_are_listed_once_in_their_order():
    with pytest.raises(SpecError, match=r"order \['softcap', 'alibi', 'sink'\]"):
        parse_spec(spec_text("h100_mma_d128.yaml", scores="[alibi, softcap]"), file="x.yaml")
    with pytest.raises(SpecError, match="twice"):
        parse_spec(spec_text("h100_mma_d128.yaml", scores="[alibi, alibi]"), file="x.yaml")
    with pytest.raises(SpecError, match="scores.0"):
        parse_spec(spec_text("h100_mma_d128.yaml", scores="[bias]"), file="x.yaml")


def render(path: str, **changes) -> tuple:
    from attngen.render import render_for
    plan, source, _ = render_for(parse_spec(spec_text(path, **changes), file="x.yaml"))
    return plan, source


@pytest.mark.parametrize("path", ["h100_mma_d128.yaml", "lab/h100_wgmma_d128.yaml"])
def test_each_variant_brings_only_its_own_fields_and_code(path):
    plain_plan, plain = render(path)
    names = {f.name for f in plain_plan.abi.fields}
    assert not names & {"window_lo", "window_hi", "softcap_premul", "alibi_slopes"}
    assert "Mask::Window" not in plain and "tanh" not in plain and "alibi_slope" not in plain

    plan, window = render(path, masks="[causal, window]")
    assert {"window_lo", "window_hi"} <= {f.name for f in plan.abi.fields}
    assert "Mask::Window" in window and "tanh" not in window

    plan, scored = render(path, scores="[softcap, alibi]")
    fields = {f.name for f in plan.abi.fields}
    assert {"softcap_premul", "alibi_slopes", "alibi_batch_stride"} <= fields and "window_lo" not in fields
    assert "tanh.approx.f32" in scored and "Mask::Window" not in scored
    # softcap comes before ALiBi (the bias is added to the capped logit)
    assert scored.index("s = tanh_approx(s * softcap_premul);") < scored.index("s = fmaf(-alibi_slope")


def test_varlen_alibi_moves_the_slopes_to_the_sequence():
    _, source = render("h100_mma_d128.yaml", scores="[alibi]", varlen="true")
    assert "scores_for_sequence(s, b);" in source
    _, source = render("h100_mma_d128.yaml", scores="[softcap]", varlen="true")
    assert "scores_for_sequence" not in source


def test_explain_names_the_score_modifiers():
    from attngen.explain import explain, plan_dict
    plan = make_plan(parse_spec(committed_text(ROOT / "specs" / "h100_wgmma_d128_alibi.yaml")))
    text = explain(plan)
    assert "masks none, causal, window, scores alibi" in text.splitlines()[0]
    assert "alibi: ALiBi" in text and "alibi_slopes=" in text
    assert plan_dict(plan)["scores"] == ["alibi"] and plan_dict(plan)["masks"] == ["none", "causal", "window"]
    plain = explain(make_plan(parse_spec(committed_text(ROOT / "specs" / "lab" / "h100_wgmma_d128.yaml"))))
    assert "scores (" not in plain and ", scores " not in plain.splitlines()[0]
