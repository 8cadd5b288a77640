"""The grid's process-history effect on batch-1 long-context decode (docs/performance/decode.md, "#60's grid through
the entry point"): in one process, B1 32/8 and 32/32 decode (d128 bf16, contiguous, through
attngen.attention_with_kvcache) and cuDNN beside, timed queued (GPU) and eager, first fresh, then after the
process has allocated and freed caches of several GB (as the grid's large cells do), then after
torch.cuda.empty_cache() alone, then with the allocations held. Each stage's cells in fresh tensors.
Usage (GPU machine, repository root): python3 docs/decode-h200/grid_history/history_probe.py OUT.json
Run it also with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the environment (a second OUT)."""
import json
import sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import attngen
from attngen.eval.bench.decode import eager_time_us, median_time_us

d, dt = 128, torch.bfloat16
CELLS = ((1, 32, 8, 131072), (1, 32, 32, 32768), (1, 32, 32, 131072), (2, 32, 8, 131072))
rows = []


def time_cells(stage):
    for b, h, hkv, sk in CELLS:
        qs = [torch.randn(b, h, 1, d, device="cuda", dtype=dt) for _ in range(2)]
        ks = [torch.randn(b, hkv, sk, d, device="cuda", dtype=dt) for _ in range(2)]
        vs = [torch.randn_like(k) for k in ks]
        ours = lambda i: attngen.attention_with_kvcache(qs[i], ks[i], vs[i])

        def cudnn(i):
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(qs[i], ks[i], vs[i], enable_gqa=h != hkv)
        r = {"stage": stage, "cell": f"B{b} {h}/{hkv} Sk{sk}",
             "k_ptr_mod_2MiB": [k.data_ptr() % (2 << 20) for k in ks]}
        for name, fn in (("attngen", ours), ("cudnn", cudnn)):
            fn(0)
            r[f"{name}_us"] = round(median_time_us(torch, fn, 20, 2), 2)
            r[f"{name}_eager_us"] = round(eager_time_us(torch, fn, 20, 2), 2)
        rows.append(r)
        print(json.dumps(r), flush=True)
        del qs, ks, vs


time_cells("fresh")
big = [torch.empty(int(4.3e9), dtype=torch.uint8, device="cuda") for _ in range(4)]   # the grid's B128 cells
big += [torch.empty(int(8.6e9), dtype=torch.uint8, device="cuda") for _ in range(2)]
for t in big:
    t.random_()
del big
time_cells("after large caches freed (allocator keeps them)")
torch.cuda.empty_cache()
time_cells("after empty_cache")
held = [torch.empty(int(8.6e9), dtype=torch.uint8, device="cuda") for _ in range(4)]
time_cells("with 34 GB held")
del held
torch.cuda.empty_cache()
json.dump(rows, open(sys.argv[1], "w"), indent=1)
