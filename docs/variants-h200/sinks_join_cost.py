"""What joining learned sinks after the kernel costs (ops.library.join_sinks): softcap or ALiBi alone against
the same call with sinks (ALiBi's joined after its kernel; softcap's in a softcap_sink kernel, and joined
after the softcap kernel by hand, as the table did before those), beside the sink kernel and the plain call;
GPU us (host_time.gpu_time: calls queued behind a GPU sleep, CUDA events, median of 7 rounds), bf16, causal.

Usage (GPU machine, repository root): python3 docs/variants-h200/sinks_join_cost.py"""
import json
import sys
from pathlib import Path
import torch
import attngen
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))   # the shared helpers
from host_time import gpu_time
from attngen.ops.library import join_sinks


def run():
    for b, h, s, d in ((8, 16, 1024, 64), (2, 16, 4096, 128), (1, 16, 8192, 256)):
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        sinks = torch.randn(h, device="cuda")
        slopes = torch.rand(h, device="cuda") * 0.1
        rows = {}
        rows["softcap, sinks joined after"] = round(gpu_time(lambda: join_sinks(
            *attngen.attention(q, k, v, causal=True, softcap=30.0, return_lse=True), sinks, "bhsd")), 1)
        for name, kw in (("softcap", {"softcap": 30.0}), ("softcap+sinks", {"softcap": 30.0, "sinks": sinks}),
                         ("sinks (kernel)", {"sinks": sinks}), ("plain", {}),
                         ("alibi", {"alibi_slopes": slopes}), ("alibi+sinks", {"alibi_slopes": slopes, "sinks": sinks})):
            rows[name] = round(gpu_time(lambda: attngen.attention(q, k, v, causal=True, **kw)), 1)
        print(json.dumps({"shape": f"{b}x{h}x{s}x{d}", "causal": True, "gpu_us": rows}), flush=True)
    # decode
    q = torch.randn(8, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    kc, vc = (torch.randn(8, 8, 8192, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    lens = torch.full((8,), 8000, dtype=torch.int32, device="cuda")
    sinks = torch.randn(32, device="cuda")
    rows = {}
    for name, kw in (("softcap", {"softcap": 30.0}), ("softcap+sinks", {"softcap": 30.0, "sinks": sinks}),
                     ("sinks (kernel)", {"sinks": sinks})):
        rows[name] = round(gpu_time(lambda: attngen.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True, **kw)), 1)
    print(json.dumps({"decode": "B8 32/8 Sk8192 d128", "gpu_us": rows}), flush=True)


run()
