"""The model zoo on the GPU (attngen/eval/zoo.py, docs/model-zoo.md): every attention layer of the zoo
run as a training step, a varlen prefill and a paged decode step through attngen's entry points.
A cell attngen serves must pass FlashAttention's error rule against the written-out fp32 reference
(output, and training's dq, dk, dv and the sinks' gradient); the cells attngen refuses must be
exactly zoo.EXPECTED_REFUSALS, so a new refusal fails here and so does a cell served from now on
until it leaves the list. sm_90 only: the list is the sm_90 dispatch table's. No timing here
(docs/zoo-h200/model_zoo.py times the cells); about a minute on an H200 with a warm cubin cache."""
from __future__ import annotations

import functools

import pytest

from attngen.eval import zoo

pytestmark = pytest.mark.gpu

CELLS = [(layer.name, cell) for layer, cell in zoo.zoo_cells()]


@pytest.fixture
def torch():
    import torch
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the zoo's expected refusals are those of the sm_90 (H100/H200) dispatch table")
    return torch


@functools.lru_cache(maxsize=None)
def result(name: str, cell: str) -> zoo.CellResult:
    """The cell's result, run once per session whichever test asks first."""
    import torch
    try:
        return zoo.run_cell(torch, zoo.LAYER[name], cell)
    finally:
        torch.cuda.empty_cache()


@pytest.mark.parametrize("name, cell", CELLS, ids=[f"{n}-{c}" for n, c in CELLS])
def test_a_served_cell_passes_and_a_refused_one_is_listed(torch, name, cell):
    r = result(name, cell)
    listed = zoo.EXPECTED_REFUSALS.get((name, cell))
    if r.status == "refused":
        assert listed is not None, f"{name} {cell} is refused and not in zoo.EXPECTED_REFUSALS: {r.message}"
        return
    assert listed is None, (f"{name} {cell} is served now ({'passes' if r.passed else r.problems()}): take "
                            f"({name!r}, {cell!r}) out of zoo.EXPECTED_REFUSALS")
    assert r.outputs and r.passed, f"{name} {cell} ({zoo.LAYER[name].label}): {r.problems()}"


def test_the_refused_cells_are_the_expected_ones(torch):
    refused = {}
    for name, cell in CELLS:
        r = result(name, cell)
        if r.status == "refused":
            refused[(name, cell)] = r.message
    new = {key: refused[key] for key in sorted(set(refused) - set(zoo.EXPECTED_REFUSALS))}
    served = sorted(set(zoo.EXPECTED_REFUSALS) - set(refused))
    assert not new and not served, f"refused and not listed: {new}; listed and served now: {served}"


def test_the_table_predicts_what_the_gpu_did(torch):
    """zoo.table_cell keys each call as the entry points do: its refusals are the GPU run's."""
    for name, cell in CELLS:
        predicted = zoo.table_cell(zoo.LAYER[name], cell).refusal is not None
        assert predicted == (result(name, cell).status == "refused"), (name, cell, result(name, cell).message)
