"""A process's first training step with learned sinks (gpt-oss local layer shape, bf16): import + first step
(forward and torch.autograd.grad), then five more steps. Usage: python3 docs/measurements/first_call_sinks_train.py"""
import json
import time

import torch

B, S, H, KV, D = 2, 1024, 64, 8, 64


def inputs():
    """q, k, v, the sinks (fp32, one per head) and dO, seeded; synchronized."""
    torch.manual_seed(0)
    q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, KV, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(B, KV, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    s = torch.randn(H, device="cuda", dtype=torch.float32, requires_grad=True)
    do = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    return q, k, v, s, do


def main():
    q, k, v, s, do = inputs()
    t0 = time.perf_counter()
    import attngen
    t1 = time.perf_counter()

    def step():
        o = attngen.attention(q, k, v, causal=True, window=(127, 0), sinks=s)
        return torch.autograd.grad(o, (q, k, v, s), do)
    g = step()
    t2 = time.perf_counter()
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    ts = []
    for _ in range(5):
        a = time.perf_counter()
        step()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - a) * 1e3)
    print(json.dumps({"mode": "sinks_train", "import_ms": round((t1 - t0) * 1e3, 1),
                      "first_step_ms": round((t2 - t1) * 1e3, 1), "sync_ms": round((t3 - t2) * 1e3, 1),
                      "next_steps_ms": [round(x, 2) for x in ts],
                      "finite": all(bool(torch.isfinite(x).all()) for x in g)}))


if __name__ == "__main__":
    main()
