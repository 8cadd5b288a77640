"""The native library's kernels for attngen's training ops (runtime/native take_ops), without a GPU: the
key they find a step by against the Python ops' (call_key), and with the ops' CPU stand-ins the calls
they hand on: a call that needs a gradient to the Python autograd kernel, the rest to the kernels below,
a torch.compile training step through both ops, and no step replayed on tensors that are not real CUDA
tensors. Needs torch (CPU is enough), a C++ compiler and the CUDA toolkit's cuda.h (the library is
built here, about 30 s); the replays themselves run in tests/test_gpu_native_step.py."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: pip install -e '.[gpu]' (the CPU build will do)")

from attngen.errors import ToolError   # noqa: E402
from attngen.runtime import native     # noqa: E402
from test_ops_autograd import _sdpa, eager_and_compiled_gradients, stand_in_gradients   # noqa: E402


_built = []   # the library the module built, where it built one


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    """torch.ops.attngen_native, the library built (into a cache of the module's own) and loaded once per
    process; its op kernels released after the module."""
    if not hasattr(torch.ops.attngen_native, "take_ops"):
        if not native.compiler_command():
            pytest.skip("no C++ compiler for the native library")
        patch = pytest.MonkeyPatch()
        patch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path_factory.mktemp("native_cache")))
        try:
            path = native.build(torch)
        except ToolError as exc:
            pytest.skip(f"the native library did not build here: {exc}")
        finally:
            patch.undo()
        torch.ops.load_library(str(path))
        _built.append(path)
    import attngen.ops.library  # noqa: F401  (defines the attngen ops)
    yield torch.ops.attngen_native
    native.release_ops(torch)
    torch.ops.attngen_native.forget_steps()


def _step(causal=True, alignment=None, scale=None, layout="bhsd", deterministic=False, dout_strides=(1, 1, 1, 1)):
    """A ready Step whose programs launch nothing (never replayed here: the tensors are on the CPU)."""
    step = torch.classes.attngen_native.Step(0, 0, causal, alignment, scale, layout, deterministic)
    empty = torch.zeros(0, dtype=torch.uint8)
    step.set_forward(torch.zeros(64, dtype=torch.uint8), [0, 8, 16, 24, 32], [], [], empty, [], [], True, [],
                     [1, 1, 1])
    step.set_backward(torch.zeros(128, dtype=torch.uint8), list(range(0, 96, 8)), [], [], empty, [], [], [0, 0, 0], [],
                      list(dout_strides))
    return step


def test_a_step_serves_exactly_the_calls_of_its_python_key(ops):
    """served_step finds the registered step for a call iff Python's call_key of the call equals the key of
    the tensors and options it was registered with: every field of the key, each changed alone."""
    from attngen.runtime.calls.shared import call_key
    ops.forget_steps()
    q = torch.randn(2, 4, 64, 32)
    k = v = torch.randn(2, 2, 64, 32)
    options = dict(causal=True, alignment="bottom_right", scale=0.125, layout="bhsd", deterministic=False)
    step = _step(**options)
    ops.register_plain(step.address(), q, k, v, [1, 2, 3, 4], [1, 2, 3])
    assert ops.steps_served() == 1

    def python_key(q, k, v, causal, alignment, scale, layout, deterministic):
        return call_key(q, k, v, causal, alignment, scale, deterministic, layout)

    registered = python_key(q, k, v, **options)
    wide = torch.randn(2, 4, 64, 64)
    calls = [
        ((q, k, v), options),
        ((q.clone(), k.clone(), v.clone()), options),                    # other tensors, same layout
        ((q.transpose(1, 2).contiguous().transpose(1, 2), k, v), options),   # same shape, other strides
        ((q.to(torch.float16), k, v), options),
        ((q, k.to(torch.float16), v), options),
        ((torch.randn(2, 4, 48, 32), k, v), options),
        ((q, torch.randn(2, 2, 65, 32), torch.randn(2, 2, 65, 32)), options),
        ((wide[..., :32], k, v), options),                               # a view: strides of the wide tensor
        ((q, k, v), {**options, "causal": False}),
        ((q, k, v), {**options, "alignment": None}),
        ((q, k, v), {**options, "alignment": "top_left"}),
        ((q, k, v), {**options, "scale": None}),
        ((q, k, v), {**options, "scale": 0.125000001}),
        ((q, k, v), {**options, "layout": "bshd"}),
        ((q, k, v), {**options, "deterministic": True}),
    ]
    for tensors, opts in calls:
        same = python_key(*tensors, **opts) == registered
        assert (ops.served_step(*tensors, **opts) == step.address()) == same, (tensors[0].shape, opts)
    # a scale given as an int is the same Python key as its float: the op's schema takes it as a float
    ops.forget_steps()
    one = _step(scale=1.0)
    ops.register_plain(one.address(), q, k, v, [1, 2, 3, 4], [1, 2, 3])
    assert python_key(q, k, v, True, None, 1, "bhsd", False) == python_key(q, k, v, True, None, 1.0, "bhsd", False)
    assert ops.served_step(q, k, v, True, None, 1.0, "bhsd", False) == one.address()
    assert ops.served_step(q[0], k[0], v[0], True, None, 1.0, "bhsd", False) == 0    # 3-D: no step serves it
    ops.forget_steps()
    assert ops.steps_served() == 0 and ops.served_step(q, k, v, True, None, 1.0, "bhsd", False) == 0


def test_only_a_plain_calls_step_is_registered(ops):
    step = _step()
    step.set_variants([64, 0], None)
    q = torch.randn(1, 2, 16, 32)
    with pytest.raises(RuntimeError, match="only a plain call's step"):
        ops.register_plain(step.address(), q, q, q, [1, 1, 1, 1], [1, 1, 1])


@pytest.fixture
def taken(ops):
    """The ops' CPU stand-ins (torch SDPA) and the library's kernels in front of them, attention_train's for
    CPU tensors too; a step registered for the tensors of shape (1, 2, 32, 16) that must never be replayed
    (they are not CUDA tensors): (calls the stand-ins saw, the step)."""
    calls = []

    def train_cpu(q, k, v, causal, alignment, scale, layout, deterministic=False):
        calls.append("train")
        return _sdpa(q, k, v, causal, scale, layout)

    def backward_cpu(dout, q, k, v, out, lse, causal, alignment, scale, layout, deterministic=False):
        calls.append("backward")
        return stand_in_gradients(dout, q, k, v, causal, scale, layout)

    lib = torch.library.Library("attngen", "IMPL")
    lib.impl("attention_train", train_cpu, "CPU")
    lib.impl("attention_backward", backward_cpu, "CPU")
    shape = torch.randn(1, 2, 32, 16)
    step = _step(causal=True, dout_strides=shape.stride())
    ops.register_plain(step.address(), shape, shape, shape, list(shape.stride()), [64, 32, 1])
    native.take_ops(torch, cpu_too=True)
    yield calls, step
    native.release_ops(torch)
    ops.forget_steps()
    lib._destroy()


def _counted(before):
    """The op kernels' counts since `before` (native.op_counts), those that moved."""
    return {name: n - before[name] for name, n in native.op_counts(torch).items() if n != before[name]}


def test_the_kernels_stand_in_front_of_the_python_ones_until_released(ops, taken):
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    assert has("attngen::attention_train", "AutogradCUDA") and has("attngen::attention_train", "AutogradCPU")
    assert has("attngen::attention_backward", "ADInplaceOrView")
    native.release_ops(torch)
    assert not has("attngen::attention_train", "AutogradCUDA")
    assert not has("attngen::attention_backward", "ADInplaceOrView")
    assert has("attngen::attention_train", "Autograd")     # the Python autograd kernel, as registered
    native.take_ops(torch, cpu_too=True)


def test_a_call_that_needs_a_gradient_takes_the_python_autograd_kernel(ops, taken):
    calls, _ = taken
    q, k, v = (torch.randn(1, 2, 32, 16, requires_grad=True) for _ in range(3))
    before = native.op_counts(torch)
    o, lse = torch.ops.attngen.attention_train(q, k, v, True, None, None, "bhsd")
    assert o.grad_fn is not None and not lse.requires_grad
    dout = torch.randn_like(o)
    o.backward(dout)
    assert calls == ["train", "backward"]
    # through the library's kernels: attention_train's to the autograd kernel, whose backward calls
    # attention_backward, which the other kernel hands below (CPU tensors: nothing replayed)
    assert _counted(before) == {"train_to_autograd": 1, "backward_below": 1}
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    _sdpa(*leaves, True, None, "bhsd")[0].backward(dout)
    for a, b in zip((q, k, v), leaves):
        assert torch.allclose(a.grad, b.grad, atol=1e-5)


def test_a_call_without_a_gradient_goes_to_the_kernel_below(ops, taken):
    """No gradient (grad mode off, or no input that needs one), tensors that are not CUDA tensors: the
    stand-in computes, though a step is registered for their key; outputs need no gradient."""
    calls, step = taken
    q, k, v = (torch.randn(1, 2, 32, 16, requires_grad=True) for _ in range(3))
    assert ops.served_step(q, k, v, True, None, None, "bhsd", False) == step.address()
    before = native.op_counts(torch)
    with torch.no_grad():
        o, lse = torch.ops.attngen.attention_train(q, k, v, True, None, None, "bhsd", False)
    plain = [x.detach() for x in (q, k, v)]
    o2, _ = torch.ops.attngen.attention_train(*plain, True, None, None, "bhsd", False)
    assert calls == ["train", "train"] and not o.requires_grad and not o2.requires_grad
    assert torch.equal(o, _sdpa(*plain, True, None, "bhsd")[0]) and torch.equal(o2, o)
    dq, dk, dv = torch.ops.attngen.attention_backward(torch.randn_like(o), *plain, o, lse, True, None, None, "bhsd")
    assert calls[-1] == "backward" and dq.shape == q.shape
    assert _counted(before) == {"train_below": 2, "backward_below": 1}


def test_a_compiled_training_step_traces_through_the_kernels(ops, taken):
    """torch.compile (fullgraph, aot_eager) traces a training step through the library's kernels (fake
    tensors go through them to the Python kernels), and its graphs call them: the same gradients as
    eager. Then with the kernels released, the same step compiled again still gets its gradients (the
    Python dispatcher's cache no longer names the released kernel)."""
    import attngen
    from attngen.ops import library
    calls, _ = taken
    patch = pytest.MonkeyPatch()
    patch.setattr(library, "backward_kernel", lambda *args: None)   # the stand-ins need no GPU kernel
    try:
        counts = []
        eager, compiled = eager_and_compiled_gradients(attngen, lambda: (calls.clear(), counts.append(
            native.op_counts(torch))))
        assert "train" in calls and "backward" in calls
        counted = _counted(counts[0])
        assert counted.get("train_below", 0) >= 1 and counted.get("backward_below", 0) >= 1, counted
        for a, b in zip(eager, compiled):
            assert torch.allclose(a, b, atol=1e-5)
        native.release_ops(torch)
        eager, compiled = eager_and_compiled_gradients(attngen)
        for a, b in zip(eager, compiled):
            assert b is not None and torch.allclose(a, b, atol=1e-5)
        native.take_ops(torch, cpu_too=True)
    finally:
        patch.undo()
        torch._dynamo.reset()


def test_an_import_with_the_variable_set_puts_the_kernels_in_place(ops):
    """A new process whose cache holds the built library: importing attngen.ops loads it and the kernels stand
    in front of the ops before any call; with ATTNGEN_NATIVE_OPS=0, nothing is loaded."""
    import os
    import subprocess
    import sys
    if not _built:
        pytest.skip("the library was loaded before this module built one")
    probe = ("import torch, attngen.ops.library; has = torch._C._dispatch_has_kernel_for_dispatch_key; "
             "print(hasattr(torch.ops.attngen_native, 'take_ops') and has('attngen::attention_train', 'AutogradCUDA'),"
             " has('attngen::attention_backward', 'ADInplaceOrView'))")
    env = {**os.environ, "ATTNGEN_CACHE_DIR": str(_built[0].parent.parent)}
    for value, want in (("", "True True"), ("0", "False False")):
        done = subprocess.run([sys.executable, "-c", probe], env={**env, native.OPS_ENV: value}, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.split()[-2:] == want.split(), (value, done.stdout, done.stderr[-2000:])
