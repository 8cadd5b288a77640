"""The trials of trials/ beside the paged members they would replace and the mma.sync paged cells, alternating in one
process, on paged_ab.py's ragged batch (16 prompts of 1 to 4096 tokens, causal): t_d128_paged_lanes and
t_d256_paged_lanes (page_copies: every_lane, each lane of the issuing warp copying the page it read),
t_d128_paged_gather (page_copies: gather, the producer warpgroup's threads copying with cp.async) and
t_d64_paged_producer (d64 with a producer warpgroup and two ping-pong consumer warpgroups, every lane copying),
t_d256_paged_n64 (d256 on 64-key tiles: a copy of 64 rows from pages of 64, where 80-key tiles copy 16 rows at most).
First each trial on pools whose spare pages and page tails are NaN: its paged output bit for bit its own packed call
on the same keys, and the largest difference from the member's; then GPU µs (`attngen bench`'s queued timing over
input sets rotated past L2), median of 3 rounds, at pages of 1, 16, 64 and 256, bf16 and fp16.
Usage (GPU machine, repository root): python3 docs/hopper-h200/paged_varlen/trials_ab.py OUT.json [HEAD_DIM ...]"""
from pathlib import Path
import json
import sys

import torch

import attngen
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE.parents[1] / "measurements"))   # the helpers the scripts share
sys.path.insert(0, str(HERE))
from gpu_timing import alternating_sets, write_report
from paged_ab import LENGTHS, cells_by_dtype, input_sets, pools, ragged_batch

# (head dim, query heads, KV heads, trial, member, mma.sync paged cell)
CELLS = ((128, 32, 8, "t_d128_paged_lanes", "h100_wgmma_d128_varlen_paged", "h100_mma_d128_paged"),
         (128, 32, 8, "t_d128_paged_gather", "h100_wgmma_d128_varlen_paged", "h100_mma_d128_paged"),
         (64, 64, 8, "t_d64_paged_producer", "h100_wgmma_d64_varlen_paged", "h100_mma_d64_paged"),
         (256, 16, 8, "t_d256_paged_lanes", "h100_wgmma_d256_varlen_paged", "h100_mma_d256_paged"),
         (256, 16, 8, "t_d256_paged_n64", "h100_wgmma_d256_varlen_paged", "h100_mma_d256_paged"))
PAGES = (1, 16, 64, 256)


def with_nan_tails(kp, vp, table, pg: int):
    """The pools with NaN in every row no sequence's keys use (spare pages, the tails of last pages)."""
    ids = table.cpu()
    filled = torch.zeros(kp.shape[0] * pg, dtype=torch.bool)
    for b, keys in enumerate(LENGTHS):
        rows = (ids[b, :-(-keys // pg)].long()[:, None] * pg + torch.arange(pg)).flatten()[:keys]
        filled[rows] = True
    unused = ~filled.view(kp.shape[0], pg, 1, 1).cuda()
    return kp.masked_fill(unused, float("nan")), vp.masked_fill(unused, float("nan"))


def main(report: str, head_dims) -> None:
    rows = []
    cu, used, longest, gen = ragged_batch()
    for (d, hq, hkv, trial_name, member_name, mma_name), (dtype, suffix) in cells_by_dtype(CELLS, head_dims):
        trial = attngen.load(HERE / "trials" / f"{trial_name}{suffix}.yaml")
        member = attngen.load(ROOT / "specs" / f"{member_name}{suffix}.yaml")
        mma = attngen.load(ROOT / "specs" / f"{mma_name}{suffix}.yaml")
        sets = input_sets(gen, d, hq, hkv, dtype)
        for pg in PAGES:
            paged_sets = [(q,) + pools(k, v, pg, gen) for q, k, v in sets]
            kw = {"causal": True, "max_seqlen_q": longest}
            # correctness first: NaN in every pool row past a sequence's keys and in a spare page
            q, k, v = sets[0]
            kp, vp, table = paged_sets[0][1:]
            kn, vn = with_nan_tails(kp, vp, table, pg)
            got = trial.varlen(q, kn, vn, cu, None, block_table=table, seqused_k=used, **kw)
            own = trial.varlen(q, k, v, cu, cu, alignment="bottom_right", **kw)
            ref = member.varlen(q, kn, vn, cu, None, block_table=table, seqused_k=used, **kw)
            torch.cuda.synchronize()
            attngen.check_errors()
            check = {"finite": bool(torch.isfinite(got).all()), "equal_own_packed": bool(torch.equal(got, own)),
                     "max_diff_member": float((got.float() - ref.float()).abs().max())}
            calls = {name: ((lambda q, kp, vp, t, cell=cell: cell.varlen(q, kp, vp, cu, None, block_table=t,
                                                                          seqused_k=used, **kw)), paged_sets)
                     for name, cell in (("trial", trial), ("member", member), ("mma_paged", mma))}
            med, each = alternating_sets(calls, 3)
            row = {"head_dim": d, "dtype": str(dtype).split(".")[1], "page": pg, "heads": f"{hq}/{hkv}",
                   "trial": trial_name + suffix, "us": med, "rounds": each, "check": check,
                   "member_over_trial": med["member"] / med["trial"], "mma_over_trial": med["mma_paged"] / med["trial"]}
            rows.append(row)
            write_report(report, rows)
            print(json.dumps({x: row[x] for x in ("head_dim", "dtype", "page", "us", "member_over_trial",
                                                  "mma_over_trial", "check")}), flush=True)
            paged_sets = kn = vn = None
            torch.cuda.empty_cache()
        sets = None


if __name__ == "__main__":
    main(sys.argv[1], tuple(int(d) for d in sys.argv[2:]) or (128, 64, 256))
