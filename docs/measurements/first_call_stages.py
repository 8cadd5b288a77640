"""Where a process's first attngen call spends its host time, stage by stage: imports (attngen, the
torch ops' registration, the runtime's modules), then the first call with the functions on its path
timed by wrappers installed after the imports (so a stage's figure holds no import).
Usage: python3 docs/measurements/first_call_stages.py fwd|dec  (warm cubin cache; prints one JSON line)."""
import functools
import json
import sys
import time

import torch

mode = sys.argv[1] if len(sys.argv) > 1 else "fwd"
torch.manual_seed(0)
if mode == "fwd":
    q, k, v = (torch.randn(2, 16, 2048, 128, device="cuda", dtype=torch.float16) for _ in range(3))
else:
    q = torch.randn(8, 32, 1, 128, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(8, 8, 4096, 128, device="cuda", dtype=torch.float16) for _ in range(2))
torch.cuda.synchronize()
stages = {}
clock = time.perf_counter


def mark(name, since):
    now = clock()
    stages[name] = round((now - since) * 1e3, 2)
    return now


t = start = clock()
import attngen                                   # noqa: E402
t = mark("import attngen", t)
entry = attngen.attention                        # binds the torch ops (ops._bind)
t = mark("bind torch ops", t)
import attngen.compile, attngen.cubin, attngen.shipped, attngen.ops.dispatch, attngen.ops.table  # noqa: E402,E401
import attngen.runtime.calls, attngen.runtime.driver, attngen.runtime.kernel  # noqa: E402,E401
from attngen.runtime.calls import convention_class  # noqa: E402
convention_class("decode" if mode == "dec" else "forward")
t = mark("import runtime", t)

timed = {}


def wrap(module, name, label):
    fn = getattr(module, name)

    @functools.wraps(fn)
    def timed_call(*a, **kw):
        s = clock()
        try:
            return fn(*a, **kw)
        finally:
            timed[label] = round(timed.get(label, 0.0) + (clock() - s) * 1e3, 2)
    for m in list(sys.modules.values()):     # every attngen module that imported it by name
        if getattr(m, "__name__", "").startswith("attngen") and getattr(m, name, None) is fn:
            setattr(m, name, timed_call)


K, S, T, D = attngen.runtime.kernel, attngen.shipped, attngen.ops.table, attngen.runtime.driver
wrap(T, "load_table", "table: load")
wrap(T, "read_memo", "table: read memo")
wrap(S, "render_inputs", "render inputs")
wrap(S, "committed_launch", "launch record + sources")
wrap(K, "launch_bundle", "launch bundle")
wrap(K, "compile_source", "cubin cache lookup")
wrap(K, "param_layout", "param layout")
wrap(D, "load_library", "driver: load library")
wrap(D, "library_kernel", "driver: kernel handle")
t = clock()
out = attngen.attention(q, k, v, causal=True) if mode == "fwd" else attngen.attention(q, k, v)
t = mark("first call", t)
torch.cuda.synchronize()
stages["total in attngen"] = round((t - start) * 1e3, 2)
s = clock()
attngen.attention(q, k, v, causal=True) if mode == "fwd" else attngen.attention(q, k, v)
stages["second call"] = round((clock() - s) * 1e3, 3)
print(json.dumps({"mode": mode, "stages": stages, "inside first call": timed}))
