"""Paged decode at any page size beside contiguous caches: GPU time of one decode step (B 8, GQA 32/8
heads, head dim 128, 8192 keys per sequence, one new token) through attngen.attention_with_kvcache,
on contiguous caches (the table's contiguous-only spec, and the paged spec without a table) and on
pools of shuffled pages of 1, 16, 64 and 256 keys (one paged kernel, the page size a kernel
parameter). With --old, the page-16 and page-256 kernels before the page size became a parameter
(their generated split files, launched through today's runtime with today's combine) on the same pools.

CUDA events around calls queued behind a GPU sleep (attngen bench's timing), the median of 30 calls
cycling over input sets that together pass the L2; the cells alternate over --rounds rounds and each
reports the median of its rounds. Each paged output is also compared with the contiguous one.

Usage (repository root, GPU machine):
    python3 docs/measurements/paged_page_sizes.py [--dtype fp16] [--rounds 5] [--json OUT.json]
        [--old docs/decode-h200/before-anypage]
"""
import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402

import attngen  # noqa: E402
from attngen.eval.verify.decode import paged_cache  # noqa: E402
from gpu_timing import alternating_sets, write_report  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
B, HQ, HKV, D, SK = 8, 32, 8, 128, 8192
PAGE_SIZES = (1, 16, 64, 256)
SETS = 2                                    # input sets per cell: 2 x 268 MB of K/V, past the 60 MB L2


def old_kernel(new, split_file: Path, label: str):
    """The split kernel of an earlier checkout (its generated file) with today's combine, launched through
    today's runtime: its Params are today's without the page size fields (they were added at the end);
    another spec's file (h200_decode_d128_p256) is renamed to today's function names."""
    split = split_file.read_text().replace(split_file.name.removesuffix("_split.cu"), new.plan.spec.name)
    smem = int(re.search(r"dynamic: (\d+) B exceed", split).group(1))
    plan = dataclasses.replace(new.plan, smem_bytes=smem, abi=new.plan.abi.without({"page_size", "page_shift"}))
    combine = (ROOT / "generated" / new.plan.parts[1].file_name).read_text()
    # Today's combine declares its Params with the page size fields as trailing reserved bytes: shrink them
    # to the earlier Params' size, which the old split kernel was built with.
    shrink = new.plan.abi.size - plan.abi.size
    combine, n = re.subn(r"reserved_(\d+)\[(\d+)\];(  // \+\d+\n\};)",
                         lambda m: f"reserved_{m[1]}[{int(m[2]) - shrink}];{m[3]}", combine, count=1)
    assert n == 1, "the combine's Params end in no reserved bytes"
    combine = combine.replace(f"sizeof(Params) == {new.plan.abi.size}", f"sizeof(Params) == {plan.abi.size}")
    return type(new).from_sources(plan, [split, combine], label=label)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None, help="write the rows here")
    ap.add_argument("--old", default=None, help="folder of the earlier split files (h200_decode_d128_split.cu: "
                                                "pages of 16; h200_decode_d128_p256_split.cu: pages of 256)")
    args = ap.parse_args()
    dtype = torch.float16 if args.dtype == "fp16" else torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(0)
    lens = torch.full((B,), SK, dtype=torch.int32, device="cuda")
    sets = []
    for _ in range(SETS):
        q = torch.randn(B, HQ, 1, D, generator=g, device="cuda").to(dtype)
        k, v = (torch.randn(B, HKV, SK, D, generator=g, device="cuda").to(dtype) for _ in range(2))
        pools = {pg: paged_cache(torch, k, v, None, pg, "bhsd", generator=g, spare=0) for pg in PAGE_SIZES}
        sets.append((q, k, v, pools))
    kv_bytes = 2 * B * HKV * SK * D * 2

    def contiguous(q, k, v, pools):
        return attngen.attention_with_kvcache(q, k, v, cache_seqlens=lens)

    spec = ROOT / "specs" / ("h200_decode_d128.yaml" if args.dtype == "fp16" else "h200_decode_d128_bf16.yaml")
    paged_spec = attngen.load(spec)

    def paged_spec_contiguous(q, k, v, pools):
        return paged_spec(q, k, v, cache_seqlens=lens)

    def paged(pg, kernel=None):
        def call(q, k, v, pools):
            kp, vp, table = pools[pg]
            if kernel is None:
                return attngen.attention_with_kvcache(q, kp, vp, cache_seqlens=lens, block_table=table)
            return kernel(q, kp, vp, cache_seqlens=lens, block_table=table)
        return call

    calls = {"contiguous": contiguous, "paged spec, contiguous cache": paged_spec_contiguous}
    calls |= {f"paged {pg}": paged(pg) for pg in PAGE_SIZES}
    if args.old:
        if args.dtype != "fp16":
            raise SystemExit("--old compares the fp16 kernels (the p256 spec had no bf16 cell)")
        old = Path(args.old)
        base = attngen.load(ROOT / "specs" / "h200_decode_d128.yaml")
        calls["before: paged 16 (page_size: 16 spec)"] = paged(16, old_kernel(base, old / "h200_decode_d128_split.cu",
                                                                                "h200_decode_d128_before"))
        calls["before: paged 256 (p256 spec)"] = paged(256, old_kernel(base, old / "h200_decode_d128_p256_split.cu",
                                                                         "h200_decode_d128_p256_before"))
    q, k, v, pools = sets[0]
    reference = contiguous(q, k, v, pools).float()
    diffs = {name: (fn(q, k, v, pools).float() - reference).abs().max().item() for name, fn in calls.items()}
    attngen.check_errors()
    medians, rounds = alternating_sets({name: (fn, sets) for name, fn in calls.items()}, args.rounds)
    rows = []
    for name, us in medians.items():
        row = {"cell": name, "dtype": args.dtype, "B": B, "heads": f"{HQ}/{HKV}", "head_dim": D, "seqlen_k": SK,
               "us": round(us, 2), "rounds_us": [round(t, 2) for t in rounds[name]],
               "tb_per_s": round(kv_bytes / (us * 1e-6) / 1e12, 3),
               "vs_contiguous": round(us / medians["contiguous"], 3), "max_diff_vs_contiguous": diffs[name]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        write_report(args.json, rows)


if __name__ == "__main__":
    main()
