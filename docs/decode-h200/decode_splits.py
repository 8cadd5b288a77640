"""GPU time of one decode cell per split count, beside torch SDPA (the loop's cell: B8 GQA 32/8,
d128, 4k cache, one new token), to check the split heuristic's pick.
Usage: python3 docs/decode-h200/decode_splits.py [spec ...]"""
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import attngen

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))   # the helpers the scripts share
from host_time import gpu_time  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
q = torch.randn(8, 32, 1, 128, device="cuda", dtype=torch.float16)
k, v = (torch.randn(8, 8, 4096, 128, device="cuda", dtype=torch.float16) for _ in range(2))
lens = torch.full((8,), 4096, dtype=torch.int32, device="cuda")
print(f"torch SDPA: {gpu_time(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)):.1f} us")
for spec in sys.argv[1:] or ["specs/h200_decode_d128_fused.yaml", "specs/h200_decode_d128.yaml"]:
    kernel = attngen.load(str(ROOT / spec))
    kernel(q, k, v, cache_seqlens=lens)
    pick = kernel.last_splits
    times = {n: gpu_time(lambda n=n: kernel(q, k, v, cache_seqlens=lens, num_splits=n)) for n in (1, 2, 3, 4, 6, 8, 12, 16)}
    print(f"{Path(spec).stem}: heuristic picks {pick}: " + ", ".join(f"{n}: {t:.1f}" for n, t in times.items()))
