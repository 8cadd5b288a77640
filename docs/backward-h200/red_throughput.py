"""How fast the GPU takes fp32 adds into global memory, laid out as the Hopper backward adds dQ: each
block of 256 threads adds `steps` blocks of 32 KB, 32 `red.global.add.f32` per thread, each warp's
add covering 128 contiguous bytes (the d128 kernel's per-step share of two warpgroups). Beside it, the
same pattern of plain stores.

Usage: python3 docs/backward-h200/red_throughput.py

group 1: every block adds into regions of its own (over 128 MiB in all, more than L2 holds: the
adds go to DRAM); group 16: 16 blocks add into the same regions in the same order, as the 16 key
blocks of one head at 2048 keys add into its query blocks (L2 keeps them). GPU time of one launch,
CUDA events, the median of 10 after 3 warm-up launches.
"""
import numpy as np
import pycuda.autoprimaryctx  # noqa: F401  (torch's context)
import pycuda.driver as drv
import torch

from attngen.compile import compile_source

SOURCE = r'''
template <bool kAdd>
__device__ __forceinline__ void blocks(float* dst, int steps, int group, int regions) {
    const int t = threadIdx.x;
    for (int b = 0; b < steps; ++b) {
        const long long region = (static_cast<long long>(blockIdx.x / group) * steps + b) % regions;
        float* base = dst + region * 8192 + (t / 128) * 4096 + t % 128;
#pragma unroll
        for (int v = 0; v < 32; ++v) {
            if constexpr (kAdd) asm volatile("red.global.add.f32 [%0], %1;\n" :: "l"(base + v * 128), "f"(1.0f) : "memory");
            else asm volatile("st.global.f32 [%0], %1;\n" :: "l"(base + v * 128), "f"(1.0f) : "memory");
        }
    }
}
extern "C" __global__ void __launch_bounds__(256) adds(float* d, int s, int g, int r) { blocks<true>(d, s, g, r); }
extern "C" __global__ void __launch_bounds__(256) stores(float* d, int s, int g, int r) { blocks<false>(d, s, g, r); }
'''
REGIONS = 4096   # of 32 KB: 128 MiB

major, minor = torch.cuda.get_device_capability()
module = drv.module_from_buffer(compile_source(SOURCE, f"sm_{major}{minor}").cubin)
buf = torch.zeros(REGIONS * 8192, device="cuda")
for name in ("stores", "adds"):
    fn = module.get_function(name)
    for group in (1, 16):
        for blocks, steps in ((132, 64), (1056, 32)):
            args = (np.uint64(buf.data_ptr()), np.int32(steps), np.int32(group), np.int32(REGIONS))
            for _ in range(3):
                fn(*args, block=(256, 1, 1), grid=(blocks, 1, 1))
            torch.cuda.synchronize()
            times = []
            for _ in range(10):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn(*args, block=(256, 1, 1), grid=(blocks, 1, 1))
                b.record()
                torch.cuda.synchronize()
                times.append(a.elapsed_time(b) * 1e3)
            us = sorted(times)[len(times) // 2]
            print(f"{name:6s} group {group:2d} blocks {blocks:4d} x {steps} steps: {us:8.1f} us, "
                  f"{blocks * steps * 32768 / us / 1e6:5.2f} TB/s", flush=True)
