"""Does a cp.async with an L2 prefetch size stream decode's K/V faster? (#60: the cells of 1 GB and more are
0.987-0.999x the faster SDPA backend back to back, both at the bandwidth limit; attngen streams at 4.6-4.7 TB/s.)
Every K/V chunk of the decode kernels is one `cp.async.cg.shared.global` of 16 bytes (LDGSTS.E.BYPASS.128); with
`.L2::128B` or `.L2::256B` the L2 fetches that much around each chunk from DRAM (LDGSTS...LTC128B / LTC256B).

Per cell (bf16, d128, one new token, contiguous caches, the grid's cells of 67 MB to 8.6 GB): the kernel the
dispatch table picks for attngen.attention_with_kvcache ("as built"), the same sources with every cp.async given
`.L2::128B` and `.L2::256B` (compiled here, launched the same way), and SDPA's cuDNN backend; timed per call
(events around each call, queued behind a GPU sleep) and back to back (30 calls between two events), alternating
over ROUNDS rounds, the caches rotated past L2. Outputs compared bit for bit with the built kernel's.

Usage: python3 docs/decode-h200/l2_prefetch/l2_prefetch_ab.py OUT.json [ROUNDS]"""
from pathlib import Path
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attngen.ops import library
from attngen.runtime.calls import kernel_class
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "measurements"))
from gpu_timing import alternating_both, write_report  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
D = 128
CELLS = ((8, 32, 8, 2048), (2, 32, 8, 8192), (4, 32, 8, 8192), (1, 32, 8, 32768), (8, 32, 8, 32768),
         (1, 32, 8, 131072), (32, 32, 8, 32768), (64, 64, 8, 8192))
PLAIN = "cp.async.cg.shared.global ["


def with_prefetch(source: str, size: int) -> str:
    assert PLAIN in source, "no cp.async in this source"
    return source.replace(PLAIN, f"cp.async.cg.shared.global.L2::{size}B [")


def main(out_path, rounds="5"):
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for b, h, hkv, sk in CELLS:
        kv_bytes = 2 * b * hkv * sk * D * 2
        rot = max(2, min(8, int(3 * 60e6 // kv_bytes) + 1))
        qs = [torch.randn(b, h, 1, D, generator=g, device="cuda").bfloat16() for _ in range(rot)]
        ks = [torch.randn(b, hkv, sk, D, generator=g, device="cuda").bfloat16() for _ in range(rot)]
        vs = [torch.randn(b, hkv, sk, D, generator=g, device="cuda").bfloat16() for _ in range(rot)]
        built = library._decode_kernel(qs[0], ks[0], None, "none", "bhsd")
        plan = built.plan
        sources = [(ROOT / "generated" / part.file_name).read_text() for part in plan.parts]
        kernels = {"as built": built}
        for size in (128, 256):
            variant = [with_prefetch(s, size) if PLAIN in s else s for s in sources]
            kernels[f"L2::{size}B"] = kernel_class(plan).from_sources(plan, variant, label=f"{plan.spec.name}_l2_{size}")
        calls = {name: (lambda kern: lambda i: kern(qs[i], ks[i], vs[i]))(kern) for name, kern in kernels.items()}

        def cudnn(i):
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(qs[i], ks[i], vs[i], enable_gqa=h != hkv)
        calls["cudnn"] = cudnn
        first = calls["as built"](0)
        same = {name: bool(torch.equal(calls[name](0), first)) for name in kernels}
        med, each = alternating_both(calls, [(i,) for i in range(rot)], int(rounds))
        row = {"cell": f"B{b} {h}/{hkv} Sk{sk}", "kv_mb": round(kv_bytes / 1e6, 1), "spec": plan.spec.name,
               "splits": built.last_splits, "same_bits": same, "median": med, "rounds": each,
               "tb_per_s_b2b": {n: round(kv_bytes / (m["b2b_us"] * 1e-6) / 1e12, 3) for n, m in med.items()}}
        rows.append(row)
        print(f"{row['cell']:<22} {row['kv_mb']:>8.1f} MB {plan.spec.name:<36}", *(
            f"{n} {m['us']:.2f}/{m['b2b_us']:.2f}" for n, m in med.items()), same, flush=True)
        qs = ks = vs = calls = kernels = None
        torch.cuda.empty_cache()
    write_report(out_path, rows, f"python3 docs/decode-h200/l2_prefetch/l2_prefetch_ab.py OUT.json {rounds}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(*sys.argv[1:])
