"""Host µs per call of what a compiled training graph calls: attngen's ops (attngen::attention_train and
::attention_backward, whose CUDA implementations are Python), those implementations called directly, the native
ops they hand the shape's step to, and aten's cuDNN ops; 1x128x8x64 bf16 causal, bshd views of a packed qkv, so
small that the host sets the pace (200 calls back to back, then a synchronize; the median of 7 rounds).

Usage (GPU machine, repository root): python3 docs/backward-h200/native_context/op_host_time.py"""
import time, statistics, sys
import torch
import attngen
from attngen.runtime import native
from attngen.ops import library as L
native.build(torch)
B, S, H, D = 1, 128, 8, 64
dt = torch.bfloat16
qkv = torch.randn(B, S, 3, H, D, device="cuda", dtype=dt)
q, k, v = qkv.unbind(2)
def train_once():
    packed = qkv.clone().requires_grad_()
    o = attngen.attention(*packed.unbind(2), causal=True, layout="bshd")
    o.backward(torch.randn_like(o))
for _ in range(3):
    train_once()
time.sleep(1.0)
for _ in range(3):
    train_once()
step = L._plain_step(q, k, v, True, None, None, "bshd", False, make=False)
print("step", step is not None, "native", getattr(step, "native", None) is not None)
addr = step.native_address
o, lse = torch.ops.attngen.attention_train.default(q, k, v, True, None, None, "bshd")
dout = torch.randn_like(o)
qT, kT, vT = (t.transpose(1, 2) for t in (q, k, v))
co = torch.ops.aten._scaled_dot_product_cudnn_attention.default(qT, kT, vT, None, True, 0.0, True)
cout, clse = co[0], co[1]
dcout = torch.randn_like(cout)
calls = {
 "attngen::attention_train (op)": lambda: torch.ops.attngen.attention_train.default(q, k, v, True, None, None, "bshd"),
 "attention_train_cuda (python impl direct)": lambda: L.attention_train_cuda(q, k, v, True, None, None, "bshd"),
 "attngen_native::forward": lambda: torch.ops.attngen_native.forward.default(q, k, v, addr),
 "aten cudnn forward": lambda: torch.ops.aten._scaled_dot_product_cudnn_attention.default(qT, kT, vT, None, True, 0.0, True),
 "attngen::attention_backward (op)": lambda: torch.ops.attngen.attention_backward.default(dout, q, k, v, o, lse, True, None, None, "bshd"),
 "attention_backward_cuda (python impl direct)": lambda: L.attention_backward_cuda(dout, q, k, v, o, lse, True, None, None, "bshd"),
 "attngen_native::backward": lambda: torch.ops.attngen_native.backward.default(dout, q, k, v, o, lse, addr),
 "aten cudnn backward": lambda: torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default(dcout, qT, kT, vT, cout, clse, co[6], co[7], None, None, None, S, S, 0.0, True),
 "call_key": lambda: L.call_key(q, k, v, True, None, None, False, "bshd"),
}
N = 200
res = {n: [] for n in calls}
for r in range(7):
    for n, f in calls.items():
        for _ in range(20): f()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(N): f()
        torch.cuda.synchronize()
        res[n].append((time.perf_counter() - t) / N * 1e6)
for n, t in res.items():
    print(f"{n:<48} {statistics.median(t):7.2f} us  (min {min(t):.2f})")
