"""Host time and GPU time per call of paged and packed varlen prefill through the entry point
(attngen.attention_varlen), bf16 d128 32/8 heads (Llama 3 8B), causal: a short batch (4 prompts of 512, where the host
shows), the ragged batch of paged_ab.py (16 prompts of 1-4096) and a serving step (4 prompts of 512 beside 12 decode
rows over 2048 keys: the call splits the decode rows off to the paged decode kernel). Pages of 16 and 256 (the table's
Hopper members), pages of 8 (the mma.sync cell) and the packed call (the Hopper kind's varlen member). Rows
round-robin over 7 rounds (docs/measurements/host_time.py's measure_rows): eager CPU µs/call (200 calls back to back,
host clock; a call of several launches may wait on the GPU's full launch queue), eager wall µs/call (plus the final
synchronize), GPU µs/call (50 calls queued behind a GPU sleep).
With --profile: cProfile of 200 paged calls of the serving step at pages of 16 instead, the 30 functions of most own
time and the 30 of most time with callees.
With a head dim of 256: Gemma 2 9B's 16/8 heads, and pages of 16, 64 and 256 (d256's Hopper members: 80-key tiles
below pages of 64, 64-key tiles from there).
Usage (GPU machine, repository root): python3 docs/hopper-h200/paged_varlen/eager_paged.py OUT.json [128|256] | --profile"""
from pathlib import Path
import json
import sys

import torch

import attngen
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "measurements"))
sys.path.insert(0, str(HERE))
import host_time
from paged_ab import LENGTHS, pools

BATCHES = {"4x512": (512,) * 4, "16 ragged 1-4096": LENGTHS}
STEP = ((512,) * 4 + (1,) * 12, (512,) * 4 + (2048,) * 12)     # a serving step: queries and keys per sequence
SHAPES = {128: ((32, 8), (8, 16, 256)), 256: ((16, 8), (16, 64, 256))}   # head dim: (query, KV heads), page sizes


def serving_step(gen, pg: int, d: int = 128):
    """The serving step's packed q, k, v, offsets and key counts, and its pools of pages of pg keys."""
    queries, keys = STEP
    (hq, hkv), _ = SHAPES[d]
    q = torch.randn(sum(queries), hq, d, generator=gen, device="cuda").bfloat16()
    k, v = (torch.randn(sum(keys), hkv, d, generator=gen, device="cuda").bfloat16() for _ in range(2))
    kp, vp, table = pools(k, v, pg, gen, keys)
    return (q, k, v, host_time.cu_seqlens(queries), host_time.cu_seqlens(keys),
            torch.tensor(keys, dtype=torch.int32, device="cuda"), kp, vp, table)


def main(report: str, d: int = 128) -> None:
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    rows = []
    (hq, hkv), page_sizes = SHAPES[d]
    for label, lengths in BATCHES.items():
        total = sum(lengths)
        q = torch.randn(total, hq, d, generator=gen, device="cuda").bfloat16()
        k, v = (torch.randn(total, hkv, d, generator=gen, device="cuda").bfloat16() for _ in range(2))
        cu = host_time.cu_seqlens(lengths)
        used = torch.tensor(lengths, dtype=torch.int32, device="cuda")
        longest = max(lengths)
        rows.append(host_time.row(f"{label} packed", lambda q=q, k=k, v=v, cu=cu, m=longest: attngen.attention_varlen(
            q, k, v, cu, cu, m, m, causal=True, alignment="bottom_right")))
        for pg in page_sizes:
            kp, vp, table = pools(k, v, pg, gen, lengths)
            rows.append(host_time.row(f"{label} paged {pg}", lambda q=q, kp=kp, vp=vp, t=table, cu=cu, u=used,
                                      m=longest: attngen.attention_varlen(q, kp, vp, cu, None, m, m, causal=True,
                                                                          block_table=t, seqused_k=u)))
    for pg in page_sizes[1:]:
        q, k, v, cu_q, cu_k, used, kp, vp, table = serving_step(gen, pg, d)
        if pg == page_sizes[1]:
            rows.append(host_time.row("step 4x512 + 12 decode packed", lambda q=q, k=k, v=v, a=cu_q, b=cu_k:
                                      attngen.attention_varlen(q, k, v, a, b, 512, 2048, causal=True,
                                                               alignment="bottom_right")))
        rows.append(host_time.row(f"step 4x512 + 12 decode paged {pg}", lambda q=q, kp=kp, vp=vp, t=table, a=cu_q,
                                  u=used: attngen.attention_varlen(q, kp, vp, a, None, 512, 2048, causal=True,
                                                                   block_table=t, seqused_k=u)))
    host_time.measure_rows()
    Path(report).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                        "command": f"python3 docs/hopper-h200/paged_varlen/eager_paged.py OUT {d}",
                                        "heads": [hq, hkv], "head_dim": d,
                                        "rows": rows}, indent=2) + "\n")


def profile() -> None:
    """Where a serving step's host time goes: cProfile over 200 calls (after 20 unprofiled ones)."""
    import cProfile
    import pstats
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    q, _, _, cu_q, _, used, kp, vp, table = serving_step(gen, 16)

    def call():
        return attngen.attention_varlen(q, kp, vp, cu_q, None, 512, 2048, causal=True, block_table=table,
                                        seqused_k=used)
    for _ in range(20):
        call()
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(200):
        call()
    pr.disable()
    torch.cuda.synchronize()
    pstats.Stats(pr).sort_stats("tottime").print_stats(30)
    pstats.Stats(pr).sort_stats("cumulative").print_stats(30)


if __name__ == "__main__":
    profile() if sys.argv[1] == "--profile" else main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 128)
