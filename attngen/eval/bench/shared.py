"""What every call's bench shares to time a case: the default shapes and SDPA backends, input sets
that defeat L2, SDPA's callables, one Timing filled from the GPU and eager times, the environment."""
from __future__ import annotations

import math

from .report import Case, Timing
from .timing import time_back_to_back, time_calls, time_eager

DEFAULT_SHAPES = ((1, 8, 512, 64), (4, 16, 2048, 64), (4, 16, 2048, 128), (2, 16, 8192, 64), (2, 16, 8192, 128))
SDPA_BACKENDS = ("flash", "cudnn", "efficient", "default")
DTYPES = {"fp16": "float16", "bf16": "bfloat16"}
CHECK_HEADS = 2          # heads of batch 0 compared with the fp32 reference before timing
CAUSAL_CHOICES = {"both": (False, True), "yes": (True,), "no": (False,)}   # --causal -> mask variants timed


def input_sets(torch, case: Case, device, generator) -> list[tuple]:
    """Enough (q, k, v) sets that cycling through them defeats L2 reuse (at least 2)."""
    dtype = getattr(torch, DTYPES[case.dtype])
    shape = (case.batch, case.heads, case.seqlen, case.head_dim)
    v_shape = shape[:3] + (case.v_dim,)
    set_bytes = (2 * math.prod(shape) + math.prod(v_shape)) * 2
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    free, _ = torch.cuda.mem_get_info(device)
    n = max(2, math.ceil(3 * l2 / set_bytes))
    n = max(1, min(n, int(0.5 * free // set_bytes), 16))
    return [tuple(torch.randn(s, generator=generator, device=device, dtype=torch.float32).to(dtype)
                  for s in (shape, shape, v_shape)) for _ in range(n)]


def time_timing(torch, t: Timing, case: Case, fn, sets, *, reps: int, eager=None) -> None:
    """Fill t's GPU time and spread (time_calls of fn), TFLOP/s of the case, the GPU time of the calls back
    to back (time_back_to_back of fn), and eager time (time_eager of `eager`, the call as a user makes it;
    default fn)."""
    t.median_us, t.spread_pct = time_calls(torch, fn, sets, reps=reps)
    t.tflops = case.tflops(t.median_us)
    t.back_to_back_us = time_back_to_back(torch, fn, sets, reps=reps)
    t.eager_us = time_eager(torch, eager or fn, sets, reps=reps)


def sdpa_callable(torch, backend: str, causal: bool):
    import torch.nn.functional as F
    if backend == "default":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    which = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
             "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]

    def run(q, k, v):
        with sdpa_kernel([which]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


def environment(torch) -> dict:
    import subprocess
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        driver = "unknown"
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "driver": driver}


__all__ = ["CAUSAL_CHOICES", "CHECK_HEADS", "DEFAULT_SHAPES", "DTYPES", "SDPA_BACKENDS", "environment", "input_sets",
           "sdpa_callable", "time_timing"]
