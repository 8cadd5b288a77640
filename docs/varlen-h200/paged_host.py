"""Host time of paged varlen calls (FlashAttention's flash_attn_varlen_func(block_table=, seqused_k=)): a paged
cell's kernel called back to back on the full path every call (its prepared calls dropped before each: how every
paged varlen call ran before it had a prepared path) and on its prepared path, and the public
attngen.attention_varlen with a block table (a step of prefill chunks and decode rows, which it splits between the
varlen and the decode kernels; and a step of prefill chunks alone). CPU, wall and GPU us per call with
docs/measurements/host_time.py's timers (rows round-robin, medians of 7 rounds).

Usage: python3 docs/varlen-h200/paged_host.py OUT.json"""
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
PAGE = 16
for d, spec, seqs in ((128, "h100_mma_d128_paged", ((64, 2048), (1, 1500), (1, 900), (1, 3000), (128, 512), (1, 700),
                                                    (1, 2100), (1, 1200))),
                      (128, "h100_mma_d128_paged", ((256, 1024), (256, 2048), (128, 640), (512, 512))),
                      (64, "h100_mma_d64_paged_bf16", ((64, 2048), (1, 1500), (1, 900), (1, 3000), (128, 512),
                                                       (1, 700), (1, 2100), (1, 1200)))):
    dt = torch.bfloat16 if spec.endswith("bf16") else torch.float16
    h, kvh = 32, 8
    lq, lk = [s[0] for s in seqs], [s[1] for s in seqs]
    q = torch.randn(sum(lq), h, d, generator=g, device="cuda").to(dt)
    cols = max(-(-n // PAGE) for n in lk)
    pages = len(seqs) * cols
    kp = torch.randn(pages, PAGE, kvh, d, generator=g, device="cuda").to(dt)
    vp = torch.randn(pages, PAGE, kvh, d, generator=g, device="cuda").to(dt)
    table = torch.randperm(pages, generator=g, device="cuda").int().view(len(seqs), cols)
    cu_q = host_time.cu_seqlens(lq)
    used = torch.tensor(lk, dtype=torch.int32, device="cuda")
    longest = max(lq)
    kernel = attngen.load(str(ROOT / "specs" / f"{spec}.yaml"))
    label = f"{len(seqs)} seqs ({sum(lq)} queries, {'decode rows and chunks' if 1 in lq else 'chunks'}) {h}/{kvh} d{d}"

    def full_path():
        kernel._prepared.clear()
        kernel.varlen(q, kp, vp, cu_q, None, block_table=table, seqused_k=used, causal=True, max_seqlen_q=longest)

    results.append(host_time.row(f"{label}: {spec} full path every call", full_path))
    results.append(host_time.row(f"{label}: {spec} prepared", lambda: kernel.varlen(
        q, kp, vp, cu_q, None, block_table=table, seqused_k=used, causal=True, max_seqlen_q=longest)))
    results.append(host_time.row(f"{label}: attention_varlen", lambda: attngen.attention_varlen(
        q, kp, vp, cu_q, None, max_seqlen_q=longest, causal=True, block_table=table, seqused_k=used)))
    host_time.measure_rows()
json.dump({"command": "python3 docs/varlen-h200/paged_host.py OUT.json", "device": torch.cuda.get_device_name(),
           "torch": torch.__version__, "rows": results}, open(sys.argv[1], "w"), indent=1)
