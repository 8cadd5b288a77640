"""attngen.attention with Phi-3's sliding window (causal, window (2047, 0)) at head dim 96, bf16: "before" reads the
dispatch table of the tree before the d96 window cells (TABLE, from `git show f8407348:specs/dispatch/table.yaml`:
q, k and v padded to d128 and the d128 window kernels run), "after" the checkout's. Forward alone and forward +
backward, GPU ms per call by CUDA events over 10 calls back to back after warm-up, median of 5; each mode's output
and gradients against fp32 attention on the first shape (max abs error) and the specs the table gave. One process per
mode (the runtime keeps a shape's kernel once resolved).
Usage: python3 docs/window-d96-h200/window_ab.py OUT.json before|after TABLE"""
import json, statistics, sys
import torch
import attngen
from attngen.eval.table_ab import read_table_from, record_specs
from attngen.eval.verify.cases import attention_torch

MODE = sys.argv[2]
if MODE == "before":
    read_table_from(sys.argv[3])
SEEN = record_specs()

SHAPES = [(2, 32, 2048), (4, 32, 4096), (2, 32, 8192), (1, 32, 16384)]   # Phi-3-mini: 32 heads of 96
W = (2047, 0)


def ms(fn, calls=10):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(5):
        s.record()
        for _ in range(calls):
            fn()
        e.record(); e.synchronize(); out.append(s.elapsed_time(e) / calls)
    return round(statistics.median(out), 4)


rows = []
for n, (b, h, s) in enumerate(SHAPES):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn((b, h, s, 96), generator=g, device="cuda").bfloat16().requires_grad_() for _ in range(3))
    do = torch.randn((b, h, s, 96), generator=g, device="cuda").bfloat16()
    SEEN.clear()
    call = lambda: attngen.attention(q, k, v, causal=True, alignment="bottom_right", window=W)
    row = {"shape": f"{b}x{h}x{s}x96", "window": list(W)}
    if n == 0:   # correctness against fp32 attention of the same window
        out = call()
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), do)
        qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
        ref, _ = attention_torch(qf, kf, vf, scale=96 ** -0.5, mask="window", alignment="bottom_right", window=W)
        rq, rk, rv = torch.autograd.grad(ref, (qf, kf, vf), do.float())
        row["max_err"] = {name: float((a.float() - r).abs().max()) for name, a, r in
                          (("out", out, ref), ("dq", dq, rq), ("dk", dk, rk), ("dv", dv, rv))}
    with torch.no_grad():
        row["forward_ms"] = ms(call)
    def step():
        out = call()
        torch.autograd.grad(out, (q, k, v), do)
    row["forward_backward_ms"] = ms(step)
    row["specs"] = sorted(set(SEEN))
    rows.append(row)
    print(json.dumps(row), flush=True)
    del q, k, v, do
json.dump({"command": " ".join(["python3"] + sys.argv), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "mode": MODE, "rows": rows}, open(sys.argv[1], "w"), indent=1)
