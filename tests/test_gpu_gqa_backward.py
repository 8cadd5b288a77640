"""GPU tests of the Hopper backward's group-split path (GQA/MQA: a KV head's query heads spread over
blocks, dK and dV added into fp32 sums, then kv_convert): dq, dk and dv against SDPA's fp32 autograd
under FlashAttention's gradient rule (2x the error of torch in the inputs' dtype, plus the rounding
floor), at groups 2, 4, 8 and MQA (8/1, 32/1), causal and not, d64, d128 and d256 (warpgroups sharing
the keys, each holding half the columns), odd sequence lengths
(Sq != Sk both ways), fp16 and bf16, every split count of a group; the window, softcap and ALiBi
members through verify's backward case; the routing (which calls split,
which keep the unsplit path) and deterministic mode. The splits add dK and dV in any order, so those
are compared under the rule, not bit for bit (as dQ always is). Skipped where there is no sm_90 GPU."""
from __future__ import annotations

import functools
from pathlib import Path

import pytest

import attngen
from attngen.eval import verify
from attngen.eval.verify.backward import rounding_floor

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
SPECS = {(d, dtype): ROOT / "specs" / f"h100_bwd_d{d}_wgmma{'' if dtype == 'float16' else '_bf16'}.yaml"
         for d in (64, 128, 256) for dtype in ("float16", "bfloat16")}
# (batch, heads, kv_heads, seqlen_q, seqlen_k): groups 2, 4, 8 and MQA 8/1, 32/1; lengths that are no
# multiple of any tile, Sq < Sk and Sq > Sk
SHAPES = [(2, 4, 2, 257, 257), (1, 8, 2, 300, 191), (1, 16, 2, 211, 333), (2, 8, 1, 129, 200), (1, 32, 1, 157, 203)]


def needs_sm90():
    import torch
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Hopper backward (sm_90a) needs an sm_90 GPU")


@functools.lru_cache(maxsize=None)
def kernel(path):
    return attngen.load(path, synchronize=True)


def inputs(torch, shape, d, dtype, seed):
    b, h, hk, sq, sk = shape
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*s):
        return torch.randn(s, generator=gen, device="cuda")
    return randn(b, h, sq, d), randn(b, hk, sk, d), randn(b, hk, sk, d), randn(b, h, sq, d)


def reference(torch, q32, k32, v32, do32, causal, dtype):
    """(out in fp32, lse, [dq, dk, dv] fp32 reference, [dq, dk, dv] of torch in `dtype`)."""
    import torch.nn.functional as F
    grads = []
    for dt in (torch.float32, dtype):
        leaves = [t.detach().to(dt).requires_grad_() for t in (q32, k32, v32)]
        with verify.exact_fp32_matmul(torch):
            out = F.scaled_dot_product_attention(*leaves, is_causal=causal, enable_gqa=True)
            out.backward(do32.to(dt))
        grads.append([t.grad.float() for t in leaves])
        if dt is torch.float32:
            out32 = out.detach()
    group = q32.shape[1] // k32.shape[1]
    with verify.exact_fp32_matmul(torch):
        s = (q32 @ k32.repeat_interleave(group, 1).transpose(-1, -2)) / q32.shape[-1] ** 0.5
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device="cuda").triu(1), float("-inf"))
    return out32, torch.logsumexp(s, -1).contiguous(), grads[0], grads[1]


def check(torch, got, ref, low, dtype, what):
    for name, g, want, base in zip(("dq", "dk", "dv"), got, ref, low):
        assert torch.isfinite(g).all(), f"{what} {name}: non-finite values (unwritten?)"
        err = (g.float() - want).abs().max().item()
        bound = verify.error_bound((base - want).abs().max().item()) + rounding_floor(torch, want, dtype)
        assert err <= bound, f"{what} {name}: {err:.3g} > {bound:.3g}"


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True], ids=["none", "causal"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_group_split_gradients(shape, causal, d, dtype):
    """Every split count of the group (1: the unsplit path) passes the rule; the default call splits
    (these grids are far below the split heuristic's target) and writes every element (outputs
    poisoned with NaN)."""
    import torch
    needs_sm90()
    dt = getattr(torch, dtype)
    k = kernel(SPECS[d, dtype])
    q32, k32, v32, do32 = inputs(torch, shape, d, dt, seed=sum(shape) + d)
    out32, lse, ref, low = reference(torch, q32, k32, v32, do32, causal, dt)
    q, kk, v, o, do = (t.to(dt) for t in (q32, k32, v32, out32, do32))
    group = shape[1] // shape[2]
    got = k(q, kk, v, o, lse, do, causal=causal)
    assert k.last_group_splits == group > 1
    check(torch, got, ref, low, dt, "default")
    for splits in (s for s in range(1, group + 1) if group % s == 0):
        poisoned = [torch.full_like(t, float("nan")) for t in (q, kk, v)]
        got = k(q, kk, v, o, lse, do, causal=causal, group_splits=splits, dq=poisoned[0], dk=poisoned[1],
                dv=poisoned[2])
        assert k.last_group_splits == splits
        check(torch, got, ref, low, dt, f"group_splits={splits}")


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_group_split_layouts_and_repeat_calls(layout):
    """bshd inputs and a second call of one shape (the prepared path: new scratch, zeroed sums) give
    the first call's gradients within the sums' rounding."""
    import torch
    needs_sm90()
    dt = torch.bfloat16
    k = kernel(SPECS[128, "bfloat16"])
    shape = (2, 8, 2, 190, 190)
    q32, k32, v32, do32 = inputs(torch, shape, 128, dt, seed=11)
    out32, lse, ref, low = reference(torch, q32, k32, v32, do32, True, dt)
    args = [t.to(dt) for t in (q32, k32, v32, out32)]
    do = do32.to(dt)
    if layout == "bshd":
        args, do = [t.transpose(1, 2).contiguous() for t in args], do.transpose(1, 2).contiguous()
    first = k(*args[:4], lse, do, causal=True, layout=layout)
    second = k(*args[:4], lse, do, causal=True, layout=layout)
    assert k.last_group_splits == 4
    for got in (first, second):
        got = [g.transpose(1, 2) if layout == "bshd" else g for g in got]
        check(torch, got, ref, low, dt, layout)
    for a, b in zip(first, second):
        assert (a.float() - b.float()).abs().max().item() <= 2e-2 * b.float().abs().max().item()


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("splits, deterministic", [(1, False), (4, False), (1, True)],
                         ids=["unsplit", "split4", "deterministic"])
def test_return_delta_is_each_rows_do_dot_o(layout, splits, deterministic):
    """return_delta=True hands back the preprocess kernel's delta, rowsum(dO * O) per query row as fp32
    (B, Hq, Sq) like lse, in either layout and wherever the scratch puts it (after the group split's sums,
    beside the deterministic turns), on the full call and on the prepared call that repeats it; the
    gradients are the call's without it."""
    import torch
    needs_sm90()
    dt = torch.bfloat16
    k = kernel(SPECS[128, "bfloat16"])
    shape = (2, 8, 2, 190, 190)
    q32, k32, v32, do32 = inputs(torch, shape, 128, dt, seed=13)
    out32, lse, _ref, _low = reference(torch, q32, k32, v32, do32, True, dt)
    args = [t.to(dt) for t in (q32, k32, v32, out32)]
    do = do32.to(dt)
    want = (do.float() * args[3].float()).sum(-1)                         # (B, Hq, Sq)
    if layout == "bshd":
        args, do = [t.transpose(1, 2).contiguous() for t in args], do.transpose(1, 2).contiguous()
    results = [k(*args, lse, do, causal=True, layout=layout, group_splits=splits, deterministic=deterministic,
                 return_delta=True) for _ in range(2)]     # the full call (a key no other test makes), then prepared
    plain = k(*args, lse, do, causal=True, layout=layout, group_splits=splits, deterministic=deterministic)
    for call, (*grads, delta) in enumerate(results):
        assert delta.shape == lse.shape and delta.dtype == torch.float32 and delta.is_contiguous(), call
        assert (delta - want).abs().max().item() <= 1e-3 * want.abs().max().item(), call
        for a, b in zip(grads, plain):
            assert (a.float() - b.float()).abs().max().item() <= 2e-2 * b.float().abs().max().item(), call


MEMBERS = [ROOT / "specs" / f"h100_bwd_d{d}_wgmma_{m}.yaml" for d in (64, 128, 256)
           for m in ("window", "softcap", "alibi", "softcap_alibi", "window_softcap")]


@pytest.mark.parametrize("spec", MEMBERS, ids=[p.stem for p in MEMBERS])
def test_group_split_members(spec):
    """The window and score-modifier members (fp16) on a GQA and an MQA shape: verify's backward case
    (its reference applies the window, softcap and ALiBi; outputs poisoned; the PyCUDA launch within
    the rule) for every variant of the spec's masks, through the group-split functions."""
    from attngen.eval.verify.backward import check_backward_case
    needs_sm90()
    k = kernel(spec)
    failed = []
    for variant in verify.variants(k.plan.masks, k.plan.block_n):
        for i, shape in enumerate((verify.Shape(2, 8, 2, 257, 300), verify.Shape(1, 16, 1, 190, 131, "bshd"))):
            r = check_backward_case(k, variant, shape, 40 + i, k.name)
            assert k.last_group_splits == shape.heads // shape.kv_heads
            if not r.passed:
                failed.append(f"{variant.label} {shape}: {'; '.join(r.problems)}")
    assert not failed, "\n".join(failed)


def test_routing():
    """MHA, deterministic calls and the group_splits checks: the unsplit path where it must be."""
    import torch
    needs_sm90()
    dt = torch.float16
    k = kernel(SPECS[64, "float16"])
    mha = (1, 4, 4, 130, 130)
    q32, k32, v32, do32 = inputs(torch, mha, 64, dt, seed=5)
    out32, lse, ref, low = reference(torch, q32, k32, v32, do32, False, dt)
    args = [t.to(dt) for t in (q32, k32, v32, out32)]
    check(torch, k(*args, lse, do32.to(dt)), ref, low, dt, "mha")
    assert k.last_group_splits == 1
    with pytest.raises(ValueError, match="divisor"):
        k(*args, lse, do32.to(dt), group_splits=2)
    gqa = (1, 8, 2, 300, 300)
    q32, k32, v32, do32 = inputs(torch, gqa, 64, dt, seed=6)
    out32, lse, ref, low = reference(torch, q32, k32, v32, do32, True, dt)
    args = [t.to(dt) for t in (q32, k32, v32, out32)]
    runs = [k(*args, lse, do32.to(dt), causal=True, deterministic=True) for _ in range(2)]
    assert k.last_group_splits == 1
    check(torch, runs[0], ref, low, dt, "deterministic")
    for a, b in zip(*runs):   # the unsplit path: dk, dv (and dq, in turns) repeat bit for bit
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="deterministic"):
        k(*args, lse, do32.to(dt), causal=True, deterministic=True, group_splits=2)
    with pytest.raises(ValueError, match="divisor"):
        k(*args, lse, do32.to(dt), causal=True, group_splits=3)


def test_attention_autograd_gqa_splits():
    """loss.backward() through attngen.attention on a GQA shape: the table's backward spec takes the
    group-split path and the gradients pass the rule."""
    import torch
    needs_sm90()
    import torch.nn.functional as F
    dt = torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(9)
    q, k, v, dout = (torch.randn(s, generator=gen, device="cuda").to(dt) for s in
                     ((2, 16, 333, 128), (2, 2, 333, 128), (2, 2, 333, 128), (2, 16, 333, 128)))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    attngen.attention(*leaves, causal=True).backward(dout)
    grads = []
    for t_dtype in (torch.float32, dt):
        ls = [t.detach().to(t_dtype).requires_grad_() for t in (q, k, v)]
        with verify.exact_fp32_matmul(torch):
            F.scaled_dot_product_attention(*ls, is_causal=True, enable_gqa=True).backward(dout.to(t_dtype))
        grads.append([t.grad.float() for t in ls])
    check(torch, [t.grad for t in leaves], grads[0], grads[1], dt, "attention")
