"""Where the small GPT step's time goes (docs/performance/backward.md, "The small GPT step"), eager: GPU kernel
time per step by kernel (torch.profiler), then the attention alone (forward + backward on the model's strided bshd
views, CUDA events around 20 back-to-back steps) for attngen and each SDPA backend.

Usage (GPU machine, repository root): python3 docs/backward-h200/gpt_step_profile.py"""
import sys, time, statistics, collections
from pathlib import Path
import torch, torch.nn.functional as F
sys.path.insert(0, "docs/backward-h200")
from train_compare import GPT, batches
from gpt_step_bench import make_step
import attngen
from torch.profiler import profile, ProfilerActivity

torch.manual_seed(0)
vocab, d, H, L, S, B = 512, 512, 8, 4, 1024, 8
init = {k: v.clone() for k, v in GPT(vocab, d, H, L, S, False).state_dict().items()}
data = batches(6, B, S, vocab, "cuda")
for use in (False, True):
    m = GPT(vocab, d, H, L, S, use).cuda(); m.load_state_dict(init)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01)
    st = make_step(m, opt, torch.bfloat16, vocab)
    for x in data[:3]: st(x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for x in data[3:]: st(x)
        torch.cuda.synchronize()
    agg = collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            agg[e.name[:90]] += e.device_time
    tot = sum(agg.values()) / 3
    print(f"== {'attngen' if use else 'sdpa'}: GPU kernel time per step {tot/1e3:.3f} ms")
    for n, t in agg.most_common(12):
        print(f"  {t/3:9.1f} us  {n}")

# attention alone
g = torch.Generator(device="cuda").manual_seed(1)
qkv = torch.randn(B, S, 3, H, d // H, device="cuda", generator=g).bfloat16().requires_grad_()
do = torch.randn(B, S, H, d // H, device="cuda", generator=g).bfloat16()
def ag():
    q, k, v = qkv.unbind(2)
    o = attngen.attention(q, k, v, causal=True, layout="bshd")
    o.backward(do)
def sd(backend):
    def f():
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))
        with torch.nn.attention.sdpa_kernel(backend):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
        o.backward(do)
    return f
from torch.nn.attention import SDPBackend
fns = {"attngen": ag, "flash": sd(SDPBackend.FLASH_ATTENTION), "cudnn": sd(SDPBackend.CUDNN_ATTENTION),
       "sdpa default": sd([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION])}
res = collections.defaultdict(list)
for f in fns.values():
    for _ in range(5): f()
for r in range(5):
    for n, f in fns.items():
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter(); e0.record()
        for _ in range(20): f()
        e1.record(); torch.cuda.synchronize()
        res[n].append((e0.elapsed_time(e1) * 50, (time.perf_counter() - t0) * 5e4))
for n, v in res.items():
    print(f"{n:13s} fwd+bwd {statistics.median(a for a, _ in v):7.1f} us (events, back to back)  wall {statistics.median(b for _, b in v):7.1f} us")
for n in ("attngen", "flash"):
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fns[n](); torch.cuda.synchronize()
    print("kernels of", n, [(e.name[:60], round(e.device_time, 1)) for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA])
