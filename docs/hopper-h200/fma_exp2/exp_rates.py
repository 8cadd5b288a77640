"""Exponentials per cycle per SM on this GPU, with k of every 8 on the FMA pipes (softmax.fma_exp2's exp2_fma,
rendered from templates/lib/softmax.j2's macro) and the rest on the MUFU unit, k = 0-8; nothing else in the loop
but the scale-and-shift FMA that softmax does before each one. Each block times itself with clock64; the figure is
exponentials / cycles per SM (4 blocks of 256 threads per SM, 8 independent chains per thread).

Usage (GPU machine, repository root): python3 docs/hopper-h200/fma_exp2/exp_rates.py OUT.json"""
import json
import sys

import numpy as np
import torch
from pycuda import autoprimaryctx  # noqa: F401  (torch's context, current on this thread)
from pycuda.compiler import SourceModule

from attngen.render import TEMPLATES, environment

ROUNDS, CHAINS, THREADS, BLOCKS_PER_SM = 512, 8, 256, 4

SOURCE = r"""
template <int kOnFma>
__device__ __forceinline__ void rounds(float (&x)[CHAINS], float scale, float shift) {
#pragma unroll 4
    for (int r = 0; r < ROUNDS; ++r)
#pragma unroll
        for (int c = 0; c < CHAINS; ++c) {
            const float y = fmaf(x[c], scale, shift);       // softmax's scale and shift; y in [-1, 0]
            x[c] = (c * kOnFma) % 8 < kOnFma ? exp2_fma(y) : exp2f(y);
        }
}

#define RATE_KERNEL(K) \
extern "C" __global__ void rate_##K(float* out, long long* cycles, float scale, float shift) { \
    float x[CHAINS]; \
    for (int c = 0; c < CHAINS; ++c) x[c] = 0.5f + 0.01f * ((threadIdx.x + c) & 7); \
    __syncthreads(); \
    const long long t0 = clock64(); \
    rounds<K>(x, scale, shift); \
    __syncthreads(); \
    const long long t1 = clock64(); \
    float s = 0.f; \
    for (int c = 0; c < CHAINS; ++c) s += x[c]; \
    out[blockIdx.x * blockDim.x + threadIdx.x] = s; \
    if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0; \
}
RATE_KERNEL(0) RATE_KERNEL(1) RATE_KERNEL(2) RATE_KERNEL(3) RATE_KERNEL(4) RATE_KERNEL(5) RATE_KERNEL(6)
RATE_KERNEL(7) RATE_KERNEL(8)
"""


def main(out_path: str) -> None:
    exp2_fma = environment(str(TEMPLATES)).get_template("lib/softmax.j2").module.exp2_fma()   # the kernels' own code
    defines = {"ROUNDS": ROUNDS, "CHAINS": CHAINS}
    source = "".join(f"#define {k} {v}\n" for k, v in defines.items()) + exp2_fma + SOURCE
    module = SourceModule(source, arch="sm_90a", options=["--use_fast_math", "-O3"], no_extern_c=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    blocks = sms * BLOCKS_PER_SM
    out = torch.empty(blocks * THREADS, device="cuda")
    cycles = torch.empty(blocks, device="cuda", dtype=torch.int64)
    rows = []
    for k in range(9):
        fn = module.get_function(f"rate_{k}")
        best = None
        for _ in range(5):
            fn(np.intp(out.data_ptr()), np.intp(cycles.data_ptr()), np.float32(-1.0), np.float32(0.0),
               block=(THREADS, 1, 1), grid=(blocks, 1))
            torch.cuda.synchronize()
            span = int(cycles.max())
            best = span if best is None else min(best, span)
        per_block = THREADS * ROUNDS * CHAINS
        rate = per_block * BLOCKS_PER_SM / best
        row = {"on_fma_of_8": k, "cycles": best, "exp_per_cycle_per_sm": rate}
        print(f"{k} of 8 on the FMA pipes: {rate:6.2f} exponentials a cycle per SM ({best} cycles a block)", flush=True)
        rows.append(row)
    with open(out_path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "sms": sms, "threads": THREADS,
                   "blocks_per_sm": BLOCKS_PER_SM, "rounds": ROUNDS, "chains": CHAINS, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
