"""A process's first eight eager training steps (1x8x512x64 fp16, no mask): attngen's import, each step's wall
time (forward + torch.autograd.grad, synchronized), the autograd node each step made (CppFunction: the native
step), and the native library's state at the end. Usage: python3 docs/measurements/first_call_train_steps.py LABEL
(run it with an empty $ATTNGEN_CACHE_DIR, then after `attngen warm`)."""
import json, sys, time
import torch
torch.manual_seed(0)
q, k, v = (torch.randn(1, 8, 512, 64, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
do = torch.randn(1, 8, 512, 64, device="cuda", dtype=torch.float16)
torch.cuda.synchronize()
t0 = time.perf_counter()
import attngen
from attngen.runtime import native
t1 = time.perf_counter()
steps = []
for i in range(8):
    a = time.perf_counter()
    o = attngen.attention(q, k, v)
    node = type(o.grad_fn).__name__
    g = torch.autograd.grad(o, (q, k, v), do)
    torch.cuda.synchronize()
    steps.append((round((time.perf_counter() - a) * 1e3, 2), node))
print(json.dumps({"mode": sys.argv[1] if len(sys.argv) > 1 else "", "import_ms": round((t1 - t0) * 1e3, 1),
                  "steps_ms_node": steps, "native_state": {k: str(v) for k, v in native._state.items()}}))
