"""Host time per call of attngen.attention_with_kvcache on e4m3 caches (scales as tensors and as numbers) beside the
fp16 cache's call, for one attngen (PYTHONPATH picks which): 200 calls back to back with no synchronize, the host
clock per call (200 calls of two launches each stay within the GPU's launch queue, so the host never waits on it),
the median of 7 rounds, the cases round-robin within each round; GPU us per call beside (50 calls queued behind
a GPU sleep).
Usage: python3 docs/decode-h200/e4m3_host/host_ab.py LABEL OUT.json"""
import json
import statistics
import sys
import time

import torch

import attngen

N, ROUNDS = 200, 7


def caches(B, Hkv, S, D, e4m3):
    k = torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.float16)
    v = torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.float16)
    return (k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)) if e4m3 else (k, v)


def main():
    label, out_path = sys.argv[1], sys.argv[2]
    ks, vs = torch.tensor([0.02], device="cuda"), torch.tensor([0.01], device="cuda")
    cases = {}
    for B, H, Hkv, D, S in ((1, 32, 32, 96, 16384), (1, 32, 8, 128, 32768)):
        q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.float16)
        lens = torch.full((B,), S, dtype=torch.int32, device="cuda")
        k8, v8 = caches(B, Hkv, S, D, True)
        k16, v16 = caches(B, Hkv, S, D, False)
        name = f"B{B} {H}/{Hkv} d{D} {S} keys"
        cases[f"{name}, e4m3, tensor scales"] = (lambda q=q, k=k8, v=v8, lens=lens: attngen.attention_with_kvcache(
            q, k, v, cache_seqlens=lens, k_scale=ks, v_scale=vs))
        cases[f"{name}, e4m3, number scales"] = (lambda q=q, k=k8, v=v8, lens=lens: attngen.attention_with_kvcache(
            q, k, v, cache_seqlens=lens, k_scale=0.02, v_scale=0.01))
        cases[f"{name}, fp16"] = (lambda q=q, k=k16, v=v16, lens=lens: attngen.attention_with_kvcache(
            q, k, v, cache_seqlens=lens))
    for call in cases.values():
        for _ in range(20):
            call()
    torch.cuda.synchronize()
    host = {name: [] for name in cases}
    for _ in range(ROUNDS):
        for name, call in cases.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(N):
                call()
            host[name].append((time.perf_counter() - t0) / N * 1e6)
            torch.cuda.synchronize()
    rows = []
    for name, call in cases.items():
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(int(5e7))   # queue the calls behind a sleep: the GPU time alone
        start.record()
        for _ in range(50):
            call()
        end.record()
        end.synchronize()
        rows.append({"call": name, "host_us": statistics.median(host[name]), "host_rounds": host[name],
                     "gpu_us": start.elapsed_time(end) * 1e3 / 50})
        print(f"{label}: {name}: host {rows[-1]['host_us']:.1f} us per call, GPU {rows[-1]['gpu_us']:.1f} us",
              flush=True)
    with open(out_path, "w") as f:
        json.dump({"label": label, "attngen": attngen.__path__[0], "device": torch.cuda.get_device_name(),
                   "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
