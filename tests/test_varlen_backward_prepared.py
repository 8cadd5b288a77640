"""The varlen backward call's prepared path without a GPU (stand-in tensors, launches recorded): a repeated call
of a layout patches its own addresses into the first call's Params, the varlen pointers (offsets, order) after
the others (the patch writes each at its ABI place); another layout, given gradients, validate=True or a misaligned pointer take the full path.
On the GPU: tests/test_gpu_backward.py (test_repeated_varlen_backward_calls_take_the_prepared_path)."""
from __future__ import annotations

import struct
from pathlib import Path

import pytest

from attngen.plan import make_plan
from attngen.spec import load_spec
from test_merge import F32, HALF, FakeTensor, recording_kernel
from test_kv_append import I32, fake_torch

ROOT = Path(__file__).resolve().parent.parent


class Tensor(FakeTensor):
    def new_empty(self, shape, dtype=None):
        return Tensor(shape, dtype or self.dtype)

    def unsqueeze(self, dim):      # the views a kind with tensor maps is given (see FakeMaps)
        return self

    def transpose(self, a, b):
        return self


class FakeMaps:
    """Stand-in ShapeMaps: each map's 'encoding' is its field's size in bytes of q's address's low byte, plus
    the map's index."""

    def __init__(self, sizes):
        self.sizes = sizes

    def values(self, pointers):
        return tuple(bytes([(pointers[0] + i) % 251]) * size for i, size in enumerate(self.sizes))


def backward_kernel(name, monkeypatch):
    """A BackwardKernel of the spec's plan whose launches are recorded instead of run."""
    from attngen.runtime.calls import backward, shared
    plan = make_plan(load_spec(ROOT / "specs" / f"{name}.yaml"))
    torch = fake_torch()
    torch.empty = lambda shape, dtype=None, device=None: Tensor(shape, dtype or HALF)
    torch.zeros = lambda shape, dtype=None, device=None: Tensor((shape,) if isinstance(shape, int) else shape,
                                                              dtype or HALF)
    torch.empty_like = lambda t: Tensor(t.shape, t.dtype, strides=t.stride())
    k = recording_kernel(backward.BackwardKernel, plan, HALF, torch)
    monkeypatch.setattr(backward, "error_word", lambda index: 1 << 42)
    monkeypatch.setattr(shared, "longest_first", lambda torch, cu: Tensor((cu.shape[0] - 1,), I32))
    k._setup()
    if k._map_fields:
        sizes = {f.name: f.size for f in plan.abi.fields}
        k._shape_maps = lambda views: FakeMaps([sizes[m] for m in k._map_fields])
    return k


def call_args(d=64, total_q=300, total_k=300, batch=4):
    q = Tensor((total_q, 16, d), HALF)
    return dict(q=q, k=Tensor((total_k, 4, d), HALF), v=Tensor((total_k, 4, d), HALF), out=Tensor(q.shape, HALF),
                lse=Tensor((16, total_q), F32), dout=Tensor(q.shape, HALF), cu_seqlens_q=Tensor((batch + 1,), I32),
                cu_seqlens_k=Tensor((batch + 1,), I32))


def call(k, a, **kw):
    return k.varlen(a["q"], a["k"], a["v"], a["out"], a["lse"], a["dout"], a["cu_seqlens_q"], a["cu_seqlens_k"],
                    causal=True, **kw)


def launched_params(k, prepared, pointers) -> dict:
    params = bytearray(prepared.template)
    prepared.patch.pack_into(params, 0, pointers)
    return {f.name: v for f, v in zip(k.plan.abi.fields, struct.unpack(k.plan.abi.struct_format(), bytes(params)))}


@pytest.mark.parametrize("name", ["h100_bwd_d64_wgmma_varlen_bf16", "h100_bwd_d64_varlen_bf16"])
def test_a_repeated_varlen_backward_is_a_prepared_launch_with_its_own_addresses(name, monkeypatch):
    k = backward_kernel(name, monkeypatch)
    calls = [call_args(), call_args()]
    grads = [call(k, a) for a in calls]
    (p1, pointers1), (p2, pointers2) = k.launched
    assert p2 is p1 and len(k._prepared) == 1
    for a, g, pointers in zip(calls, grads, (pointers1, pointers2)):
        got = launched_params(k, p1, pointers)
        for field, arg in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "out"), ("lse", "lse"), ("dout", "dout"),
                           ("cu_seqlens_q", "cu_seqlens_q"), ("cu_seqlens_k", "cu_seqlens_k")):
            assert got[field] == a[arg].data_ptr(), field
        assert (got["dq"], got["dk"], got["dv"]) == tuple(t.data_ptr() for t in g)
        assert got["seq_order"] not in (0, a["cu_seqlens_k"].data_ptr())
        assert got["dq_accum"] and got["delta"] and got["dq_accum"] != got["delta"]
        assert (got["total_q"], got["total_k"], got["batch"]) == (300, 300, 4)
        for i, field in enumerate(k._map_fields):      # the maps of this call's q
            assert got[field] == bytes([(a["q"].data_ptr() + i) % 251]) * len(got[field])
    assert pointers1 != pointers2


@pytest.mark.parametrize("change", ["another total_k", "given gradients", "validate", "misaligned dout",
                                    "max_seqlen_k", "deterministic"])
def test_a_varlen_backward_that_differs_takes_the_full_path(change, monkeypatch):
    from attngen.runtime.calls import backward
    k = backward_kernel("h100_bwd_d64_varlen_bf16", monkeypatch)
    full = []
    first = backward.check_sequences
    monkeypatch.setattr(backward, "check_sequences", lambda *a, **kw: full.append(1) or first(*a, **kw))
    call(k, call_args())
    call(k, call_args())
    assert len(full) == 1
    a, kw = call_args(), {}
    if change == "another total_k":
        a = call_args(total_k=400)
    elif change == "given gradients":
        kw = {"dq": Tensor(a["q"].shape, HALF)}
    elif change == "validate":
        kw = {"validate": True}
        monkeypatch.setattr(backward, "offsets_on_host", lambda name, cu, total, where: [0, total])
    elif change == "misaligned dout":
        a["dout"] = Tensor(a["dout"].shape, HALF, ptr=a["dout"].data_ptr() + 8)
        with pytest.raises(ValueError, match="align"):
            call(k, a)
        assert len(full) == 2
        return
    elif change == "max_seqlen_k":
        kw = {"max_seqlen_k": 100}
    else:
        kw = {"deterministic": True}
    call(k, a, **kw)
    assert len(full) == 2
    got = launched_params(k, *k.launched[-1])
    if change == "another total_k":
        assert got["total_k"] == 400
    elif change == "deterministic":
        assert got["dq_turns"] != 0
    elif change == "max_seqlen_k":
        (_, grid) = k.launched[-1][0].launches[1]
        assert grid[0] == -(-100 // k.plan.block_n)
