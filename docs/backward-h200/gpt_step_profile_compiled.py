"""The small GPT step under torch.compile (docs/performance/backward.md, "The small GPT step"): ms per step,
kernels and GPU time per step, the CPU time of the top operators (torch.profiler), then the host time of
one call of each op alone (attngen's forward and backward ops against aten's flash ones, 1x8x128x64 bf16).

Usage (GPU machine, repository root): python3 docs/backward-h200/gpt_step_profile_compiled.py"""
import sys, time, statistics, collections
import torch, torch.nn.functional as F
sys.path.insert(0, "docs/backward-h200")
from train_compare import GPT, batches
from gpt_step_bench import make_step
import attngen
from torch.profiler import profile, ProfilerActivity

torch.manual_seed(0)
vocab, d, H, L, S, B = 512, 512, 8, 4, 1024, 8
init = {k: v.clone() for k, v in GPT(vocab, d, H, L, S, False).state_dict().items()}
data = batches(8, B, S, vocab, "cuda")
for compiled in (True,):
  for use in (False, True):
    m = GPT(vocab, d, H, L, S, use).cuda(); m.load_state_dict(init)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01)
    st = make_step(torch.compile(m) if compiled else m, opt, torch.bfloat16, vocab)
    for x in data[:4]: st(x)
    torch.cuda.synchronize()
    ts = []
    for r in range(5):
        t0 = time.perf_counter()
        for x in data: st(x)
        torch.cuda.synchronize(); ts.append((time.perf_counter() - t0) / len(data) * 1e3)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for x in data[4:7]: st(x)
        torch.cuda.synchronize()
    name = ("compiled " if compiled else "eager ") + ("attngen" if use else "sdpa")
    ka = prof.key_averages()
    nk = sum(e.count for e in ka if e.device_type == torch.autograd.DeviceType.CUDA)
    gpu = sum(e.self_device_time_total for e in ka if e.device_type == torch.autograd.DeviceType.CUDA)
    print(f"== {name}: {statistics.median(ts):.3f} ms/step, {nk/3:.0f} kernels/step, GPU {gpu/3e3:.3f} ms/step")
    rows = sorted((e for e in ka if e.device_type == torch.autograd.DeviceType.CPU), key=lambda e: -e.cpu_time_total)
    for e in rows[:28]:
        print(f"   {e.cpu_time_total/3:9.1f} tot {e.self_cpu_time_total/3:9.1f} self  x{e.count/3:5.1f}  {e.key[:80]}")
# op-level host cost
q = torch.randn(1, 8, 128, 64, device="cuda", dtype=torch.bfloat16)
k, v, do = torch.randn_like(q), torch.randn_like(q), torch.randn_like(q)
o, lse = torch.ops.attngen.attention_train(q, k, v, True, None, None, "bhsd")
fo = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)
calls = {
 "attngen fwd op": lambda: torch.ops.attngen.attention_train(q, k, v, True, None, None, "bhsd"),
 "attngen bwd op": lambda: torch.ops.attngen.attention_backward(do, q, k, v, o, lse, True, None, None, "bhsd"),
 "flash fwd op": lambda: torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True),
 "flash bwd op": lambda: torch.ops.aten._scaled_dot_product_flash_attention_backward(do, q, k, v, fo[0], fo[1], fo[2], fo[3], 128, 128, 0.0, True, fo[6], fo[7]),
}
for n, f in calls.items():
    for _ in range(50): f()
    torch.cuda.synchronize()
    ws = []
    for r in range(7):
        t0 = time.perf_counter()
        for _ in range(200): f()
        ws.append((time.perf_counter() - t0) / 200 * 1e6)
        torch.cuda.synchronize()
    print(f"{n:16s} {statistics.median(ws):6.1f} us host per call")
