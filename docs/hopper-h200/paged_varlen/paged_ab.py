"""Paged varlen prefill on the Hopper kind (the `paged` members of h100_wgmma_d128_varlen and h100_wgmma_d64_varlen,
h100_wgmma_d256's `varlen_paged` and `varlen_paged_n64`) and through the entry point (attngen.attention_varlen: the
member the table serves at each page size, the batch's single-token prompts split off to the paged decode kernel),
beside the mma.sync paged cells that serve such calls before them (h100_mma_d{64,128,256}_paged) and the Hopper kind's
packed varlen cells on the same keys packed back to back (what the pages cost), alternating in one process. One ragged
batch of prompts (16 sequences of 1 to 4096 tokens, as many queries as keys), pools of shuffled pages: d128 32/8 heads
(Llama 3 8B), pages of 1 to 512 keys, causal (bottom-right) and full; d64 64/8 (gpt-oss), pages of 1, 16 and 256, and
d256 16/8 (Gemma 3 12B), pages of 1, 16, 64 and 256, causal; bf16 and fp16. GPU µs (`attngen bench`'s queued timing
over input sets rotated past L2), median of 3 rounds, and the largest difference between the Hopper member's output
and the others'.
Usage (GPU machine, repository root): python3 docs/hopper-h200/paged_varlen/paged_ab.py OUT.json [HEAD_DIM ...]"""
from pathlib import Path
import json
import math
import sys

import torch

import attngen
from attngen.runtime.calls.varlen import cu_seqlens
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE.parents[1] / "measurements"))   # the helpers the scripts share
from gpu_timing import alternating_sets, write_report

LENGTHS = (1, 9, 60, 128, 256, 511, 700, 1024, 1, 2047, 33, 4096, 5, 64, 900, 1500)
# (head dim, query heads, KV heads, Hopper member, mma.sync paged cell, Hopper packed cell, pages, masks (causal?))
CELLS = ((128, 32, 8, "h100_wgmma_d128_varlen_paged", "h100_mma_d128_paged", "h100_wgmma_d128_varlen",
          (1, 16, 64, 256, 512), (True, False)),
         (64, 64, 8, "h100_wgmma_d64_varlen_paged", "h100_mma_d64_paged", "h100_wgmma_d64_varlen", (1, 16, 256), (True,)),
         (256, 16, 8, "h100_wgmma_d256_varlen_paged", "h100_mma_d256_paged", "h100_wgmma_d256_varlen", (1, 16, 64, 256),
          (True,)))
# Further Hopper members timed beside a head dim's first (the table serves each from its entry's min_page)
MORE_MEMBERS = {256: ("h100_wgmma_d256_varlen_paged_n64",)}


def pools(k, v, pg: int, gen, lengths=LENGTHS):
    """k and v (packed, sequences of `lengths` keys) as pools (num_pages, pg, kv heads, head dim) of shuffled pages,
    and the block table."""
    need = [-(-n // pg) for n in lengths]
    order = torch.randperm(sum(need), generator=gen, device="cuda")
    kp = torch.zeros((sum(need), pg) + tuple(k.shape[1:]), dtype=k.dtype, device="cuda")
    vp = torch.zeros_like(kp)
    table = torch.zeros((len(lengths), max(need)), dtype=torch.int32, device="cuda")
    at = start = 0
    for b, (n, keys) in enumerate(zip(need, lengths)):
        ids = order[at:at + n]
        table[b, :n] = ids.int()
        for src, pool in ((k, kp), (v, vp)):
            rows = torch.zeros((n * pg,) + tuple(src.shape[1:]), dtype=src.dtype, device="cuda")
            rows[:keys] = src[start:start + keys]
            pool[ids] = rows.reshape((n, pg) + tuple(src.shape[1:]))
        at, start = at + n, start + keys
    return kp, vp, table


def input_sets(gen, d: int, heads_q: int, heads_kv: int, dtype):
    """Packed (q, k, v) sets of the ragged batch, as many as take 3x the L2 (2 to 8)."""
    total = sum(LENGTHS)
    one = total * (2 * heads_q + 2 * heads_kv) * d * 2
    n = max(2, min(8, math.ceil(3 * torch.cuda.get_device_properties(0).L2_cache_size / one)))
    return [tuple(torch.randn(total, heads, d, generator=gen, device="cuda").to(dtype)
                  for heads in (heads_q, heads_kv, heads_kv)) for _ in range(n)]


def ragged_batch(lengths=LENGTHS):
    """The batch's offsets (int32 cu_seqlens), key counts (int32 seqused_k) and longest sequence, and a generator
    seeded at 0 for its inputs."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    return (cu_seqlens(torch, lengths, "cuda"), torch.tensor(lengths, dtype=torch.int32, device="cuda"), max(lengths),
            gen)


def cells_by_dtype(cells, head_dims):
    """Each cell of a head dim in head_dims, in bf16 then fp16: (cell, (torch dtype, spec name suffix))."""
    return ((c, t) for c in cells if c[0] in head_dims for t in ((torch.bfloat16, "_bf16"), (torch.float16, "")))


def main(report: str, head_dims) -> None:
    rows = []
    cu, used, longest, gen = ragged_batch()
    for (d, heads_q, heads_kv, hopper_name, mma_name, packed_name, pages, masks), (dtype, suffix) in \
            cells_by_dtype(CELLS, head_dims):
        hopper = attngen.load(ROOT / "specs" / f"{hopper_name}{suffix}.yaml")
        mma = attngen.load(ROOT / "specs" / f"{mma_name}{suffix}.yaml")
        packed = attngen.load(ROOT / "specs" / f"{packed_name}{suffix}.yaml")
        more = {name: attngen.load(ROOT / "specs" / f"{name}{suffix}.yaml") for name in MORE_MEMBERS.get(d, ())}
        sets = input_sets(gen, d, heads_q, heads_kv, dtype)
        for causal in masks:
            for pg in pages:
                paged_sets = [(q,) + pools(k, v, pg, gen) for q, k, v in sets]
                kw = {"causal": causal, "max_seqlen_q": longest}
                calls = {
                    "hopper_paged": ((lambda q, kp, vp, t: hopper.varlen(q, kp, vp, cu, None, block_table=t,
                                                                          seqused_k=used, **kw)), paged_sets),
                    "mma_paged": ((lambda q, kp, vp, t: mma.varlen(q, kp, vp, cu, None, block_table=t, seqused_k=used,
                                                                    **kw)), paged_sets),
                    "hopper_packed": ((lambda q, k, v: packed.varlen(q, k, v, cu, cu, alignment="bottom_right"
                                                                      if causal else None, **kw)), sets),
                    # the entry point: the member the table serves at this page size, and the decode split of the
                    # batch's single-token prompts
                    "entry": ((lambda q, kp, vp, t: attngen.attention_varlen(q, kp, vp, cu, None, longest, longest,
                                                                             block_table=t, seqused_k=used,
                                                                             causal=causal)), paged_sets)}
                for name, member in more.items():
                    calls[name] = ((lambda q, kp, vp, t, m=member: m.varlen(q, kp, vp, cu, None, block_table=t,
                                                                             seqused_k=used, **kw)), paged_sets)
                med, each = alternating_sets(calls, 3)
                outs = {name: fn(*s[0]).float() for name, (fn, s) in calls.items()}
                row = {"head_dim": d, "dtype": str(dtype).split(".")[1], "causal": causal, "page": pg,
                       "heads": f"{heads_q}/{heads_kv}", "us": med, "rounds": each,
                       "mma_over_hopper": med["mma_paged"] / med["hopper_paged"],
                       "paged_over_packed": med["hopper_paged"] / med["hopper_packed"],
                       "max_diff_mma": float((outs["hopper_paged"] - outs["mma_paged"]).abs().max()),
                       "max_diff_packed": float((outs["hopper_paged"] - outs["hopper_packed"]).abs().max()),
                       "entry_over_packed": med["entry"] / med["hopper_packed"]}
                for name in more:
                    row[f"{name}_over_packed"] = med[name] / med["hopper_packed"]
                    row[f"max_diff_{name}"] = float((outs[name] - outs["hopper_packed"]).abs().max())
                rows.append(row)
                write_report(report, rows)      # after every row: a call cut short keeps what it measured
                print(json.dumps({x: row[x] for x in ("head_dim", "dtype", "causal", "page", "us", "mma_over_hopper",
                                                      "paged_over_packed", "max_diff_mma", "max_diff_packed")}),
                      flush=True)
                paged_sets = outs = None
                torch.cuda.empty_cache()
        sets = None


if __name__ == "__main__":
    main(sys.argv[1], tuple(int(d) for d in sys.argv[2:]) or (128, 64, 256))
