"""Do decode's splits stream faster when each reads every num_splits-th tile? (#60: the cells of 1 GB and more are
0.987-0.999x the faster SDPA backend back to back, and the 67-134 MB cells below 90 % of the copy.)

The probe of a call's fixed cost (docs/decode-h200/stream_floor/) fitted a plain read at 4.71 TB/s over the whole
buffer grid-strided and at 4.47 TB/s in 128 contiguous slices (a split call's shape); attngen's decode fitted 4.50,
cuDNN 4.73. With `split_tiles: interleaved` split s reads tiles s, s + num_splits, ..., so the grid's blocks read
neighbouring tiles at any one time.

1. Bare reads (no attention), the same bytes three ways: `grid` and `slices` as the stream_floor probe, and
   `tiles`: 128 blocks, 16 to each 1/8 of the buffer (a KV head's keys), block s of its group reading 32 KB tiles
   s, s + 16, ... (the interleaved call's order).
2. Per cell (bf16, d128, one new token, contiguous caches): the kernel the dispatch table picks for
   attngen.attention_with_kvcache ("slices"), the same cell with split_tiles: interleaved (rendered and compiled
   here, launched the same way, the same split count), and SDPA's cuDNN backend; per call and back to back (30 calls
   between two events), alternating over ROUNDS rounds, caches rotated past L2. The largest difference from the
   built kernel's output is reported (the splits merge in another order, so not bit for bit).

Usage: python3 docs/decode-h200/split_interleaved/interleaved_ab.py OUT.json [ROUNDS]   (BARE_READS=0: part 2 only)"""
import os
from pathlib import Path
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attngen.ops import library
from attngen.render import render_bundle
from attngen.spec import load_spec
from attngen.runtime.calls import kernel_class
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "measurements"))
from gpu_timing import alternating_both, write_report  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
D = 128
CELLS = ((1, 32, 8, 2048), (8, 32, 8, 2048), (2, 32, 8, 8192), (1, 32, 8, 32768), (4, 32, 8, 8192),
         (8, 32, 8, 8192), (1, 32, 8, 131072), (8, 32, 8, 32768), (1, 32, 32, 131072), (64, 64, 8, 8192),
         (32, 32, 8, 32768))

READS = r"""
extern "C" __global__ void read_grid(const uint4* __restrict__ p, unsigned long long n, unsigned* out) {
    unsigned acc = 0;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 7 * stride < n; i += 8 * stride) {
        uint4 v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) v[u] = p[i + u * stride];
#pragma unroll
        for (int u = 0; u < 8; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n; i += stride) { uint4 v = p[i]; acc ^= v.x ^ v.y ^ v.z ^ v.w; }
    if (acc == 0x9e3779b9u) out[0] = acc;      // keeps the loads; practically never stores
}
// Tiles of 2048 chunks (32 KB); `tile0` .. `tile0 + count` with step `step`, two tiles (8 loads a thread) in flight.
__device__ __forceinline__ unsigned read_tiles(const uint4* p, unsigned long long tile0, unsigned long long count,
                                               unsigned long long step) {
    unsigned acc = 0;
    unsigned long long t = 0;
    for (; t + 1 < count; t += 2) {
        uint4 v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) v[u] = p[(tile0 + (t + u / 4) * step) * 2048 + (u % 4) * 512 + threadIdx.x];
#pragma unroll
        for (int u = 0; u < 8; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; t < count; ++t)
#pragma unroll
        for (int u = 0; u < 4; ++u) { uint4 v = p[(tile0 + t * step) * 2048 + u * 512 + threadIdx.x]; acc ^= v.x ^ v.y ^ v.z ^ v.w; }
    return acc;
}
// 128 blocks in 8 groups of 16 (a KV head's splits), each group over its 1/8 of the buffer: `slices` gives block s
// of a group a contiguous run of its tiles, `tiles` its tiles s, s + 16, ...
extern "C" __global__ void read_slices(const uint4* __restrict__ p, unsigned long long n, unsigned* out) {
    const unsigned long long tiles = n / 2048 / 8, group = blockIdx.x / 16, s = blockIdx.x % 16, per = tiles / 16;
    unsigned acc = read_tiles(p, group * tiles + s * per, per, 1);
    if (acc == 0x9e3779b9u) out[0] = acc;
}
extern "C" __global__ void read_interleaved(const uint4* __restrict__ p, unsigned long long n, unsigned* out) {
    const unsigned long long tiles = n / 2048 / 8, group = blockIdx.x / 16, s = blockIdx.x % 16, per = tiles / 16;
    unsigned acc = read_tiles(p, group * tiles + s, per, 16);
    if (acc == 0x9e3779b9u) out[0] = acc;
}
"""


def interleaved_twin(built):
    """The built cell with split_tiles: interleaved, rendered and compiled here."""
    name = built.plan.spec.name
    spec = load_spec(ROOT / "specs" / f"{name}.yaml").model_copy(update={"split_tiles": "interleaved",
                                                                       "name": ("il_" + name)[:48]})
    plan, sources, label = render_bundle(spec)
    assert plan.interleaved_splits and "interleaved_count" in sources[0]
    return kernel_class(plan).from_sources(plan, sources, label=spec.name)


def bare_reads(rounds):
    import pycuda.autoprimaryctx  # noqa: F401  (torch's context)
    from pycuda.compiler import SourceModule
    module = SourceModule(READS, no_extern_c=True, options=["-O3"])
    fns = {name: module.get_function(f"read_{name}") for name in ("grid", "slices", "interleaved")}
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    sink = torch.zeros(1, dtype=torch.int32, device="cuda")
    rows = []
    for mb in (67.1, 134.2, 268.4, 536.9, 1073.7):
        nbytes = int(mb * 1e6) // (8 * 16 * 32768) * (8 * 16 * 32768)   # whole tiles, 16 per group at least
        rot = max(2, min(8, int(3 * 60e6 // nbytes) + 1))
        bufs = [torch.empty(nbytes // 2, device="cuda", dtype=torch.bfloat16).normal_() for _ in range(rot)]
        n16 = np.uint64(nbytes // 16)
        calls = {"grid": lambda b: fns["grid"](np.uintp(b.data_ptr()), n16, np.uintp(sink.data_ptr()),
                                               block=(512, 1, 1), grid=(4 * sms, 1)),
                 "slices": lambda b: fns["slices"](np.uintp(b.data_ptr()), n16, np.uintp(sink.data_ptr()),
                                                   block=(512, 1, 1), grid=(128, 1)),
                 "interleaved": lambda b: fns["interleaved"](np.uintp(b.data_ptr()), n16, np.uintp(sink.data_ptr()),
                                                             block=(512, 1, 1), grid=(128, 1))}
        med, each = alternating_both(calls, [(b,) for b in bufs], rounds)
        row = {"bare_read_mb": round(nbytes / 1e6, 1), "median": med, "rounds": each,
               "tb_per_s": {n: round(nbytes / (m["us"] * 1e-6) / 1e12, 3) for n, m in med.items()}}
        print(f"read {row['bare_read_mb']:>8.1f} MB", *(f"{n} {m['us']:.2f} ({row['tb_per_s'][n]} TB/s)"
                                                       for n, m in med.items()), flush=True)
        rows.append(row)
        bufs = None
        torch.cuda.empty_cache()
    return rows


def main(out_path, rounds="5"):
    rounds = int(rounds)
    rows = bare_reads(rounds) if os.environ.get("BARE_READS", "1") == "1" else []
    g = torch.Generator(device="cuda").manual_seed(0)
    for b, h, hkv, sk in CELLS:
        kv_bytes = 2 * b * hkv * sk * D * 2
        rot = max(2, min(8, int(3 * 60e6 // kv_bytes) + 1))
        qs = [torch.randn(b, h, 1, D, generator=g, device="cuda").bfloat16() for _ in range(rot)]
        ks = [torch.randn(b, hkv, sk, D, generator=g, device="cuda").bfloat16() for _ in range(rot)]
        vs = [torch.randn(b, hkv, sk, D, generator=g, device="cuda").bfloat16() for _ in range(rot)]
        built = library._decode_kernel(qs[0], ks[0], None, "none", "bhsd")
        kernels = {"slices": built, "interleaved": interleaved_twin(built)}
        calls = {name: (lambda kern: lambda i: kern(qs[i], ks[i], vs[i]))(kern) for name, kern in kernels.items()}

        def cudnn(i):
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(qs[i], ks[i], vs[i], enable_gqa=h != hkv)
        calls["cudnn"] = cudnn
        first = calls["slices"](0).float()
        twin = calls["interleaved"](0).float()
        splits = (built.last_splits, kernels["interleaved"].last_splits)
        diff = float((twin - first).abs().max())
        cudnn_diff = float((cudnn(0).float() - first).abs().max())
        med, each = alternating_both(calls, [(i,) for i in range(rot)], rounds)
        row = {"cell": f"B{b} {h}/{hkv} Sk{sk}", "kv_mb": round(kv_bytes / 1e6, 1), "spec": built.plan.spec.name,
               "splits": splits, "max_diff_vs_slices": diff, "cudnn_max_diff_vs_slices": cudnn_diff,
               "median": med, "rounds": each,
               "tb_per_s_b2b": {n: round(kv_bytes / (m["b2b_us"] * 1e-6) / 1e12, 3) for n, m in med.items()}}
        rows.append(row)
        print(f"{row['cell']:<22} {row['kv_mb']:>8.1f} MB {row['spec']:<30} splits {splits}", *(
            f"{n} {m['us']:.2f}/{m['b2b_us']:.2f}" for n, m in med.items()), f"diff {diff:.2e} (cudnn {cudnn_diff:.2e})",
            flush=True)
        qs = ks = vs = calls = kernels = None
        torch.cuda.empty_cache()
    write_report(out_path, rows, f"python3 docs/decode-h200/split_interleaved/interleaved_ab.py OUT.json {rounds}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(*sys.argv[1:])
