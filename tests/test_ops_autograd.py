"""The autograd plumbing of attngen.attention without a GPU: with stand-in CPU implementations of its
ops (torch SDPA), a call on tensors that need gradients goes through attngen::attention_train, whose
registered backward calls attngen::attention_backward with what the forward saved; the LSE takes no
gradient; torch.compile(fullgraph=True) traces a training step through both ops. Needs torch (CPU is
enough); the kernels themselves are checked by tests/test_gpu_backward.py."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: pip install -e '.[gpu]' (the CPU build will do)")


def _sdpa(q, k, v, causal, scale, layout):
    t = (lambda x: x) if layout == "bhsd" else (lambda x: x.transpose(1, 2))
    q, k, v = t(q), t(k), t(v)
    s = (q.float() @ k.float().transpose(-1, -2)) * (scale or q.shape[-1] ** -0.5)
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return t((torch.softmax(s, -1) @ v.float()).to(q.dtype)), torch.logsumexp(s, -1)


def stand_in_gradients(dout, q, k, v, causal, scale, layout):
    """(dq, dk, dv) of _sdpa at dout, through autograd in fp32: the backward op's CPU stand-in."""
    leaves = [x.detach().float().requires_grad_() for x in (q, k, v)]
    with torch.enable_grad():   # autograd runs a backward with gradients off
        o, _ = _sdpa(*leaves, causal, scale, layout)
        o.backward(dout.float())
    return tuple(x.grad.to(q.dtype) for x in leaves)


@pytest.fixture(scope="module")
def cpu_ops():
    import attngen
    from attngen.ops import library
    calls = []

    def train_cpu(q, k, v, causal, alignment, scale, layout):
        calls.append("train")
        return _sdpa(q, k, v, causal, scale, layout)

    def backward_cpu(dout, q, k, v, out, lse, causal, alignment, scale, layout):
        calls.append(("backward", tuple(out.shape), tuple(lse.shape), causal, layout))
        return stand_in_gradients(dout, q, k, v, causal, scale, layout)

    lib = torch.library.Library("attngen", "IMPL")
    lib.impl("attention_train", train_cpu, "CPU")
    lib.impl("attention_backward", backward_cpu, "CPU")
    # the eager call first looks up the table's backward kernel (a GPU's): the stand-ins need none
    patch = pytest.MonkeyPatch()
    patch.setattr(library, "backward_kernel", lambda *args: None)
    yield attngen, calls
    patch.undo()
    lib._destroy()


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_gradients_flow_through_the_backward_op(cpu_ops, layout):
    attngen, calls = cpu_ops
    calls.clear()
    shape = (2, 3, 40, 16) if layout == "bhsd" else (2, 40, 3, 16)
    q, k, v = (torch.randn(shape, requires_grad=True) for _ in range(3))
    o, lse = attngen.attention(q, k, v, causal=True, layout=layout, return_lse=True)
    assert o.grad_fn is not None and not lse.requires_grad
    dout = torch.randn(shape)
    o.backward(dout)
    assert calls[0] == "train" and calls[1] == ("backward", shape, (2, 3, 40), True, layout)
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    _sdpa(*leaves, True, None, layout)[0].backward(dout)
    for a, b in zip((q, k, v), leaves):
        assert torch.allclose(a.grad, b.grad, atol=1e-5)


def test_the_lse_takes_no_gradient(cpu_ops):
    """As FlashAttention's: the LSE output does not require grad, so a loss on it alone is refused."""
    attngen, _ = cpu_ops
    q = torch.randn(1, 2, 8, 16, requires_grad=True)
    _, lse = attngen.attention(q, q, q, return_lse=True)
    with pytest.raises(RuntimeError):
        lse.sum().backward()


def eager_and_compiled_gradients(attngen, before_compiled=lambda: None):
    """q, k and v's gradients of a small training step (causal attention, squared and summed), eager and
    then under torch.compile (fullgraph, aot_eager, compiled anew); before_compiled runs between the two."""
    q, k, v = (torch.randn(1, 2, 32, 16, requires_grad=True) for _ in range(3))

    def step(q, k, v):
        return attngen.attention(q, k, v, causal=True).square().sum()

    step(q, k, v).backward()
    eager = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    before_compiled()
    torch._dynamo.reset()
    torch.compile(step, fullgraph=True, backend="aot_eager")(q, k, v).backward()
    return eager, [x.grad for x in (q, k, v)]


def test_compiled_training_step_has_no_graph_break(cpu_ops):
    attngen, calls = cpu_ops
    eager, compiled = eager_and_compiled_gradients(attngen, calls.clear)
    assert "train" in calls and any(c[0] == "backward" for c in calls if isinstance(c, tuple))
    for a, b in zip(eager, compiled):
        assert torch.allclose(a, b, atol=1e-5)


def _varlen_sinks(q, k, v, cu, causal, scale, sinks):
    """Per-sequence attention of varlen (total, H, D) tensors with learned sinks (a valueless logit per
    head in every row's softmax), bottom-right causal: (o, lse (H, total)) in fp32."""
    outs, lses = [], []
    for b in range(len(cu) - 1):
        s0, s1 = int(cu[b]), int(cu[b + 1])
        qs, ks, vs = (t[s0:s1].float().transpose(0, 1) for t in (q, k, v))
        s = qs @ ks.transpose(-1, -2) * (scale or q.shape[-1] ** -0.5)
        if causal:
            n = s1 - s0
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        joined = torch.cat([s, sinks.float().view(-1, 1, 1).expand(-1, s.shape[1], 1)], dim=-1)
        p = torch.softmax(joined, -1)[..., :-1]
        outs.append((p @ vs).transpose(0, 1))
        lses.append(torch.logsumexp(joined, -1))
    return torch.cat(outs), torch.cat(lses, dim=1)


def test_varlen_training_with_variants_and_sinks(monkeypatch):
    """attention_varlen with variants on tensors that need gradients takes the varlen variant op's
    eager Function: the backward gets the call's window, softcap and slopes, and learned sinks get
    their gradient (library.varlen_sink_gradient) equal to autograd's through the written-out softmax."""
    import attngen
    from attngen.ops import library
    seen = []

    def forward(q, k, v, cu_q, cu_k, max_q, max_k, causal, alignment, scale, window, softcap, alibi_slopes,
                deterministic=False, sinks=None):
        o, lse = _varlen_sinks(q, k, v, cu_q, causal, scale, sinks)
        return o.to(q.dtype), lse

    def backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, alignment, scale, window, softcap,
                 alibi_slopes, deterministic=False):
        seen.append((tuple(out.shape), tuple(lse.shape), causal, alignment, window, softcap, deterministic))
        leaves = [x.detach().float().requires_grad_() for x in (q, k, v)]
        with torch.enable_grad():
            # the kernel's gradients given the LSE that holds the sinks: P = exp(s - lse) without them
            o, _ = _varlen_sinks(*leaves, cu_q, causal, scale, SINKS.detach())
            o.backward(dout.float())
        return tuple(x.grad.to(q.dtype) for x in leaves)

    SINKS = torch.tensor([0.5, -1.0], requires_grad=True)
    _, save, gradients, _ = library._EAGER["attention_varlen_variant"]
    monkeypatch.setitem(library._EAGER, "attention_varlen_variant", (forward, save, gradients, backward))
    monkeypatch.setattr(library, "varlen_backward_kernel", lambda *args: None)
    # on CPU tensors the entry point takes the op; here its eager Function is what is under test
    monkeypatch.setattr(library, "train", lambda call, *inputs: library._EagerTrain.apply(call, *inputs))
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    q, k, v = (torch.randn(8, 2, 8, requires_grad=True) for _ in range(3))
    o = attngen.attention_varlen(q, k, v, cu, cu, 5, 5, causal=True, window=(4, 0), softcap=30.0, sinks=SINKS)
    dout = torch.randn(o.shape)
    o.backward(dout)
    assert seen == [((8, 2, 8), (2, 8), True, None, [4, 0], 30.0, False)]
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v, SINKS)]
    ref, _ = _varlen_sinks(*leaves[:3], cu, True, None, leaves[3])
    ref.backward(dout)
    for a, b in zip((q, k, v, SINKS), leaves):
        assert torch.allclose(a.grad, b.grad, atol=1e-5), (a.grad, b.grad)


def test_compile_traces_the_paged_varlen_call_as_one_op():
    """attention_varlen(block_table=) under torch.compile(fullgraph=True) is one op,
    attngen::attention_varlen_paged, whose fake gives the packed call's output shapes; a CPU stand-in
    of the op receives every argument as given (window as a list, the score modifiers' tensors)."""
    import attngen
    seen = []

    def paged_cpu(q, k, v, cu_q, cu_k, table, used, max_q, max_k, causal, alignment, scale, window, softcap, alibi,
                  sinks):
        seen.append((cu_k is None, tuple(table.shape), tuple(used.tolist()), max_q, max_k, causal, alignment, window,
                     softcap, sinks is not None))
        return torch.full_like(q, 2.0), torch.zeros((q.shape[1], q.shape[0]))

    lib = torch.library.Library("attngen", "IMPL")
    lib.impl("attention_varlen_paged", paged_cpu, "CPU")
    try:
        q = torch.randn(5, 4, 16)
        pool = torch.randn(6, 8, 2, 16)
        cu_q = torch.tensor([0, 1, 5], dtype=torch.int32)
        table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
        used = torch.tensor([9, 4], dtype=torch.int32)
        sinks = torch.randn(4)

        def step(q, k, v):
            return attngen.attention_varlen(q, k, v, cu_q, None, 4, 16, causal=True, block_table=table,
                                            seqused_k=used, window=(8, 0), softcap=30.0, sinks=sinks,
                                            return_lse=True)
        o, lse = torch.compile(step, fullgraph=True, backend="aot_eager")(q, pool, pool)
        assert torch.equal(o, torch.full_like(q, 2.0)) and lse.shape == (4, 5)
        assert seen and seen[-1] == (True, (2, 2), (9, 4), 4, 16, True, None, [8, 0], 30.0, True)
    finally:
        lib._destroy()


def test_prepared_step_binds_forward_and_backward(monkeypatch):
    """attention()'s eager training call (library._PreparedTrain through a _PreparedStep, the path of GPU
    tensors) on CPU stand-ins of its kernels: it saves what attngen::attention_train saves and hands the
    call's options to the backward; the first step takes the full forward and backward and keeps their
    prepared calls, the next ones run those; a dout in other strides (a sum's gradient, expanded) and a
    step under saved-tensor hooks take the full backward; the LSE takes no gradient; every step's
    gradients are SDPA's."""
    from attngen.ops import library
    from attngen.runtime.calls.shared import call_key
    ran = []
    options = (True, None, None, "bhsd", False)

    def reference_gradients(dout, q, k, v, causal):
        leaves = [x.detach().float().requires_grad_() for x in (q, k, v)]
        with torch.enable_grad():
            _sdpa(*leaves, causal, None, "bhsd")[0].backward(dout.float())
        return tuple(x.grad.to(q.dtype) for x in leaves)

    class ForwardKernel:
        def run_prepared(self, prepared, q, k, v, return_lse):
            ran.append(("prepared forward", prepared))
            return _sdpa(q, k, v, True, None, "bhsd")

    class BackwardKernel:
        def prepared_call(self, q, k, v, out, lse, dout, **given):
            assert given == dict(zip(("causal", "alignment", "scale", "layout", "deterministic"), options))
            assert tuple(out.shape) == tuple(q.shape) and tuple(lse.shape) == tuple(q.shape[:-1])
            return "backward Params"

        def run_prepared(self, prepared, q, k, v, out, lse, dout, return_delta=False):
            assert not return_delta
            ran.append(("prepared backward", prepared))
            return reference_gradients(dout, q, k, v, True)

    def full_forward(q, k, v, causal, alignment, scale, layout, return_lse):
        ran.append("full forward")
        library._PREPARED[call_key(q, k, v, causal, alignment, scale, True, layout)] = (ForwardKernel(),
                                                                                          "forward Params")
        return _sdpa(q, k, v, causal, scale, layout)

    def full_backward(dout, q, k, v, out, lse, causal, alignment, scale, layout, window=None, softcap=None,
                      alibi_slopes=None, deterministic=False, return_delta=False):
        assert (causal, alignment, scale, layout, deterministic) == options and not return_delta
        assert (window, softcap, alibi_slopes) == (None, None, None)
        ran.append("full backward")
        return reference_gradients(dout, q, k, v, causal)

    monkeypatch.setattr(library, "forward", full_forward)
    monkeypatch.setattr(library, "backward", full_backward)
    monkeypatch.setattr(library, "_PREPARED", {})
    step = library._PreparedStep(BackwardKernel(), options, True)
    q, k, v = (torch.randn(2, 3, 24, 16, requires_grad=True) for _ in range(3))
    dout = torch.randn(2, 3, 24, 16)
    for n, loss in enumerate(("dout", "dout", "sum", "dout")):
        o, lse = library._apply_prepared_train(step, q, k, v)
        assert o.grad_fn is not None and not lse.requires_grad
        grads = torch.autograd.grad(o, (q, k, v), dout) if loss == "dout" else torch.autograd.grad(o.sum(), (q, k, v))
        want = reference_gradients(dout if loss == "dout" else torch.ones_like(o), q, k, v, True)
        for got, expected in zip(grads, want):
            assert torch.allclose(got, expected, atol=1e-5), n
    assert ran == ["full forward", "full backward",
                   ("prepared forward", "forward Params"), ("prepared backward", "backward Params"),
                   ("prepared forward", "forward Params"), "full backward",
                   ("prepared forward", "forward Params"), ("prepared backward", "backward Params")]
    # saved-tensor hooks (offloading, checkpointing) may hand the backward other tensors than the forward
    # saved, in layouts the prepared call was not made for: the full backward checks them
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t):
        o, _ = library._apply_prepared_train(step, q, k, v)
    ran.clear()
    for got, expected in zip(torch.autograd.grad(o, (q, k, v), dout), reference_gradients(dout, q, k, v, True)):
        assert torch.allclose(got, expected, atol=1e-5)
    assert ran == ["full backward"]
    with pytest.raises(RuntimeError):   # as FlashAttention's: a loss on the LSE alone has no gradient
        library._apply_prepared_train(step, q, k, v)[1].sum().backward()


def test_prepared_variant_step_binds_its_variants(monkeypatch):
    """A training call with a window, softcap and ALiBi slopes through its _PreparedStep, on CPU stand-ins:
    the first step takes the full variant forward (forward_variant) and backward with the call's variant
    arguments and keeps both prepared calls (the backward's asked for with those arguments), the next
    steps run them; the slopes come with each call and are saved with the tensors, so a backward after
    they changed in place is refused; the key holds the slopes' address, so other slopes make another
    step; a window of floats is not keyed (its full calls check it)."""
    from attngen.ops import library
    from attngen.runtime.calls.shared import call_key, variant_key
    ran = []
    options = (True, None, None, "bhsd", False)
    slopes = torch.rand(3)
    variants = ((64, 0), 30.0)

    def reference_gradients(dout, q, k, v):
        leaves = [x.detach().float().requires_grad_() for x in (q, k, v)]
        with torch.enable_grad():
            _sdpa(*leaves, True, None, "bhsd")[0].backward(dout.float())
        return tuple(x.grad.to(q.dtype) for x in leaves)

    class ForwardKernel:
        def prepared(self, key):
            assert key == call_key(q, k, v, True, None, None, True, "bhsd", variant_key(*variants, slopes))
            return "forward Params"

        def run_prepared(self, prepared, q, k, v, return_lse):
            ran.append(("prepared forward", prepared))
            return _sdpa(q, k, v, True, None, "bhsd")

    class BackwardKernel:
        def prepared_call(self, q, k, v, out, lse, dout, **given):
            assert given == dict(zip(("causal", "alignment", "scale", "layout", "deterministic"), options),
                                 window=(64, 0), softcap=30.0, alibi_slopes=slopes)
            return "backward Params"

        def run_prepared(self, prepared, q, k, v, out, lse, dout, return_delta=False):
            assert not return_delta
            ran.append(("prepared backward", prepared))
            return reference_gradients(dout, q, k, v)

    def full_forward_variant(q, k, v, causal, alignment, scale, layout, return_lse, window, softcap, alibi_slopes,
                             sinks=None):
        assert (window, softcap, alibi_slopes, sinks) == (*variants, slopes, None)
        ran.append("full forward")
        library._VARIANT[library._variant_kernel_key(q, k, v, causal, layout, window, softcap, alibi_slopes,
                                                     None)] = ForwardKernel()
        return _sdpa(q, k, v, causal, scale, layout)

    def full_backward(dout, q, k, v, out, lse, causal, alignment, scale, layout, window=None, softcap=None,
                      alibi_slopes=None, deterministic=False, return_delta=False):
        assert (window, softcap) == variants and torch.equal(alibi_slopes, slopes) and not return_delta
        ran.append("full backward")
        return reference_gradients(dout, q, k, v)

    monkeypatch.setattr(library, "forward_variant", full_forward_variant)
    monkeypatch.setattr(library, "backward", full_backward)
    monkeypatch.setattr(library, "_VARIANT", {})
    step = library._PreparedStep(BackwardKernel(), options, True, variants)
    q, k, v = (torch.randn(2, 3, 24, 16, requires_grad=True) for _ in range(3))
    dout = torch.randn(2, 3, 24, 16)
    for _ in range(3):
        o, _ = library._apply_prepared_variant_train(step, q, k, v, slopes, None)
        for got, expected in zip(torch.autograd.grad(o, (q, k, v), dout), reference_gradients(dout, q, k, v)):
            assert torch.allclose(got, expected, atol=1e-5)
    assert ran == ["full forward", "full backward"] + [("prepared forward", "forward Params"),
                                                       ("prepared backward", "backward Params")] * 2
    o, _ = library._apply_prepared_variant_train(step, q, k, v, slopes, None)
    slopes.add_(1.0)     # the forward used the old slopes: autograd refuses the backward
    with pytest.raises(RuntimeError, match="inplace"):
        torch.autograd.grad(o, (q, k, v), dout)
    keys = {call_key(q, k, v, True, None, None, False, "bhsd", variant_key((64, 0), 30.0, s)) for s in
            (slopes, slopes.clone())}
    assert len(keys) == 2
    assert library._keyable_variants((64, 0), 30.0) and library._keyable_variants(None, 50)
    assert not library._keyable_variants((64.0, 0), None) and not library._keyable_variants(None, True)


def _sdpa_sinks(q, k, v, sinks):
    """Causal softmax over [scores, sink] with the sink's column dropped before P.V: (o, lse)."""
    s = (q.float() @ k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
    s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    joined = torch.cat([s, sinks.float().reshape(1, -1, 1, 1).expand(*s.shape[:-1], 1)], dim=-1)
    o = torch.softmax(joined, -1)[..., :-1] @ v.float()
    return o.to(q.dtype), torch.logsumexp(joined, -1)


def test_prepared_step_trains_learned_sinks_from_the_backwards_delta(monkeypatch):
    """A training call with learned sinks through its _PreparedStep, on CPU stand-ins: the sinks come
    with each call (the forward's prepared call is keyed by their address), the backward kernel needs
    nothing of them and, asked for it only when the sinks need a gradient, hands back its delta
    (rowsum(dO * O)), from which the sinks' gradient is the written-out softmax's; sinks that need none
    get none and the backward is not asked for delta."""
    from attngen.ops import library
    from attngen.runtime.calls.shared import call_key, variant_key
    ran = []
    options = (True, None, None, "bhsd", False)
    sinks = torch.randn(3) * 2

    def reference(q, k, v, s, dout):
        leaves = [x.detach().float().requires_grad_() for x in (q, k, v, s)]
        with torch.enable_grad():
            _sdpa_sinks(*leaves)[0].backward(dout.float())
        return tuple(x.grad for x in leaves)

    class ForwardKernel:
        def prepared(self, key):
            assert key == call_key(q, k, v, True, None, None, True, "bhsd", variant_key(None, None, None, sinks=s))
            return "forward Params"

        def run_prepared(self, prepared, q, k, v, return_lse):
            ran.append("prepared forward")
            return _sdpa_sinks(q, k, v, s)     # the kernel reads the sinks at the address its Params hold

    def gradients(q, k, v, out, lse, dout, return_delta):
        grads = reference(q, k, v, s, dout)[:3]
        return grads + ((dout.float() * out.float()).sum(-1),) if return_delta else grads

    class BackwardKernel:
        def prepared_call(self, q, k, v, out, lse, dout, **given):
            assert given == dict(zip(("causal", "alignment", "scale", "layout", "deterministic"), options),
                                 window=None, softcap=None, alibi_slopes=None)
            return "backward Params"

        def run_prepared(self, prepared, q, k, v, out, lse, dout, return_delta=False):
            ran.append(("prepared backward", return_delta))
            return gradients(q, k, v, out, lse, dout, return_delta)

    def full_forward_variant(q, k, v, causal, alignment, scale, layout, return_lse, window, softcap, alibi_slopes,
                             sinks=None):
        assert sinks is s and (window, softcap, alibi_slopes) == (None, None, None)
        ran.append("full forward")
        library._VARIANT[library._variant_kernel_key(q, k, v, causal, layout, window, softcap, alibi_slopes,
                                                     sinks)] = ForwardKernel()
        return _sdpa_sinks(q, k, v, sinks)

    def full_backward(dout, q, k, v, out, lse, causal, alignment, scale, layout, window=None, softcap=None,
                      alibi_slopes=None, deterministic=False, return_delta=False):
        ran.append(("full backward", return_delta))
        return gradients(q, k, v, out, lse, dout, return_delta)

    monkeypatch.setattr(library, "forward_variant", full_forward_variant)
    monkeypatch.setattr(library, "backward", full_backward)
    monkeypatch.setattr(library, "_VARIANT", {})
    step = library._PreparedStep(BackwardKernel(), options, True, (None, None))
    q, k, v = (torch.randn(2, 3, 24, 16, requires_grad=True) for _ in range(3))
    dout = torch.randn(2, 3, 24, 16)
    for s in (sinks.clone().requires_grad_(),) * 3:
        o, lse = library._apply_prepared_variant_train(step, q, k, v, None, s)
        assert torch.allclose(lse, _sdpa_sinks(q, k, v, s)[1], atol=1e-5) and not lse.requires_grad
        got = torch.autograd.grad(o, (q, k, v, s), dout)
        for name, a, b in zip(("dq", "dk", "dv", "dsinks"), got, reference(q, k, v, s, dout)):
            assert a.shape == b.shape and torch.allclose(a, b, atol=1e-4), name
    assert ran == ["full forward", ("full backward", True)] + ["prepared forward", ("prepared backward", True)] * 2
    ran.clear()
    s = s.detach()      # the same address: the same prepared calls; no gradient of its own, no delta
    o, _ = library._apply_prepared_variant_train(step, q, k, v, None, s)
    torch.autograd.grad(o, (q, k, v), dout)
    assert ran == ["prepared forward", ("prepared backward", False)]


def test_a_prepared_step_that_gets_no_output_gradient_gives_none():
    """Prepared steps leave the LSE's gradient unmade (set_materialize_grads(False)); where an op after the
    output gives it no gradient either, the step's backward gives none for q, k, v (and the sinks) rather
    than reading a gradient that is not there."""
    from attngen.ops import library

    class NoGradient(torch.autograd.Function):     # passes o on, gives nothing back to it
        @staticmethod
        def forward(ctx, o):
            return o.clone()

        @staticmethod
        def backward(ctx, grad):
            return None

    class Unused:                                   # a step whose backward must not be reached
        options = (True, None, None, "bhsd", False)  # causal, alignment, scale, layout, deterministic

        def outputs(self, q, k, v, alibi_slopes=None, sinks=None):
            return _sdpa(q, k, v, True, None, "bhsd")

        def gradients(self, *args, **kw):
            raise AssertionError("the backward ran without a gradient")
    q, k, v = (torch.randn(1, 2, 8, 16, requires_grad=True) for _ in range(3))
    sinks = torch.randn(2, requires_grad=True)
    for o, _ in (library._apply_prepared_train(Unused(), q, k, v),
                 library._apply_prepared_variant_train(Unused(), q, k, v, None, sinks)):
        grads = torch.autograd.grad(NoGradient.apply(o).sum(), (q, k, v), allow_unused=True)
        assert grads == (None, None, None)


def test_variant_call_off_the_gpu_takes_the_variant_op(monkeypatch):
    """attention() with a window and softcap on tensors off the GPU (no prepared step: no kernels there) takes
    attngen::attention_variant_train, whose registered backward hands attention_variant_backward the call's
    window (a list, as the op's schema has it), softcap and slopes."""
    import attngen
    from attngen.ops import library
    seen = []

    def train_cpu(q, k, v, causal, alignment, scale, layout, window, softcap, alibi_slopes, deterministic=False,
                  sinks=None):
        seen.append(("train", window, softcap, deterministic))
        return _sdpa(q, k, v, causal, scale, layout)

    def backward_cpu(dout, q, k, v, out, lse, causal, alignment, scale, layout, window, softcap, alibi_slopes,
                     deterministic=False):
        seen.append(("backward", window, softcap))
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)

    lib = torch.library.Library("attngen", "IMPL")
    lib.impl("attention_variant_train", train_cpu, "CPU")
    lib.impl("attention_variant_backward", backward_cpu, "CPU")
    monkeypatch.setattr(library, "backward_kernel", lambda *args: None)
    try:
        q = torch.randn(1, 2, 8, 16, requires_grad=True)
        attngen.attention(q, q, q, causal=True, window=(4, 0), softcap=30.0).sum().backward()
    finally:
        lib._destroy()
    assert seen == [("train", [4, 0], 30.0, False), ("backward", [4, 0], 30.0)]


def test_a_shapes_native_step_is_made_once_and_never_replaced(monkeypatch):
    """_PreparedStep._make_native from two threads at once (two training threads' first backward of a
    shape): one makes the step, the other finds it made. The ops take a step by its address, so a
    second step replacing the first would free the one the first thread's calls read."""
    import threading
    import time
    from types import SimpleNamespace
    from attngen.ops import library
    made, entered, release = [], threading.Event(), threading.Event()

    def native_forward(*args):
        entered.set()
        release.wait(5)
        return "forward launches"

    registered = []
    fake_native = SimpleNamespace(unavailable=lambda: False, ready=lambda torch: True,
                                  register_step=lambda *args: registered.append(args),
                                  make_step=lambda *args: made.append(SimpleNamespace(address=lambda: 1234)) or made[-1])
    monkeypatch.setattr(library, "_native", fake_native)
    step = library._PreparedStep(SimpleNamespace(native_backward=lambda *args: "backward launches"),
                                 (False, None, None, "bhsd", False), prepares=True)
    step.forward_kernel, step.forward_prepared = SimpleNamespace(native_forward=native_forward), "prepared"
    q = _FakeCudaTensor()
    monkeypatch.setattr(library, "_TRAIN", {library.call_key(q, q, q, False, None, None, False, "bhsd"): step})
    first = threading.Thread(target=step._make_native, args=(q, q, q, q, q, q))
    first.start()
    assert entered.wait(5)
    second = threading.Thread(target=step._make_native, args=(q, q, q, q, q, q))
    second.start()
    time.sleep(0.1)          # the second thread waits for the first's decision
    release.set()
    first.join(5)
    second.join(5)
    assert len(made) == 1 and step.native is made[0] and step.native_address == 1234 and not step.native_pending
    step._make_native(q, q, q, q, q, q)   # later calls find it made
    assert len(made) == 1
    # registered once for the native op kernels, with the call's tensors and the forward's output strides
    assert len(registered) == 1 and registered[0][1] is made[0] and registered[0][5] is step.output_strides


class _FakeCudaTensor:
    """What _make_native and call_key read of a CUDA tensor."""
    is_cuda, shape, dtype = True, (1, 2, 8, 16), "bf16"

    def stride(self):
        return (256, 128, 16, 1)

    def get_device(self):
        return 0


def test_a_native_step_serves_the_ops_kernels_only_for_a_plain_call(monkeypatch):
    """_make_native registers a plain call's native step for the ops' native kernels (take_ops); not a
    variant call's (those kernels replay plain calls only), not one whose options are of other types than
    the ops pass (True, a float, a str: the C++ key holds them so), not one that _TRAIN does not hold for
    its key (an autograd node's after the cache was emptied); a registration that fails leaves the step
    to the eager calls, with a warning that names the op kernels."""
    from types import SimpleNamespace
    from attngen.ops import library
    registered = []

    def register(*args):
        registered.append(args)
        if fail:
            raise RuntimeError("no room")

    fake_native = SimpleNamespace(unavailable=lambda: False, ready=lambda torch: True, register_step=register,
                                  make_step=lambda *args: SimpleNamespace(address=lambda: 99))
    monkeypatch.setattr(library, "_native", fake_native)
    q = _FakeCudaTensor()
    plain = (True, None, None, "bshd", False)
    cases = [  # options, variants, kept in _TRAIN, registration fails -> registered
        (plain, None, True, False, 1),
        (plain, (None, 30.0), True, False, 0),
        (plain, None, False, False, 0),
        ((1, None, None, "bshd", False), None, True, False, 0),
        ((True, None, 1, "bshd", False), None, True, False, 0),
        ((True, "bottom_right", 0.125, "bshd", True), None, True, False, 1),
        (plain, None, True, True, 1),
    ]
    for options, variants, kept, fail, want in cases:
        step = library._PreparedStep(SimpleNamespace(native_backward=lambda *args: "backward launches"),
                                     options, prepares=True, variants=variants)
        step.forward_kernel = SimpleNamespace(native_forward=lambda *args: "forward launches")
        step.forward_prepared, step.output_strides = "prepared", ((1, 2, 3, 4), (5, 6, 7))
        causal, alignment, scale, layout, deterministic = options
        key = library.call_key(q, q, q, causal, alignment, scale, deterministic, layout)
        monkeypatch.setattr(library, "_TRAIN", {key: step} if kept else {})
        registered.clear()
        if fail:
            with pytest.warns(RuntimeWarning, match="native op kernels do not serve this shape"):
                step._make_native(q, q, q, q, q, q)
        else:
            step._make_native(q, q, q, q, q, q)
        assert step.native_address == 99                       # the eager calls have it either way
        assert len(registered) == want, (options, variants, kept)
