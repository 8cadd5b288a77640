"""The model zoo's table (attngen/eval/zoo.py), without a GPU: its layers say what the models' configs
say and exercise what they claim to (a window shorter than the tokens run), and the committed dispatch
table refuses on sm_90 exactly the cells EXPECTED_REFUSALS lists, so a change to the table that serves
a zoo cell, or stops serving one, fails here before any GPU run. tests/test_gpu_model_zoo.py runs the
cells."""
from __future__ import annotations

import math

import pytest

from attngen.eval import zoo


def test_layer_names_are_unique_and_cells_known():
    assert len(zoo.LAYER) == len(zoo.LAYERS)
    for layer in zoo.LAYERS:
        assert layer.cells and set(layer.cells) <= set(zoo.CELLS), layer.name
        assert layer.dtype in zoo.TORCH_DTYPES, layer.name


@pytest.mark.parametrize("layer", zoo.LAYERS, ids=lambda layer: layer.name)
def test_a_layer_keeps_its_models_head_ratio(layer):
    model_q, model_kv = layer.model_heads
    assert model_q % model_kv == 0 and layer.heads % layer.kv_heads == 0
    assert layer.heads // layer.kv_heads == model_q // model_kv
    assert layer.heads <= model_q


@pytest.mark.parametrize("layer", [layer for layer in zoo.LAYERS if layer.window], ids=lambda layer: layer.name)
def test_a_window_is_shorter_than_the_sequences_it_masks(layer):
    """Otherwise the window hides nothing and the cell checks a causal call."""
    assert layer.causal and layer.window_size == (layer.window - 1, 0)
    assert layer.seqlen > layer.window
    assert max(layer.varlen_lengths) > layer.window
    assert "paged_decode" not in layer.cells or max(layer.decode_lengths) > layer.window


def test_decode_and_the_sequence_lengths():
    for layer in zoo.LAYERS:
        assert "paged_decode" not in layer.cells or layer.causal, layer.name   # decode is a causal model's step
        lengths = layer.varlen_lengths
        assert len(lengths) == 3 and len(set(lengths)) == 3 and min(lengths) >= 1
        assert len(layer.decode_lengths) >= 3 and min(layer.decode_lengths) >= 1


def test_the_zoo_covers_the_issues_models():
    """#59's list: every head dim the models use, MQA with an odd head count, V with its own head dim,
    and each variant on its own and in Gemma 2's and gpt-oss's combinations."""
    layers = zoo.LAYERS
    assert {layer.head_dim for layer in layers} >= {40, 64, 80, 96, 128, 160, 192, 256}
    assert any(layer.kv_heads == 1 and layer.heads % 2 for layer in layers)
    assert any(layer.head_dim_v and layer.head_dim_v != layer.head_dim for layer in layers)
    gemma2 = [layer for layer in layers if layer.model == "Gemma 2 9B"]
    assert {(layer.window, layer.softcap, layer.scale) for layer in gemma2} == \
        {(4096, 50.0, 1 / 16), (None, 50.0, 1 / 16)}
    gptoss = [layer for layer in layers if layer.model.startswith("gpt-oss")]
    assert {layer.window for layer in gptoss} == {128, None} and all(layer.sinks for layer in gptoss)
    assert any(layer.alibi for layer in layers)
    assert {layer.head_dim for layer in layers if not layer.causal} >= {40, 64, 80, 160}


def test_mpt_alibi_slopes():
    """MPT's gen_slopes: 1 / 2^(8 i / n) for n heads a power of two, interleaved otherwise."""
    s32 = zoo.mpt_alibi_slopes(32)
    assert s32[0] == pytest.approx(2 ** -0.25) and s32[-1] == pytest.approx(2 ** -8)
    s12 = zoo.mpt_alibi_slopes(12)        # from the 16 slopes: the odd ones, then the even ones
    s16 = zoo.mpt_alibi_slopes(16)
    assert s12 == (s16[1::2] + s16[::2])[:12]


def test_deepseek_scale_is_yarns():
    layer = zoo.LAYER["deepseek_v3_mla"]
    assert layer.softmax_scale == pytest.approx(192 ** -0.5 * (0.1 * math.log(40) + 1) ** 2)
    assert (layer.head_dim, layer.v_dim) == (192, 128)


def test_the_table_refuses_exactly_the_expected_cells():
    """The committed dispatch table, keyed as the entry points key a call, serves every zoo cell but
    those EXPECTED_REFUSALS lists on sm_90."""
    refused = zoo.table_refusals()
    assert set(refused) == set(zoo.EXPECTED_REFUSALS), (
        f"refused, not listed: {sorted(set(refused) - set(zoo.EXPECTED_REFUSALS))}; "
        f"listed, now served: {sorted(set(zoo.EXPECTED_REFUSALS) - set(refused))}")


def test_a_refusal_names_the_cells_head_dim():
    for (name, cell), message in zoo.table_refusals().items():
        layer = zoo.LAYER[name]
        assert f"head_dim {layer.head_dim}" in message or "V's head dim" in message, message
        assert f"d{layer.head_dim}" in zoo.EXPECTED_REFUSALS[(name, cell)]


def test_every_served_cell_names_specs_that_exist():
    from attngen.core.spec_cells import names_spec
    from attngen.ops.dispatch import SPECS_DIR
    specs = zoo.served_specs()
    assert specs and all(names_spec(SPECS_DIR, name) for name in specs), specs
    for layer, cell in zoo.zoo_cells():
        found = zoo.table_cell(layer, cell)
        assert (found.refusal is None) == bool(found.specs), (layer.name, cell)
        assert not found.specs or len(found.specs) == (2 if cell == "train" else 1)   # train: forward, backward


def test_an_arch_without_entries_refuses_every_cell():
    entries = zoo.committed_entries()
    assert len(zoo.table_refusals("sm_100", entries)) == len(zoo.zoo_cells())


def test_refusal_of_takes_attngens_refusals_only():
    assert zoo.refusal_of(LookupError("attngen has no varlen kernel for sm_90"))
    assert zoo.refusal_of(NotImplementedError("attngen has no backward for this call yet"))
    assert zoo.refusal_of(ValueError("there is no kernel for this head dim"))
    assert zoo.refusal_of(ValueError("cache_seqlens holds 9, outside [0, 8]")) is None
    assert zoo.refusal_of(RuntimeError("no kernel")) is None
