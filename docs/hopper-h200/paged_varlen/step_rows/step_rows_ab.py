"""One tree's side of the before/after of a serving step's decode rows in place (DecodeKernel.rows_call beside a paged
varlen call with single_queries_apart), bf16 d128 32/8 heads (Llama 3 8B), µs a call (host_time.py's rows: eager CPU,
eager wall, GPU behind a queued sleep):
- plain paged decode calls (attention_with_kvcache, one new token, pages of 16 and 256): their split and combine
  functions keep their code, but their Params grew by the step's offsets;
- a plain paged varlen prefill of 4 prompts of 512 (pages of 16): its kernel reads the new flag in every block;
- a serving step of 4 prompts of 512 beside 12 decode rows over 2048 keys (pages of 16 and 256), and the ragged
  batch of paged_ab.py (16 prompts of 1-4096 keys, two of one token), which the change moves off the tensor ops.
Run once per tree, alternating (run_step_rows.sh ab). Usage (GPU machine): python3 step_rows_ab.py OUT.json"""
from pathlib import Path
import json
import sys

import torch

import attngen
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "measurements"))
sys.path.insert(0, str(HERE.parent))
import host_time
from paged_ab import LENGTHS, pools
from eager_paged import serving_step

DECODES = ((8, 8192, 16), (8, 8192, 256), (32, 4096, 16), (1, 32768, 16), (64, 2048, 16))  # batch, keys, page size


def decode_pools(gen, batch: int, keys: int, pg: int):
    """q (batch, 32, 1, 128) and pools (pages, 8, pg, 128) of shuffled pages, the table and the lengths."""
    per = -(-keys // pg)
    kp, vp = (torch.randn(batch * per, 8, pg, 128, generator=gen, device="cuda").bfloat16() for _ in range(2))
    table = torch.randperm(batch * per, generator=gen, device="cuda").int().reshape(batch, per)
    q = torch.randn(batch, 32, 1, 128, generator=gen, device="cuda").bfloat16()
    return q, kp, vp, table, torch.full((batch,), keys, dtype=torch.int32, device="cuda")


def main(report: str) -> None:
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    rows = []
    for batch, keys, pg in DECODES:
        q, kp, vp, table, lens = decode_pools(gen, batch, keys, pg)
        rows.append(host_time.row(f"decode B{batch} {keys} keys, pages of {pg}", lambda q=q, kp=kp, vp=vp, t=table,
                                  n=lens: attngen.attention_with_kvcache(q, kp, vp, cache_seqlens=n, block_table=t)))
    lengths = (512,) * 4
    q = torch.randn(2048, 32, 128, generator=gen, device="cuda").bfloat16()
    k, v = (torch.randn(2048, 8, 128, generator=gen, device="cuda").bfloat16() for _ in range(2))
    kp, vp, table = pools(k, v, 16, gen, lengths)
    cu, used = host_time.cu_seqlens(lengths), torch.tensor(lengths, dtype=torch.int32, device="cuda")
    rows.append(host_time.row("prefill 4x512, pages of 16", lambda: attngen.attention_varlen(
        q, kp, vp, cu, None, 512, 512, causal=True, block_table=table, seqused_k=used)))
    for pg in (16, 256):
        sq, _, _, cu_q, _, used_s, kps, vps, tab = serving_step(gen, pg)
        rows.append(host_time.row(f"step 4x512 + 12 decode rows, pages of {pg}", lambda q=sq, kp=kps, vp=vps, t=tab,
                                  a=cu_q, u=used_s: attngen.attention_varlen(q, kp, vp, a, None, 512, 2048, causal=True,
                                                                             block_table=t, seqused_k=u)))
    total = sum(LENGTHS)
    rq = torch.randn(total, 32, 128, generator=gen, device="cuda").bfloat16()
    rk, rv = (torch.randn(total, 8, 128, generator=gen, device="cuda").bfloat16() for _ in range(2))
    rkp, rvp, rtab = pools(rk, rv, 16, gen, LENGTHS)
    rcu, rused = host_time.cu_seqlens(LENGTHS), torch.tensor(LENGTHS, dtype=torch.int32, device="cuda")
    rows.append(host_time.row("16 ragged 1-4096, pages of 16", lambda: attngen.attention_varlen(
        rq, rkp, rvp, rcu, None, max(LENGTHS), max(LENGTHS), causal=True, block_table=rtab, seqused_k=rused)))
    host_time.measure_rows()
    Path(report).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                        "attngen": str(Path(attngen.__file__).parent),
                                        "command": "python3 docs/hopper-h200/paged_varlen/step_rows/step_rows_ab.py",
                                        "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
