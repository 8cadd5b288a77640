"""Batch-1 long-context decode (d128 fp16, one new token): attngen's decode specs and the tile trials
in docs/decode-h200/b1_tiles/ at the heuristic's split count and at 8-64 splits, beside SDPA's cuDNN and
flash backends; GPU time of 20 calls queued behind a GPU sleep, CUDA events, median of 5; K + V of
every cell exceed the L2. Usage (repository root, GPU machine): python3 docs/decode-h200/b1_long_context.py [OUT.json]"""
import sys, json, glob, time
from pathlib import Path
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
import attngen
sys.path.insert(0, "docs/measurements")
import statistics
def gpu_time(call, n=20, repeats=5):
    out = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(int(2e7)); a.record()
        for _ in range(n): call()
        b.record(); torch.cuda.synchronize(); out.append(a.elapsed_time(b) / n * 1e3)
    return statistics.median(out)
out = {}
cells = [(1, 64, 8, 32768), (1, 64, 8, 131072), (2, 32, 8, 16384), (1, 32, 8, 32768)]
specs = ["specs/h200_decode_d128.yaml", "specs/h200_decode_d128_contiguous.yaml"] + sorted(glob.glob("docs/decode-h200/b1_tiles/*.yaml"))
kernels = {}
for s in specs:
    t = time.time()
    try:
        kernels[Path(s).stem] = attngen.load(s)
    except Exception as e:
        print(s, "load failed", str(e)[:300]); continue
    print(s, f"loaded in {time.time()-t:.1f}s", flush=True)
for B, H, HK, S in cells:
    q = torch.randn(B, H, 1, 128, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(B, HK, S, 128, device="cuda", dtype=torch.float16) for _ in range(2))
    lens = torch.full((B,), S, dtype=torch.int32, device="cuda")
    gb = 2 * B * HK * S * 128 * 2 / 1e9
    name = f"B{B} {H}/{HK} {S}"
    row = {}
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
    for be in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        try:
            with sdpa_kernel(be):
                F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                row[f"sdpa_{be.name}"] = gpu_time(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), n=20, repeats=5)
        except Exception as e:
            row[f"sdpa_{be.name}"] = None
    best = min(x for x in row.values() if x)
    print(f"== {name}: {gb*1e3:.0f} MB, SDPA best {best:.1f} us ({gb/best*1e3:.2f} TB/s) {row}", flush=True)
    for kname, kern in kernels.items():
        o = kern(q, k, v, cache_seqlens=lens)
        err = (o.float() - ref).abs().max().item()
        pick = kern.last_splits
        res = {"default": (pick, gpu_time(lambda: kern(q, k, v, cache_seqlens=lens), n=20, repeats=5))}
        for n in (8, 16, 24, 32, 48, 64):
            res[n] = gpu_time(lambda n=n: kern(q, k, v, cache_seqlens=lens, num_splits=n), n=20, repeats=5)
        bn = min(res[n] for n in res if n != "default")
        print(f"  {kname:22s} err {err:.1e} default({pick}) {res['default'][1]:.1f} | " + " ".join(f"{n}:{res[n]:.1f}" for n in res if n != "default") + f" | best {bn:.1f} us {gb/bn*1e3:.2f} TB/s", flush=True)
        row[kname] = {str(n): res[n] for n in res}
    out[name] = row
json.dump(out, open(sys.argv[1] if len(sys.argv) > 1 else "/tmp/b1.json", "w"), indent=1)
