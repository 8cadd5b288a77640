"""The tensor-map encoder on a thread with no CUDA context current (torch's autograd threads may have none):
where cuTensorMapEncodeTiled refuses with CUDA_ERROR_INVALID_CONTEXT, encode_at makes the tensors' GPU's primary
context current, encodes again and gives the thread back the context it had. No GPU: the driver is a stand-in."""
from __future__ import annotations

import pytest

from attngen.core.tensor_maps import TensorMapSpec
from attngen.runtime import driver as cuda
from attngen.runtime import tma

SPEC = TensorMapSpec("q", 80, 64, "128B")
ARGS = (0x7F0000000000, (1, 8, 1000, 128), (1024000, 128000, 128, 1), "bfloat16", 2, SPEC)


@pytest.fixture
def stand_in(monkeypatch):
    """A driver whose encoder needs a context current; {"current": ..., "calls": [...]}."""
    state = {"current": None, "calls": []}

    def encoder(*args):
        state["calls"].append(state["current"])
        return 0 if state["current"] is not None else tma.CUDA_ERROR_INVALID_CONTEXT
    monkeypatch.setattr(tma, "driver", lambda: encoder)
    monkeypatch.setattr(cuda, "current_context", lambda: state["current"])
    monkeypatch.setattr(cuda, "set_current_context", lambda ctx: state.__setitem__("current", ctx))
    return state


def test_a_refused_encode_is_made_again_in_the_gpus_context(stand_in):
    assert len(tma.encode_at(*ARGS, context=0xC0)) == tma.MAP_BYTES
    assert stand_in["calls"] == [None, 0xC0] and stand_in["current"] is None   # the thread gets back none


def test_without_a_context_to_use_the_refusal_is_reported(stand_in):
    with pytest.raises(ValueError, match="CUresult 201"):
        tma.encode_at(*ARGS)
    assert stand_in["calls"] == [None]


def test_a_thread_with_a_context_encodes_once(stand_in):
    stand_in["current"] = 0xAA
    tma.encode_at(*ARGS, context=0xC0)
    assert stand_in["calls"] == [0xAA] and stand_in["current"] == 0xAA
