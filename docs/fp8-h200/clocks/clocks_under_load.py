"""The SM clock and power while a kernel runs back to back: is the e4m3 forward held below the top clock?

Usage: python3 docs/fp8-h200/clocks/clocks_under_load.py OUT.json [SECONDS]

For each call (the e4m3 d128 cell at 2x16x8192x128, full mask; attngen's fp16 d128 forward and SDPA's cuDNN fp16
forward at the same shape), the call is queued back to back for SECONDS (default 6) while `nvidia-smi` samples
the SM clock, power draw, power limit and the active clock-event reasons every 100 ms; the first second is
dropped (ramp). Also reports the GPU time per call over the same stretch (CUDA events around the whole run) and
the TFLOP/s that gives.
"""
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attngen
from attngen.runtime.calls.forward_fp8 import quantize_fp8

FIELDS = "clocks.sm,clocks.max.sm,power.draw,power.limit,clocks_event_reasons.active,temperature.gpu"


def fields() -> str:
    """FIELDS, with the older name of the clock-event reasons where this driver's nvidia-smi lacks the new one."""
    ok = subprocess.run(["nvidia-smi", f"--query-gpu={FIELDS}", "--format=csv,noheader"], capture_output=True, text=True)
    return FIELDS if ok.returncode == 0 else FIELDS.replace("clocks_event_reasons", "clocks_throttle_reasons")


def sample(stop, rows):
    proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={fields()}", "--format=csv,noheader,nounits", "-lms", "100"],
                            stdout=subprocess.PIPE, text=True)
    t0 = time.time()
    for line in proc.stdout:
        rows.append((time.time() - t0, [x.strip() for x in line.split(",")]))
        if stop.is_set():
            break
    proc.terminate()


def under_load(fn, seconds, flops):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    one = time.time()
    fn(); torch.cuda.synchronize()
    per = max(time.time() - one, 1e-4)
    n = max(int(seconds / per), 10)
    rows, stop = [], threading.Event()
    t = threading.Thread(target=sample, args=(stop, rows)); t.start()
    time.sleep(0.3)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        fn()
    b.record(); torch.cuda.synchronize()
    stop.set(); t.join()
    us = a.elapsed_time(b) * 1e3 / n
    steady = [r for ts, r in rows if 1.3 <= ts <= 0.3 + n * us / 1e6]
    num = lambda i: [float(r[i]) for r in steady if r[i] not in ("[N/A]", "")]
    return {"calls": n, "us_per_call": us, "tflops": flops / us / 1e6, "samples": len(steady),
            "sm_clock_mhz_median": statistics.median(num(0)) if steady else None,
            "sm_clock_mhz_min": min(num(0)) if steady else None, "sm_clock_max_mhz": float(steady[0][1]) if steady else None,
            "power_w_median": statistics.median(num(2)) if steady else None, "power_limit_w": float(steady[0][3]) if steady else None,
            "clock_event_reasons": sorted({r[4] for r in steady}), "temperature_c_max": max(num(5)) if steady else None}


def main(out, seconds=6.0):
    b, h, s, d = 2, 16, 8192, 128
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16) for _ in range(3))
    q8, k8, vt, qd, kd, vd = quantize_fp8(q, k, v)
    fp8 = attngen.load("specs/h100_wgmma_d128_fp8.yaml")
    o8 = torch.empty(q.shape, device="cuda", dtype=fp8.out_dtype)
    flops = 4 * b * h * s * s * d
    calls = {
        "e4m3 h100_wgmma_d128_fp8": lambda: fp8(q8, k8, vt, q_descale=qd, k_descale=kd, v_descale=vd, out=o8),
        "fp16 attngen.attention": lambda: attngen.attention(q, k, v),
        "fp16 SDPA cuDNN": lambda: F.scaled_dot_product_attention(q, k, v),
    }
    rows = {}
    for name, fn in calls.items():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            rows[name] = under_load(fn, seconds, flops)
        print(name, json.dumps(rows[name]), flush=True)
        time.sleep(3)   # let the clock and temperature settle between calls
    Path(out).write_text(json.dumps({"command": " ".join(["python3", *sys.argv]), "device": torch.cuda.get_device_name(),
                                     "shape": f"{b}x{h}x{s}x{d}", "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 6.0)
