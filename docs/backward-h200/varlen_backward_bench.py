"""The varlen backward specs (h100_bwd_d{64,128}_varlen, and at d64 the Hopper class's
h100_bwd_d64_wgmma_varlen) beside torch's varlen FlashAttention-2 backward
(torch.ops.aten._flash_attention_backward with cumulative offsets) in one process, and beside the
padded backward spec on the same sequences padded to the longest.

Usage: python3 docs/backward-h200/varlen_backward_bench.py OUT.json

One mixed-length batch (16 sequences of 1 to 4096 tokens, 16 heads), fp16 (and bf16 where the Hopper
class runs: d64), causal and not. GPU time
of one backward call (attngen: preprocess + main + convert; flash: its backward), CUDA events around
each call, median of 15 after 3 warm-up calls. Before timing, attngen's gradients are checked
against flash's (max |difference| reported). TFLOP/s count 2.5 x the forward's 4 d per visible
(query, key) pair.
"""
from pathlib import Path
import json, sys

import torch

import attngen
from attngen.eval.bench.varlen import visible_pairs
from attngen.runtime.calls.varlen import cu_seqlens
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))   # the helpers the scripts share
from gpu_timing import med

LENGTHS = (1, 9, 60, 128, 256, 511, 700, 1024, 1, 2047, 33, 4096, 5, 64, 900, 1500)
HEADS = 16


def main(out):
    rows = []
    total, longest = sum(LENGTHS), max(LENGTHS)
    cu = cu_seqlens(torch, LENGTHS, "cuda")
    for d, dtype in ((64, "fp16"), (128, "fp16"), (64, "bf16")):
        tail = "_bf16" if dtype == "bf16" else ""
        dt = torch.float16 if dtype == "fp16" else torch.bfloat16
        bwd = attngen.load(f"specs/h100_bwd_d{d}_varlen{tail}.yaml")
        padded = attngen.load(f"specs/h100_bwd_d{d}{tail}.yaml")
        wgmma = attngen.load(f"specs/h100_bwd_d{d}_wgmma_varlen{tail}.yaml") if d == 64 else None
        for causal in (False, True):
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v, do = (torch.randn(total, HEADS, d, device="cuda", dtype=dt, generator=g)
                           for _ in range(4))
            scale = d ** -0.5
            o, lse, seed, offset, _ = torch.ops.aten._flash_attention_forward(
                q, k, v, cu, cu, longest, longest, 0.0, causal, False, scale=scale)

            def flash():
                return torch.ops.aten._flash_attention_backward(do, q, k, v, o, lse, cu, cu, longest, longest, 0.0,
                                                                causal, seed, offset, scale=scale)

            def ours(deterministic=False, kernel=bwd):
                return kernel.varlen(q, k, v, o, lse, do, cu, cu, max_seqlen_k=longest, causal=causal,
                                     deterministic=deterministic)
            diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(ours(), flash()[:3]))
            # the padded spec on the same sequences padded to the longest (B, H, longest, d): what varlen saves
            pad = [torch.zeros(len(LENGTHS), HEADS, longest, d, device="cuda", dtype=dt) for _ in range(4)]
            for b, (s, n) in enumerate(zip(cu.tolist(), LENGTHS)):
                for t, src in zip(pad, (q, k, v, do)):
                    t[b, :, :n] = src[s:s + n].transpose(0, 1)
            row = {"d": d, "dtype": dtype, "causal": causal, "sequences": len(LENGTHS), "tokens": total, "heads": HEADS,
                   "max_abs_diff_vs_flash": diff,
                   "attngen_us": med(ours), "attngen_deterministic_us": med(lambda: ours(True)),
                   "flash_us": med(flash)}
            pq, pk, pv, pdo = pad
            po, plse2 = attngen.attention(pq, pk, pv, causal=causal, return_lse=True)
            row["padded_attngen_us"] = med(lambda: padded(pq, pk, pv, po, plse2, pdo, causal=causal))
            flops = 4 * d * HEADS * visible_pairs(LENGTHS, causal) * 2.5
            row["attngen_tflops"] = flops / row["attngen_us"] / 1e6
            row["flash_tflops"] = flops / row["flash_us"] / 1e6
            row["vs_flash"] = row["flash_us"] / row["attngen_us"]
            if wgmma is not None:
                row["wgmma_max_abs_diff_vs_flash"] = max((a.float() - b.float()).abs().max().item()
                                                         for a, b in zip(ours(kernel=wgmma), flash()[:3]))
                row["wgmma_us"] = med(lambda: ours(kernel=wgmma))
                row["wgmma_deterministic_us"] = med(lambda: ours(True, kernel=wgmma))
                row["wgmma_tflops"] = flops / row["wgmma_us"] / 1e6
                row["wgmma_vs_flash"] = row["flash_us"] / row["wgmma_us"]
            print(json.dumps(row), flush=True)
            rows.append(row)
    json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "lengths": LENGTHS, "rows": rows},
              open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
