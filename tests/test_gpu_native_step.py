"""attngen.attention's eager training step through the native step (attngen/runtime/native: the prepared
forward and backward replayed from a C++ autograd node): built against the installed torch, taken from
a shape's third step on, its gradients the Python node's (bit for bit where deterministic) and within
the rule of SDPA's fp32 autograd, including what it was not prepared for (a dout in other strides, an
expanded one, saved-tensor hooks), which goes back to attngen's own ops."""
from __future__ import annotations

import pytest

import attngen
from attngen.eval import verify
from test_gpu_backward import sdpa_gradients

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def native():
    from conftest import _gpu_skip_reason     # a module fixture is made before the autouse skip runs
    reason = _gpu_skip_reason()
    if reason:
        pytest.skip(reason)
    import torch
    from attngen.runtime import native
    native.build(torch)
    assert native.ready(torch), native._state
    return native


def _within_rule(torch, q, k, v, dout, causal, got, layout, what):
    t = (lambda x: x) if layout == "bhsd" else (lambda x: x.transpose(1, 2))
    ref, low = sdpa_gradients(torch, t(q), t(k), t(v), t(dout).contiguous(), causal)
    for name, g, want, base in zip(("dq", "dk", "dv"), got, ref, low):
        err = (t(g).float() - want).abs().max().item()
        bound = verify.error_bound((base - want).abs().max().item())
        assert err <= bound, f"{what}: {name} {err:.3g} > {bound:.3g}"


CASES = [  # q shape, KV heads, causal, layout, dtype, deterministic
    ((1, 8, 512, 64), 8, False, "bhsd", "float16", False),
    ((2, 16, 300, 128), 4, True, "bhsd", "bfloat16", False),
    ((2, 333, 8, 64), 2, True, "bshd", "float16", False),
    ((2, 8, 256, 128), 8, True, "bhsd", "bfloat16", True),
    ((1, 4, 200, 256), 4, False, "bhsd", "bfloat16", False),
    ((1, 8, 1000, 128), 8, False, "bhsd", "bfloat16", False),    # query blocks of 80 rows (dQ^T)
    ((2, 900, 16, 128), 4, False, "bshd", "float16", False),     # ... GQA
    ((1, 8, 1024, 128), 8, False, "bhsd", "float16", True),      # ... deterministic
]


@pytest.mark.parametrize("shape, kv_heads, causal, layout, dtype, deterministic", CASES,
                         ids=["x".join(map(str, c[0])) + f"-{c[3]}-{c[4]}" + ("-det" if c[5] else "") for c in CASES])
def test_native_steps_match_the_python_node(native, shape, kv_heads, causal, layout, dtype, deterministic):
    import torch
    from attngen.ops import library
    gen = torch.Generator(device="cuda").manual_seed(71)
    dt = getattr(torch, dtype)
    kv_shape = (shape[0], kv_heads, *shape[2:]) if layout == "bhsd" else (*shape[:2], kv_heads, shape[3])
    q, k, v = (torch.randn(s, generator=gen, device="cuda").to(dt).requires_grad_() for s in (shape, kv_shape, kv_shape))
    dout = torch.randn(shape, generator=gen, device="cuda").to(dt)

    def step(d=dout):
        o = attngen.attention(q, k, v, causal=causal, layout=layout, deterministic=deterministic)
        return o, torch.autograd.grad(o, (q, k, v), d)

    for _ in range(2):    # the first call, then the prepared one, which makes the native step
        _, python = step()
    entry = library._TRAIN[library.call_key(q, k, v, causal, None, None, deterministic, layout)]
    assert isinstance(entry.native, torch.ScriptObject), entry.native
    o, got = step()
    assert "attngen_native" in o.grad_fn.name(), o.grad_fn.name()    # torch::autograd::CppNode<attngen_native::Train>
    _within_rule(torch, q, k, v, dout, causal, got, layout, "native step")
    if deterministic:
        assert all(torch.equal(a, b) for a, b in zip(got, python)), "native and Python steps differ"
        assert all(torch.equal(a, b) for a, b in zip(step()[1], got)), "two native steps differ"
    # what it was not prepared for: a sliced dout (other strides), an expanded one (a sum's gradient)
    wide = torch.randn(*shape[:-1], 2 * shape[-1], generator=gen, device="cuda").to(dt)
    for d in (wide[..., :shape[-1]], torch.ones(1, device="cuda", dtype=dt).expand(shape)):
        _within_rule(torch, q, k, v, d, causal, step(d)[1], layout, f"dout strides {d.stride()}")
    with torch.autograd.graph.save_on_cpu():   # saved-tensor hooks: the Python node
        o, got = step()
    assert "attngen_native" not in o.grad_fn.name()
    _within_rule(torch, q, k, v, dout, causal, got, layout, "under save_on_cpu")


def test_native_step_in_a_cuda_graph(native):
    """A native step captured in a CUDA graph (after three steps on a side stream) and replayed on new
    inputs: deterministic, so the replay's gradients are an eager native step's on those inputs, bit for bit."""
    import torch
    gen = torch.Generator(device="cuda").manual_seed(72)
    q, k, v, dout = (torch.randn(2, 8, 256, 64, generator=gen, device="cuda").half() for _ in range(4))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]

    def step():
        o = attngen.attention(*leaves, causal=True, deterministic=True)
        return torch.autograd.grad(o, leaves, dout)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for t, new in zip(leaves, (torch.randn_like(q) for _ in range(3))):
        with torch.no_grad():
            t.copy_(new)
    graph.replay()
    eager = step()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(captured, eager))


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "atomic-dq"])
def test_a_thread_with_no_context_current_runs_the_native_step(native, deterministic):
    """The native ops on a thread with no CUDA context current (autograd's device thread has none until a
    runtime call there makes one; a process whose native library was built before its first call failed its
    training loop's backward with cuTensorMapReplaceAddress's CUDA_ERROR_INVALID_CONTEXT): they re-address the
    tensor maps and launch in the GPU's primary context, give the thread back none, and match the main
    thread's results. The shape (1x128x8x64 bf16, bshd, causal) takes tensor maps on the H200's kernels.
    Deterministic: bit for bit; torch zeroes the backward's turn counters ahead of its kernels, which makes a
    context current again, so there the forward is the call that starts with none. Not deterministic (the
    training loop's default): no torch launch precedes the backward's kernels either, so both calls start
    with none; dQ's fp32 atomics land in any order, so the gradients are compared within 2 % of their
    largest value (the outputs and LSE bit for bit)."""
    import threading
    import torch
    from attngen.ops import library
    from attngen.runtime import driver
    gen = torch.Generator(device="cuda").manual_seed(74)
    qkv = torch.randn(1, 128, 3, 8, 64, generator=gen, device="cuda").to(torch.bfloat16)
    leaves = [t.detach().clone().requires_grad_() for t in qkv.unbind(2)]
    dout = torch.randn(1, 128, 8, 64, generator=gen, device="cuda").to(torch.bfloat16)
    for _ in range(3):
        torch.autograd.grad(attngen.attention(*leaves, causal=True, layout="bshd", deterministic=deterministic),
                            leaves, dout)
    step = library._TRAIN[library.call_key(*leaves, True, None, None, deterministic, "bshd")]
    assert isinstance(step.native, torch.ScriptObject), step.native
    q, k, v = (t.detach() for t in leaves)
    o, lse = torch.ops.attngen_native.forward.default(q, k, v, step.native_address)
    want = (o, lse, *torch.ops.attngen_native.backward.default(dout, q, k, v, o, lse, step.native_address))
    seen = {}

    def without_context():
        try:
            driver.set_current_context(None)
            seen["before forward"] = driver.current_context()
            to, tlse = torch.ops.attngen_native.forward.default(q, k, v, step.native_address)
            seen["after forward"] = driver.current_context()
            driver.set_current_context(None)
            seen["before backward"] = driver.current_context()
            seen["got"] = (to, tlse, *torch.ops.attngen_native.backward.default(dout, q, k, v, to, tlse,
                                                                                  step.native_address))
        except Exception as exc:     # reported on the test's thread
            seen["error"] = exc
    thread = threading.Thread(target=without_context)
    thread.start()
    thread.join()
    torch.cuda.synchronize()
    assert "error" not in seen, seen.get("error")
    assert seen["before forward"] is None and seen["after forward"] is None and seen["before backward"] is None, \
        {key: value for key, value in seen.items() if key != "got"}
    got = seen["got"]
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    for name, a, b in zip(("dq", "dk", "dv"), got[2:], want[2:]):
        if deterministic:
            assert torch.equal(a, b), name
        else:
            assert (a.float() - b.float()).abs().max().item() <= 0.02 * b.float().abs().max().item(), name


def test_the_native_library_is_built_once_per_torch(native, tmp_path, monkeypatch):
    """The library's place names the source and torch's build; a build into an empty cache compiles it
    and a second build finds it there."""
    import torch
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path))
    path = native.library_path(torch)
    assert path.parent == tmp_path / "native" and not path.exists()
    assert native.build(torch) == path and path.is_file()
    mtime = path.stat().st_mtime_ns
    assert native.build(torch) == path and path.stat().st_mtime_ns == mtime


def test_compiled_steps_take_the_shapes_native_step(native):
    """torch.compile(fullgraph=True) of a training step: its graphs' ops (attngen::attention_train and
    attngen::attention_backward) take the shape's training step, natively from the third step on, and
    give an eager native step's gradients bit for bit (deterministic)."""
    import torch
    from attngen.ops import library
    gen = torch.Generator(device="cuda").manual_seed(73)
    q, k, v, dout = (torch.randn(2, 8, 256, 64, generator=gen, device="cuda").half() for _ in range(4))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]

    def attend(q, k, v):
        return attngen.attention(q, k, v, causal=True, deterministic=True)
    compiled = torch.compile(attend, fullgraph=True)
    for _ in range(3):
        got = torch.autograd.grad(compiled(*leaves), leaves, dout)
    entry = library._TRAIN[library.call_key(*leaves, True, None, None, True, "bhsd")]
    assert isinstance(entry.native, torch.ScriptObject), entry.native
    eager = torch.autograd.grad(attend(*leaves), leaves, dout)
    assert all(torch.equal(a, b) for a, b in zip(got, eager))
    _within_rule(torch, *leaves, dout, True, got, "bhsd", "compiled")


@pytest.fixture
def native_ops(native, monkeypatch):
    """The native library's kernels in front of attngen's training ops (their default, set here all the same:
    steps made from now on are registered for them), released after the test; the Python ops' step lookups."""
    import torch
    from attngen.ops import library
    monkeypatch.setenv(native.OPS_ENV, "1")
    native.take_ops(torch)
    looked_up = []
    plain_step = library._plain_step
    monkeypatch.setattr(library, "_plain_step",
                        lambda *args, **kw: looked_up.append(args[:3]) or plain_step(*args, **kw))
    yield looked_up
    native.release_ops(torch)
    torch.ops.attngen_native.forget_steps()


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_the_native_op_kernels_replay_a_compiled_steps_attention(native, native_ops, layout):
    """With the library's kernels in front of attngen::attention_train and ::attention_backward, a
    compiled training step's graphs (q, k and v views of one packed projection, as a model makes them)
    reach the shape's native step without the Python ops (their step lookup is not called once the step
    is registered; the kernels count two replays) and give the gradients of the same graphs through the
    Python ops, bit for bit (deterministic); a dout of other strides goes on to the Python op."""
    import torch
    from attngen.ops import library
    looked_up = native_ops
    gen = torch.Generator(device="cuda").manual_seed(75)
    packed = torch.randn(2, 256, 3, 8, 64, generator=gen, device="cuda").to(torch.bfloat16).requires_grad_()
    dout = torch.randn(2, 256, 8, 64, generator=gen, device="cuda").to(torch.bfloat16)
    if layout == "bhsd":
        dout = dout.transpose(1, 2).contiguous()

    def views(packed):
        return packed.unbind(2) if layout == "bshd" else packed.permute(0, 2, 3, 1, 4).unbind(1)

    def attend(packed):
        return attngen.attention(*views(packed), causal=True, layout=layout, deterministic=True)
    torch._dynamo.reset()
    compiled = torch.compile(attend, fullgraph=True)
    for _ in range(3):
        torch.autograd.grad(compiled(packed), packed, dout)
    q, k, v = (t.detach() for t in views(packed))
    entry = library._TRAIN[library.call_key(q, k, v, True, None, None, True, layout)]
    assert isinstance(entry.native, torch.ScriptObject), entry.native
    assert torch.ops.attngen_native.served_step(q, k, v, True, None, None, layout, True) == entry.native_address
    looked_up.clear()
    before = native.op_counts(torch)
    served = torch.autograd.grad(compiled(packed), packed, dout)
    counts = native.op_counts(torch)
    assert looked_up == [], "the Python ops were called for a registered shape"
    assert counts["train_replayed"] - before["train_replayed"] == 1, (before, counts)
    assert counts["backward_replayed"] - before["backward_replayed"] == 1, (before, counts)
    # the same graphs through the Python ops
    native.release_ops(torch)
    python = torch.autograd.grad(compiled(packed), packed, dout)
    assert len(looked_up) == 2       # attention_train's and attention_backward's
    native.take_ops(torch)
    assert torch.equal(served[0], python[0])
    _within_rule(torch, q, k, v, dout, True, views(served[0]), layout, "native op kernels")
    # the ops called directly: the forward bit for bit the native step's; a dout it was not prepared for
    # (strides other than the prepared call's) goes on to the Python op, whose gradients are its own
    o, lse = torch.ops.attngen.attention_train.default(q, k, v, True, None, None, layout, True)
    want = torch.ops.attngen_native.forward.default(q, k, v, entry.native_address)
    assert torch.equal(o, want[0]) and torch.equal(lse, want[1])
    other = torch.empty(*o.shape[:-1], 2 * o.shape[-1], dtype=o.dtype, device=o.device)[..., :o.shape[-1]]
    other.copy_(dout)                     # a slice of a wider tensor: rows twice as far apart
    assert other.stride() != entry.dout_stride
    looked_up.clear()
    got = torch.ops.attngen.attention_backward.default(other, q, k, v, o, lse, True, None, None, layout, True)
    assert len(looked_up) == 1
    _within_rule(torch, q, k, v, other, True, got, layout, "dout of other strides")


def test_a_misaligned_call_after_the_native_step_is_refused_as_before(native):
    """Views 8 bytes off 16-byte alignment, of a shape whose native step exists: the native step hands
    them to attngen's own forward op, which refuses them with the message the Python node gives (and
    does not come back to the native step)."""
    import torch
    gen = torch.Generator(device="cuda").manual_seed(74)
    shape, n = (1, 4, 128, 64), 4 * 128 * 64
    q, k, v = (torch.randn(shape, generator=gen, device="cuda").half().requires_grad_() for _ in range(3))
    for _ in range(3):
        torch.autograd.grad(attngen.attention(q, k, v), (q, k, v), torch.ones_like(q))
    flat = torch.randn(n + 4, generator=gen, device="cuda").half()
    shifted = flat[4:].view(shape).requires_grad_()
    with pytest.raises((ValueError, RuntimeError), match="16-byte"):
        attngen.attention(shifted, k, v)


VARIANT_CASES = [  # q shape, KV heads, dtype, keywords (window, softcap, ALiBi slopes or sinks: "slopes" / "sinks")
    ((2, 8, 300, 64), 2, "bfloat16", {"causal": True, "window": (63, 0), "softcap": 30.0}),
    ((2, 8, 256, 128), 8, "float16", {"causal": True, "alibi_slopes": "slopes"}),
    ((2, 16, 300, 64), 2, "bfloat16", {"causal": True, "window": (127, 0), "sinks": "sinks"}),
    ((1, 8, 256, 64), 8, "bfloat16", {"causal": False, "sinks": "sinks"}),
]


@pytest.mark.parametrize("shape, kv_heads, dtype, keywords", VARIANT_CASES,
                         ids=["x".join(map(str, c[0])) + "-" + "-".join(c[3]) for c in VARIANT_CASES])
def test_variant_native_steps_match_the_python_node(native, shape, kv_heads, dtype, keywords):
    """Training steps with a window and softcap, ALiBi slopes or learned sinks (gpt-oss's layers among
    them): from the third step the native node (the slopes and sinks at the addresses its Params read),
    deterministic, so its gradients (the sinks' too, from the backward's delta) are the Python node's
    bit for bit; the sinks' gradient also agrees with rowsum(dO * O) computed apart."""
    import torch
    from attngen.ops import library
    from attngen.runtime.calls.shared import variant_key
    gen = torch.Generator(device="cuda").manual_seed(75)
    dt = getattr(torch, dtype)
    q, k, v = (torch.randn(s, generator=gen, device="cuda").to(dt).requires_grad_()
               for s in (shape, (shape[0], kv_heads, *shape[2:]), (shape[0], kv_heads, *shape[2:])))
    dout = torch.randn(shape, generator=gen, device="cuda").to(dt)
    kw = dict(keywords)
    if kw.get("alibi_slopes") == "slopes":
        kw["alibi_slopes"] = torch.rand(shape[1], generator=gen, device="cuda") * 0.5
    if kw.get("sinks") == "sinks":
        kw["sinks"] = torch.randn(shape[1], generator=gen, device="cuda").requires_grad_()
    leaves = [q, k, v] + ([kw["sinks"]] if "sinks" in kw else [])

    def step():
        o, lse = attngen.attention(q, k, v, deterministic=True, return_lse=True, **kw)
        return o, lse, torch.autograd.grad(o, leaves, dout)
    for _ in range(2):
        step()
    key = library.call_key(q, k, v, kw["causal"], None, None, True, "bhsd",
                           variant_key(kw.get("window"), kw.get("softcap"), kw.get("alibi_slopes"), sinks=kw.get("sinks")))
    entry = library._TRAIN[key]
    assert isinstance(entry.native, torch.ScriptObject), entry.native
    o, lse, got = step()
    assert "attngen_native" in o.grad_fn.name(), o.grad_fn.name()
    made, entry.native = entry.native, None
    try:
        _, _, python = step()
    finally:
        entry.native = made
    for name, a, b in zip(("dq", "dk", "dv", "dsinks"), got, python):
        assert torch.equal(a, b), f"{name}: native and Python nodes differ by {(a.float() - b.float()).abs().max()}"
    if "sinks" in kw:
        apart = library.sink_gradient(dout, o.detach(), lse, kw["sinks"], "bhsd")
        assert torch.allclose(got[3], apart, rtol=1e-3, atol=1e-4), (got[3] - apart).abs().max()


def test_variant_native_steps_fall_back_for_a_dout_they_were_not_prepared_for(native):
    """A variant step (window and sinks, gpt-oss's local layer) handed a sliced dout (other strides) and an
    expanded one goes back to attngen::attention_variant_backward from the C++ node: deterministic, so
    its gradients are the Python node's for the same dout bit for bit."""
    import torch
    from attngen.ops import library
    from attngen.runtime.calls.shared import variant_key
    gen = torch.Generator(device="cuda").manual_seed(77)
    shape, kv = (2, 16, 300, 64), (2, 2, 300, 64)
    q, k, v = (torch.randn(s, generator=gen, device="cuda").to(torch.bfloat16).requires_grad_() for s in (shape, kv, kv))
    sinks = torch.randn(16, generator=gen, device="cuda").requires_grad_()
    kw = {"causal": True, "window": (127, 0), "sinks": sinks, "deterministic": True}

    def step(d):
        o = attngen.attention(q, k, v, **kw)
        return o, torch.autograd.grad(o, (q, k, v, sinks), d)
    dout = torch.randn(shape, generator=gen, device="cuda").to(torch.bfloat16)
    for _ in range(2):
        step(dout)
    entry = library._TRAIN[library.call_key(q, k, v, True, None, None, True, "bhsd",
                                            variant_key((127, 0), None, None, sinks=sinks))]
    assert isinstance(entry.native, torch.ScriptObject), entry.native
    wide = torch.randn(*shape[:-1], 128, generator=gen, device="cuda").to(torch.bfloat16)
    for d in (wide[..., :64], torch.ones(1, device="cuda", dtype=torch.bfloat16).expand(shape)):
        o, got = step(d)
        assert "attngen_native" in o.grad_fn.name(), o.grad_fn.name()
        made, entry.native = entry.native, None
        try:
            _, python = step(d)
        finally:
            entry.native = made
        for name, a, b in zip(("dq", "dk", "dv", "dsinks"), got, python):
            assert torch.equal(a, b), f"dout strides {d.stride()}: {name} differs by {(a.float() - b.float()).abs().max()}"


def test_a_native_node_outlives_its_shapes_step(native):
    """The autograd node keeps its own reference to the step: with the shape's cache emptied (and the
    Python object collected) between the forward and the backward, the backward still runs, and, being
    deterministic, gives the gradients of a step whose cache was left alone, bit for bit."""
    import gc
    import torch
    from attngen.ops import library
    gen = torch.Generator(device="cuda").manual_seed(79)
    q, k, v = (torch.randn(2, 8, 256, 64, generator=gen, device="cuda").half().requires_grad_() for _ in range(3))
    dout = torch.randn(2, 8, 256, 64, generator=gen, device="cuda").half()

    def forward():
        return attngen.attention(q, k, v, causal=True, deterministic=True)
    for _ in range(3):
        torch.autograd.grad(forward(), (q, k, v), dout)
    want = torch.autograd.grad(forward(), (q, k, v), dout)
    o = forward()
    assert "attngen_native" in o.grad_fn.name(), o.grad_fn.name()
    library._TRAIN.clear()
    gc.collect()
    got = torch.autograd.grad(o, (q, k, v), dout)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_the_ops_refuse_an_address_that_is_no_step_with_runtime_error(native):
    """In a child process, so that a library whose C++ errors end the process fails this test, not pytest."""
    import subprocess
    import sys
    import torch
    child = f"""
import torch
torch.ops.load_library({str(native.library_path(torch))!r})
q = torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.float16)
calls = (lambda: torch.ops.attngen_native.train.default(q, q, q, None, None, 0),
         lambda: torch.ops.attngen_native.forward.default(q, q, q, 0),
         lambda: torch.ops.attngen_native.backward.default(q, q, q, q, q, q, 0))
for call in calls:
    try:
        call()
        raise SystemExit("no error")
    except RuntimeError as exc:
        assert "is not a ready Step's address" in str(exc), exc
print("refused", len(calls))
"""
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "refused 3" in done.stdout, (done.returncode, done.stderr[-2000:])
