"""One call of attngen under torch.compile(mode="reduce-overhead") as the first GPU work of a fresh
process, so that every buffer attngen keeps between calls (the input-error word, split workspaces,
the sinks' zero row, sequence orders) is first made during the CUDA graph's warm-up,
whose allocations go to the graph's pool. The compiled call runs four times (warm-up, record,
replays) and must equal the eager call bit for bit. Run by tests/test_gpu_ops.py:

    python3 tests/reduce_overhead_step.py CASE      (CASE: one of CASES; exit 0 when it passes)
"""
from __future__ import annotations

import sys

import torch

import attngen


def cu_seqlens(lengths):
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device="cuda")


def decode(g):
    """B1 32/8 d128 over 8192 keys: split across blocks, partials in a kept workspace."""
    q = torch.randn(1, 32, 1, 128, generator=g, device="cuda").half()
    k, v = (torch.randn(1, 8, 8192, 128, generator=g, device="cuda").half() for _ in range(2))
    lens = torch.full((1,), 8000, dtype=torch.int32, device="cuda")
    return lambda: attngen.attention_with_kvcache(q, k, v, cache_seqlens=lens)


def paged_mixed_sinks(g):
    """A serving step of prefill chunks and decode tokens over 16-key pages with softcap and learned
    sinks: the decode rows' sinks are joined after the paged decode kernel's softcap (through a kept
    zero row)."""
    seqs = ((1, 300), (17, 17), (1, 5), (96, 1100), (1, 2049))
    heads, kv_heads, d, page = 16, 4, 128, 16
    q = torch.randn(sum(s[0] for s in seqs), heads, d, generator=g, device="cuda").bfloat16()
    need = [-(-s[1] // page) for s in seqs]
    pool = (sum(need) + 2, page, kv_heads, d)
    kp, vp = (torch.randn(pool, generator=g, device="cuda").bfloat16() for _ in range(2))
    ids = torch.randperm(pool[0], generator=g, device="cuda").int()
    table = torch.full((len(seqs), max(need)), -1, dtype=torch.int32, device="cuda")
    at = 0
    for b, n in enumerate(need):
        table[b, :n] = ids[at:at + n]
        at += n
    cu_q = cu_seqlens([s[0] for s in seqs])
    used = torch.tensor([s[1] for s in seqs], dtype=torch.int32, device="cuda")
    sinks = torch.randn(heads, generator=g, device="cuda")
    return lambda: attngen.attention_varlen(q, kp, vp, cu_q, None, 96, 2049, causal=True, block_table=table,
                                            seqused_k=used, softcap=30.0, sinks=sinks, return_lse=True)


def varlen(g):
    """Three packed sequences: the kernel takes them longest first (an order of the offsets)."""
    lengths = (300, 1024, 77)
    q, k, v = (torch.randn(sum(lengths), 8, 128, generator=g, device="cuda").half() for _ in range(3))
    cu = cu_seqlens(lengths)
    return lambda: attngen.attention_varlen(q, k, v, cu, cu, 1024, 1024, causal=True)


CASES = {"decode": decode, "paged_mixed_sinks": paged_mixed_sinks, "varlen": varlen}


def main(case: str) -> int:
    call = CASES[case](torch.Generator(device="cuda").manual_seed(7))
    compiled = torch.compile(call, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        for _ in range(4):   # warm-up, record, replays
            got = compiled()
        got = [t.clone() for t in (got if isinstance(got, tuple) else (got,))]
        torch.cuda.synchronize()
        want = call()
        want = want if isinstance(want, tuple) else (want,)
    attngen.check_errors()
    for a, b in zip(got, want):
        if not torch.equal(a, b):
            print(f"{case}: compiled and eager differ by {(a.float() - b.float()).abs().max().item()}")
            return 1
    print(f"{case}: reduce-overhead equals eager")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
