"""Three calls of the seesaw MLA cell at B16 128/1 16384 (bf16), for ncu --launch-skip."""
import math, torch, attngen
from pathlib import Path
k = attngen.load(Path("specs/h200_decode_d576_mla_seesaw_bf16.yaml"))
g = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn((16, 1, 128, 576), generator=g, device="cuda").bfloat16()
c = torch.randn((16, 16384, 1, 576), generator=g, device="cuda").bfloat16()
lens = torch.full((16,), 16384, dtype=torch.int32, device="cuda")
for _ in range(3):
    k(q, c, c[..., :512], cache_seqlens=lens, layout="bshd", scale=1 / math.sqrt(192))
torch.cuda.synchronize()
print("splits", k.last_splits)
