"""Host µs per call of the ops a compiled training graph calls, attngen::attention_train and
::attention_backward, with their Python kernels and with the native library's kernels in front of them
(take_ops, ATTNGEN_NATIVE_OPS=1), in alternating rounds of one process; the native ops called directly
and aten's cuDNN ops beside them. 1x128x8x64 bf16 causal, bshd views of a packed qkv, so small that the
host sets the pace (200 calls back to back, then a synchronize; the median of 9 rounds).

Usage (GPU machine, repository root): python3 docs/backward-h200/native_ops/op_host_time.py"""
import os
import statistics
import time

os.environ["ATTNGEN_NATIVE_OPS"] = "1"      # steps made from here on are registered for the native kernels
import torch                                  # noqa: E402
import attngen                                # noqa: E402
from attngen.ops import library               # noqa: E402
from attngen.runtime import native            # noqa: E402

native.build(torch)
B, S, H, D = 1, 128, 8, 64
qkv = torch.randn(B, S, 3, H, D, device="cuda", dtype=torch.bfloat16)
q, k, v = qkv.unbind(2)


def train_once():
    packed = qkv.clone().requires_grad_()
    o = attngen.attention(*packed.unbind(2), causal=True, layout="bshd")
    o.backward(torch.randn_like(o))


for _ in range(3):
    train_once()
time.sleep(1.0)      # the library's build, started by the first step, is found by a later one
for _ in range(3):
    train_once()
step = library._plain_step(q, k, v, True, None, None, "bshd", False, make=False)
assert step is not None and step.native is not None, "no native step for the shape"
native.take_ops(torch)
served = torch.ops.attngen_native.served_step(q, k, v, True, None, None, "bshd", False)
print("native step", step.native_address, "served", served == step.native_address)
address = step.native_address
o, lse = torch.ops.attngen.attention_train.default(q, k, v, True, None, None, "bshd")
dout = torch.randn_like(o)
qT, kT, vT = (t.transpose(1, 2) for t in (q, k, v))
co = torch.ops.aten._scaled_dot_product_cudnn_attention.default(qT, kT, vT, None, True, 0.0, True)
cout, clse = co[0], co[1]
dcout = torch.randn_like(cout)
train_op, backward_op = torch.ops.attngen.attention_train.default, torch.ops.attngen.attention_backward.default
ops = {
    "attngen::attention_train": lambda: train_op(q, k, v, True, None, None, "bshd"),
    "attngen::attention_backward": lambda: backward_op(dout, q, k, v, o, lse, True, None, None, "bshd"),
}
others = {
    "attngen_native::forward": lambda: torch.ops.attngen_native.forward.default(q, k, v, address),
    "attngen_native::backward": lambda: torch.ops.attngen_native.backward.default(dout, q, k, v, o, lse, address),
    "aten cudnn forward": lambda: torch.ops.aten._scaled_dot_product_cudnn_attention.default(
        qT, kT, vT, None, True, 0.0, True),
    "aten cudnn backward": lambda: torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default(
        dcout, qT, kT, vT, cout, clse, co[6], co[7], None, None, None, S, S, 0.0, True),
}
# the results agree: the native kernels' (served) and the Python kernels' (released), bit for bit forward
with_native = train_op(q, k, v, True, None, None, "bshd")
native.release_ops(torch)
with_python = train_op(q, k, v, True, None, None, "bshd")
print("forward equal", all(torch.equal(a, b) for a, b in zip(with_native, with_python)))
N = 200


def timed(f):
    for _ in range(20):
        f()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(N):
        f()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / N * 1e6


res = {}
for _ in range(9):
    for kernels in ("python kernels", "native kernels"):
        (native.take_ops if kernels == "native kernels" else native.release_ops)(torch)
        for name, f in ops.items():
            res.setdefault(f"{name} ({kernels})", []).append(timed(f))
    for name, f in others.items():
        res.setdefault(name, []).append(timed(f))
for name, t in res.items():
    print(f"{name:<52} {statistics.median(t):7.2f} us  (min {min(t):.2f})")
print("op kernels' counts", native.op_counts(torch))   # replays against hand-ons over the whole run
