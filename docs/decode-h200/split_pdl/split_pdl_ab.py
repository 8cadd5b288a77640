"""Decode's split kernel launched as a programmatic dependent of the kernel ahead of it, against the usual launch,
in one process: for each cell the table's spec is loaded twice, "pdl" as built (its split part awaits_predecessor)
and "plain" with its split functions launched the usual way (so await_predecessor is a no-op), and both are timed
alternately (rounds of each). GPU us per call queued behind a GPU sleep with caches rotated past L2
(docs/measurements/host_time.py's gpu_time), back to back ("b2b": the call after the call) and with a small torch
op between calls ("op": a decode step's kernels are not all attention); eager CPU and wall us per call back to
back; cuDNN's SDPA on the same caches where it takes the shape. The two launches give the same bits (checked).

Usage: python3 docs/decode-h200/split_pdl/split_pdl_ab.py OUT.json [ROUNDS]"""
import json
import math
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "measurements"))
import host_time  # noqa: E402
import attngen  # noqa: E402
from attngen.ops import library  # noqa: E402

SPECS = Path(attngen.__file__).resolve().parents[1] / "specs"
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
# (batch, heads, kv heads, keys, d); d 576: MLA (one latent cache, V its first 512 columns)
CELLS = ((1, 32, 8, 2048, 128), (1, 32, 8, 8192, 128), (1, 32, 8, 32768, 128), (1, 32, 8, 131072, 128),
         (8, 32, 8, 2048, 128), (16, 32, 8, 2048, 128), (2, 32, 8, 8192, 128), (4, 32, 8, 8192, 128),
         (1, 64, 8, 32768, 128), (8, 64, 8, 2048, 128), (4, 32, 32, 2048, 128), (1, 32, 32, 8192, 128),
         (32, 32, 8, 8192, 128), (128, 32, 8, 2048, 128),
         (1, 16, 1, 32768, 576), (8, 16, 1, 8192, 576), (32, 16, 1, 8192, 576), (8, 128, 1, 4096, 576))
g = torch.Generator(device="cuda").manual_seed(0)
side = torch.randn(4096, device="cuda")
out = []
for b, h, hkv, keys, d in CELLS:
    mla = d == 576
    dt = torch.bfloat16
    kv_bytes = (1 if mla else 2) * b * hkv * keys * d * 2
    n_sets = max(2, min(8, int(3 * 60e6 // kv_bytes) + 1))
    qs = [torch.randn((b, h, 1, d), generator=g, device="cuda").to(dt) for _ in range(n_sets)]
    ks = [torch.randn((b, hkv, keys, d), generator=g, device="cuda").to(dt) for _ in range(n_sets)]
    vs = [k[..., :512] if mla else torch.randn(k.shape, generator=g, device="cuda").to(dt) for k in ks]
    scale = 1 / math.sqrt(192) if mla else None
    attngen.attention_with_kvcache(qs[0], ks[0], vs[0], scale=scale)
    picked = next(k for kk, k in library._DECODE.items() if kk[2] == qs[0].shape and kk[3] == ks[0].shape)
    spec = SPECS / f"{picked.plan.spec.name}.yaml"
    kernels = {"pdl": attngen.load(spec), "plain": attngen.load(spec)}
    split_names = {name for _key, name in kernels["plain"].plan.parts[0].functions}
    assert all(kernels["pdl"].functions[n].programmatic for n in split_names), "the split part does not await"
    for n in split_names:
        kernels["plain"].functions[n] = kernels["plain"].functions[n]._replace(programmatic=False)
    first = {w: k(qs[0], ks[0], vs[0], scale=scale) for w, k in kernels.items()}
    torch.cuda.synchronize()
    same = bool(torch.equal(first["pdl"], first["plain"]))
    at = {"i": 0}

    def runner(k, op=False):
        def run():
            i = at["i"] % n_sets
            at["i"] += 1
            if op:
                side.mul_(1.0)
            return k(qs[i], ks[i], vs[i], scale=scale)
        return run
    calls = {f"{w}_{m}": runner(k, m == "op") for w, k in kernels.items() for m in ("b2b", "op")}
    gpu = {w: [] for w in calls}
    for _ in range(rounds):
        for w, fn in calls.items():
            gpu[w].append(host_time.gpu_time(fn, n=30, repeats=3))
    row = {"cell": f"B{b} {h}/{hkv} Sk{keys} d{d}", "spec": picked.plan.spec.name, "splits": kernels["pdl"].last_splits,
           "KV_MB": round(kv_bytes / 1e6, 1), "same_bits": same,
           "gpu_us": {w: round(statistics.median(v), 2) for w, v in gpu.items()}}
    row["pct_copy_4232"] = {w: round(100 * kv_bytes / (t * 1e-6) / 4232e9, 1) for w, t in row["gpu_us"].items()
                            if w.endswith("b2b")}
    if not mla:
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            def cudnn():
                i = at["i"] % n_sets
                at["i"] += 1
                return F.scaled_dot_product_attention(qs[i], ks[i], vs[i], enable_gqa=h != hkv)
            row["cudnn_us"] = round(host_time.gpu_time(cudnn, n=30, repeats=5), 2)
    for w, k in kernels.items():
        cpu, wall = host_time.host_and_wall(runner(k), n=100, repeats=5)
        row[f"{w}_eager_cpu_us"], row[f"{w}_eager_wall_us"] = round(cpu, 2), round(wall, 2)
    print(json.dumps(row), flush=True)
    out.append(row)
    del qs, ks, vs, kernels, first
    library._DECODE.clear()
    torch.cuda.empty_cache()
json.dump({"command": f"python3 docs/decode-h200/split_pdl/split_pdl_ab.py OUT.json {rounds}",
           "device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": out}, open(sys.argv[1], "w"),
          indent=1)
