"""Three calls of one contiguous d128 decode cell at B8 32/8 heads, fp16 queries, for ncu --launch-skip 2.
Usage: python3 docs/decode-h200/e4m3_issue/ncu/ncu_calls.py CELL KEYS
CELL: h200_decode_d128_kv_e4m3_contiguous_s2 (e4m3 cache, k_scale 0.7, v_scale 1.3) or h200_decode_d128_contiguous
(fp16 cache); KEYS: the cache length (8192, 16384)."""
import sys
import torch
from attngen.runtime import load
cell, keys = sys.argv[1], int(sys.argv[2])
kernel = load(f"specs/{cell}.yaml")
g = torch.Generator(device="cuda").manual_seed(0)
b, h, hkv, d = 8, 32, 8, 128
q = torch.randn((b, h, 1, d), generator=g, device="cuda").half()
k = torch.randn((b, hkv, keys, d), generator=g, device="cuda").half()
v = torch.randn((b, hkv, keys, d), generator=g, device="cuda").half()
kw = {}
if "e4m3" in cell:
    k, v = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
    kw = {"k_scale": torch.tensor([0.7], device="cuda"), "v_scale": torch.tensor([1.3], device="cuda")}
for _ in range(3):
    kernel(q, k, v, **kw)
torch.cuda.synchronize()
print(cell, keys, "splits", kernel.last_splits)
