"""Host time of varlen backward calls (the backward of flash_attn_varlen_func): a varlen backward cell's
call back to back on the full path every call (its prepared calls dropped before each: how every varlen
backward call ran before it had a prepared path) and on its prepared path, and a training step through
attngen.attention_varlen and torch.autograd.grad. CPU, wall and GPU us per call
with docs/measurements/host_time.py's timers (rows round-robin, medians of 7 rounds).

Usage: python3 docs/backward-h200/varlen_host.py OUT.json"""
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "measurements"))
import host_time  # noqa: E402
import attngen  # noqa: E402

g = torch.Generator(device="cuda").manual_seed(0)
results = []
for spec, d, lengths, heads in (("h100_bwd_d64_wgmma_varlen", 64, (128, 256, 64, 512), (8, 8)),
                                ("h100_bwd_d128_varlen", 128, (512, 1024, 300, 2048, 77, 900), (32, 8)),
                                ("h100_bwd_d64_varlen", 64, (128, 256, 64, 512), (8, 8))):
    h, kvh = heads
    total = sum(lengths)
    q = torch.randn(total, h, d, generator=g, device="cuda").half()
    k, v = (torch.randn(total, kvh, d, generator=g, device="cuda").half() for _ in range(2))
    dout = torch.randn(total, h, d, generator=g, device="cuda").half()
    cu = host_time.cu_seqlens(lengths)
    longest = max(lengths)
    o, lse = attngen.attention_varlen(q, k, v, cu, cu, longest, longest, causal=True, return_lse=True)
    bwd = attngen.load(str(ROOT / "specs" / f"{spec}.yaml"))
    label = f"{len(lengths)} seqs ({total} rows) {h}/{kvh} d{d} causal"

    def call():
        return bwd.varlen(q, k, v, o, lse, dout, cu, cu, max_seqlen_q=longest, max_seqlen_k=longest, causal=True)

    def full_path():
        bwd._prepared.clear()
        return call()

    results.append(host_time.row(f"{label}: {spec} full path every call", full_path))
    results.append(host_time.row(f"{label}: {spec} prepared", call))
    if spec == "h100_bwd_d128_varlen":
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]

        def step():
            out = attngen.attention_varlen(*leaves, cu, cu, longest, longest, causal=True)
            return torch.autograd.grad(out, leaves, dout)
        results.append(host_time.row(f"{label}: attention_varlen forward + backward (autograd)", step))
    host_time.measure_rows()   # here: the rows' closures read this iteration's tensors
json.dump({"command": "python3 docs/backward-h200/varlen_host.py OUT.json", "device": torch.cuda.get_device_name(),
           "torch": torch.__version__, "rows": results}, open(sys.argv[1], "w"), indent=1)
